"""Loading a prepared dataset directory into numpy arrays (the one loader every consumer uses)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from study.data.cache import FORMAT_VERSION
from study.errors import UserError

SPLITS = ("train", "valid", "test")


@dataclass(eq=False)
class PreparedDataset:
    """A prepared dataset in memory.

    ``train``/``valid``/``test`` are int32 arrays of shape (num_users, max_len + 1), left-padded with 0,
    row u for user u. The model input is ``x[:, :-1]``; the target is ``x[:, 1:]`` for train (every
    non-padding position) and ``x[:, -1]`` for valid and test. ``history_indptr``/``history_indices`` hold
    each user's full chronological sequence in CSR form (user u:
    ``history_indices[history_indptr[u]:history_indptr[u + 1]]``), for masking seen items and for
    popularity counts.
    """

    path: Path
    meta: dict
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    history_indptr: np.ndarray  # (num_users + 1,) int64
    history_indices: np.ndarray  # (num_interactions,) int32
    raw_users: np.ndarray  # (num_users,) object array of str: the user ids in the source file

    @property
    def num_users(self) -> int:
        return int(self.meta["num_users"])

    @property
    def num_items(self) -> int:
        """Number of real items: ids are 1..num_items, 0 is padding (embedding tables need num_items + 1)."""
        return int(self.meta["num_items"])

    @property
    def max_len(self) -> int:
        return int(self.meta["max_len"])

    @property
    def items(self) -> list[np.ndarray]:
        """Each user's full sequence as its own array (views into ``history_indices``)."""
        return np.split(self.history_indices, self.history_indptr[1:-1])

    def history(self, user: int) -> np.ndarray:
        return self.history_indices[self.history_indptr[user] : self.history_indptr[user + 1]]

    def item_popularity(self, split: str = "train") -> np.ndarray:
        """Interaction counts per item id (length num_items + 1, index 0 = padding = 0) over each user's full
        training prefix (``split="train"``: all but the last two items), or everything before the validation
        target (``"valid"``) or the test target (``"test"``); full prefixes, not cut to max_len."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        drop = {"train": 2, "valid": 1, "test": 0}[split]
        keep = np.ones(len(self.history_indices), dtype=bool)
        for back in range(1, drop + 1):
            keep[self.history_indptr[1:] - back] = False
        return np.bincount(self.history_indices[keep], minlength=self.num_items + 1).astype(np.int64)


def item_popularity(ds: PreparedDataset, split: str = "train") -> np.ndarray:
    """Training-split counts per item id, length num_items + 1 (:meth:`PreparedDataset.item_popularity`)."""
    return ds.item_popularity(split)


def raw_items(path: str | Path) -> np.ndarray:
    """The source's id of every item, indexed by model item id (index 0, the padding id, is "")."""
    file = Path(path) / "items.parquet"
    if not file.is_file():
        meta = json.loads((Path(path) / "meta.json").read_text()) if (Path(path) / "meta.json").is_file() else {}
        raise UserError(f"{path} was prepared before item ids were recorded (no items.parquet); rebuild it with: "
                        f"python -m study.data prepare {meta.get('name', 'NAME')} --force (same source, same ids)")
    table = pq.read_table(file)
    ids = np.asarray(table.column("item").to_numpy(), dtype=np.int64)
    out = np.full(int(ids.max(initial=0)) + 1, "", dtype=object)
    out[ids] = np.asarray(table.column("raw_item").to_pylist(), dtype=object)
    return out


def _fixed(table: pa.Table, name: str, num_users: int) -> np.ndarray:
    column = table.column(name).combine_chunks()
    width = column.type.list_size
    # writable=True copies once, so callers get ordinary arrays they may modify (Arrow buffers are read-only)
    return column.flatten().to_numpy(zero_copy_only=False, writable=True).reshape(num_users, width)


def _first_windows(sequences: Path, rows: int) -> np.ndarray:
    """The ``train`` windows of the first ``rows`` users, read batch by batch from the file (or the first part of a
    partitioned folder) instead of the whole column."""
    first = sequences if sequences.is_file() else sorted(sequences.glob("*.parquet"))[0]
    batches = pq.ParquetFile(first).iter_batches(batch_size=max(1, rows), columns=["train"])
    table = pa.Table.from_batches([next(batches)])
    return _fixed(table, "train", table.num_rows)


def load_prepared(path: str | Path, train_rows: int | None = None) -> PreparedDataset:
    """Load ``<cache>/prepared/<name>-<hash12>/`` as written by :func:`study.data.prepare`.

    ``train_rows=n`` reads only the first n users' training windows (``train`` then has n rows, the other arrays
    every user's): a trial that streams its training windows from the Parquet file keeps just a sample of them,
    for the peak-memory and cost probes.
    """
    path = Path(path)
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        raise UserError(
            f"{path}: not a prepared dataset (no meta.json); "
            "create one with: python -m study.data prepare NAME"
        )
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{meta_file}: corrupt JSON ({exc})") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(
            f"{path}: prepared with format version {meta.get('format_version')}, this code reads "
            f"{FORMAT_VERSION}; rebuild it with: "
            f"python -m study.data prepare {meta.get('name', 'NAME')} --force"
        )
    sequences = path / "sequences.parquet"
    try:
        if train_rows is None:
            table = pq.read_table(sequences)
            train = _fixed(table, "train", table.num_rows)
        else:
            table = pq.read_table(sequences, columns=["raw_user", "items", "valid", "test"])
            train = _first_windows(sequences, train_rows)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{sequences}: cannot read ({exc})") from None
    num_users = table.num_rows
    items = table.column("items").combine_chunks()
    offsets = items.offsets.to_numpy().astype(np.int64)
    return PreparedDataset(
        path=path,
        meta=meta,
        train=train,
        valid=_fixed(table, "valid", num_users),
        test=_fixed(table, "test", num_users),
        history_indptr=offsets - offsets[0],
        history_indices=items.flatten().to_numpy(zero_copy_only=False, writable=True),
        raw_users=table.column("raw_user").to_numpy(),
    )
