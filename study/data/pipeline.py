"""Turning a recipe into a prepared dataset directory: read, sort, filter, re-index, split, write atomically.

Processing, in order:

1. every rating is implicit feedback (ratings values are ignored, repeats are kept);
2. a stable chronological sort per user: by timestamp, then file order (formats without timestamps keep file
   order, which their authors made chronological);
3. an iterative k-core filter on users and items (repeated until no user and no item has fewer than k
   interactions; k from the recipe or ``kcore=``; 0 or 1 = no filter);
4. users with fewer than 3 interactions are dropped: leave-one-out needs a training, a validation and a test
   item (only possible when k < 3; the count is recorded in meta.json);
5. ids: users get 0..U-1 in the natural order of their raw ids (numeric when every raw id is a number); items
   get 1..N in order of first appearance in the (user, time)-sorted stream, 0 being the padding id. First
   appearance needs no ordering of raw item ids (which may be strings), and it reproduces the ids of files
   already numbered that way (the S3Rec files);
6. leave-one-out: the last item of each user is the test target, the one before the validation target, the
   rest is training.

The result goes to ``<cache>/prepared/<name>-<hash12>/`` where ``hash12`` starts the sha256 of the source
checksum(s), the recipe name, the filter and split options and :data:`FORMAT_VERSION`: the dataset's identity,
recorded as ``content_hash`` in meta.json and as ``dataset_hash`` in every result row. The window length is not
part of it: it is a model setting. The stored windows hold ``max_len + 1`` items for the longest ``max_len`` asked
so far; a longer request widens them in place from the stored sequences, without the source.
A new directory is written to a temporary directory beside it and renamed into place, so a directory under its
final name is always complete (and concurrent trials that prepare the same dataset cannot corrupt each other).

A prepared dataset is addressable by name: ``prepare(name)`` without a source reuses the prepared copy of that
recipe (or re-reads its recorded source for another k-core), so an offline user gives ``--source`` once. A source
given for a downloadable recipe is kept in the cache (``<cache>/sources/``) like a download.
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
import json
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from study.data import synthetic
from study.data.cache import (
    FORMAT_VERSION,
    PreparedCopy,
    cache_dir,
    keep_source,
    known_source,
    prepared_root,
)
from study.data.download import download, movielens_url
from study.data.readers import Source, ZipMember
from study.data.recipes import Counts, Recipe, get_recipe
from study.errors import UserError

# Bump whenever the processing or the file layout changes: old prepared directories are then not reused.
MIN_INTERACTIONS = 3  # leave-one-out needs one training, one validation and one test item
SPLIT = "leave-one-out"


def _say(progress: bool, message: str) -> None:
    """A progress note for a person watching a terminal; kept out of logs and pipes, where stderr must hold
    nothing but warnings and the one-line error."""
    if progress and sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------
# Sources


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _locate(recipe: Recipe, path: Path) -> Source:
    """The file to read inside ``path``: ``path`` itself, a matching file under a folder, or a zip member."""
    if path.is_dir():
        if not recipe.filenames:
            raise UserError(
                f"{path} is a folder; dataset '{recipe.name}' needs a file: {recipe.source_format}"
            )
        for pattern in recipe.filenames:
            found = sorted(path.rglob(pattern), key=lambda p: (len(p.parts), str(p)))
            found = [p for p in found if p.is_file()]
            if found:
                return found[0]
        raise UserError(
            f"{path}: no {' / '.join(recipe.filenames)} in this folder; dataset '{recipe.name}' needs "
            f"{recipe.source_format}"
        )
    if path.suffix.lower() == ".zip" or (recipe.filenames and zipfile.is_zipfile(path)):
        try:
            with zipfile.ZipFile(path) as zf:
                names = [n for n in zf.namelist() if not n.endswith("/")]
        except (zipfile.BadZipFile, OSError) as exc:
            raise UserError(f"{path}: not a valid zip archive ({exc})") from None
        for pattern in recipe.filenames:
            found = sorted((n for n in names if fnmatch.fnmatch(n.rsplit("/", 1)[-1], pattern)), key=len)
            if found:
                return ZipMember(path, found[0])
        raise UserError(
            f"{path}: no {' / '.join(recipe.filenames) or 'usable file'} inside this zip; dataset "
            f"'{recipe.name}' needs {recipe.source_format}"
        )
    return path


def _resolve_source(
    recipe: Recipe, source: str | os.PathLike[str] | None, progress: bool
) -> tuple[Source, dict]:
    """Download or check the source and locate the file to read; returns it and its meta.json description."""
    info: dict[str, Any] = {}
    if source is None:
        if recipe.download is None:
            raise UserError(f"dataset '{recipe.name}' needs --source PATH: {recipe.source_format}")
        url = movielens_url(recipe.download)
        archive = cache_dir() / "downloads" / recipe.download
        hint = (
            f"Without internet access, download {recipe.download} on another machine and run: "
            f"python -m study.data prepare {recipe.name} --source PATH ({recipe.source_format})"
        )
        download(url, archive, progress=progress, hint=hint)
        path = archive
        info["url"] = url
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise UserError(f"source not found: {path}")
    located = _locate(recipe, path)
    checksum_of = path if isinstance(located, ZipMember) else Path(located)
    try:
        info["sha256"] = sha256_file(checksum_of)
    except OSError as exc:
        raise UserError(f"cannot read {checksum_of}: {exc.strerror or exc}") from None
    info["path"] = str(path.resolve())
    info["file"] = str(located)
    return located, info


# ----------------------------------------------------------------------------------------------------
# Processing


@dataclass
class Sequences:
    """Filtered, re-indexed interactions in CSR form: user u's items are ``items[indptr[u]:indptr[u+1]]``."""

    raw_users: np.ndarray  # (U,) str
    indptr: np.ndarray  # (U+1,) int64
    items: np.ndarray  # (nnz,) int32, ids 1..num_items
    num_items: int
    raw: Counts  # before any filtering
    dropped_short_users: int
    raw_items: np.ndarray | None = None  # (num_items,) str: raw_items[i - 1] is item id i's id in the source

    @property
    def num_users(self) -> int:
        return len(self.raw_users)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.indptr)


def _natural_user_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes 0..U-1 that follow the natural order of the raw user ids, and the raw ids in that order.

    Numeric order when every id is a number ("2" < "10"), string order otherwise.
    """
    codes, uniques = pd.factorize(values)
    uniques = np.asarray(uniques)
    if np.issubdtype(uniques.dtype, np.number):
        order = np.argsort(uniques, kind="stable")
    else:
        as_text = uniques.astype(str)
        as_number = pd.to_numeric(pd.Series(as_text), errors="coerce").to_numpy()
        order = np.lexsort((as_text,) if np.isnan(as_number).any() else (as_text, as_number))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[codes], uniques[order]


def kcore_mask(user: np.ndarray, item: np.ndarray, k: int) -> np.ndarray:
    """Rows kept by the iterative k-core: repeat until every kept user and item has at least k kept rows."""
    keep = np.ones(len(user), dtype=bool)
    if k <= 1:
        return keep
    num_users, num_items = int(user.max()) + 1, int(item.max()) + 1
    while True:
        user_count = np.bincount(user[keep], minlength=num_users)
        item_count = np.bincount(item[keep], minlength=num_items)
        drop = keep & ((user_count[user] < k) | (item_count[item] < k))
        if not drop.any():
            return keep
        keep &= ~drop


def build_sequences(frame: pd.DataFrame, kcore: int, *, label: str) -> Sequences:
    """Apply steps 1-5 of the module docstring to a reader frame (``user``, ``item``, ``timestamp``)."""
    n = len(frame)
    user, raw_users = _natural_user_codes(frame["user"].to_numpy())
    item, raw_items = pd.factorize(frame["item"].to_numpy())
    raw = Counts(interactions=n, users=len(raw_users), items=len(raw_items))

    time = frame["timestamp"].to_numpy(np.float64)
    missing_time = np.isnan(time)
    if missing_time.all():
        order = np.lexsort((np.arange(n), user))  # file order within each user
    elif missing_time.any():
        raise UserError(f"{label}: {int(missing_time.sum())} interactions have no timestamp while others do")
    else:
        order = np.lexsort((np.arange(n), time, user))  # stable: equal times keep file order

    keep = kcore_mask(user, item, kcore)
    if not keep.any():
        raise UserError(
            f"dataset '{label}' is empty after the {kcore}-core filter (no user and item set with at least "
            f"{kcore} interactions each); use a smaller --kcore"
        )
    count = np.bincount(user[keep], minlength=len(raw_users))
    short = keep & (count[user] < MIN_INTERACTIONS)
    dropped_short_users = int(np.count_nonzero((count > 0) & (count < MIN_INTERACTIONS)))
    keep &= ~short
    if not keep.any():
        raise UserError(
            f"dataset '{label}' has no user with at least {MIN_INTERACTIONS} interactions after the "
            f"{kcore}-core filter, so nothing can be split leave-one-out"
        )

    rows = order[keep[order]]
    user_sorted = user[rows]
    starts = np.flatnonzero(np.concatenate([[True], user_sorted[1:] != user_sorted[:-1]]))
    indptr = np.append(starts, len(rows)).astype(np.int64)
    item_ids, first_seen = pd.factorize(item[rows])  # order of first appearance
    return Sequences(
        raw_items=np.asarray(raw_items[np.asarray(first_seen)]).astype(str),
        raw_users=np.asarray(raw_users[user_sorted[starts]]).astype(str),
        indptr=indptr,
        items=(item_ids + 1).astype(np.int32),
        num_items=int(item_ids.max()) + 1,
        raw=raw,
        dropped_short_users=dropped_short_users,
    )


ITEMS_FILE = "items.parquet"  # added without a format bump: directories prepared before it lack it (see raw_items)


def last_windows(indptr: np.ndarray, items: np.ndarray, drop_last: int, width: int) -> np.ndarray:
    """The last ``width`` items of each user's sequence without its last ``drop_last`` items, 0-left-padded.

    Vectorised over blocks of users (bounded memory); returns int32 of shape (U, width).
    """
    num_users = len(indptr) - 1
    out = np.zeros((num_users, width), dtype=np.int32)
    starts, ends = indptr[:-1], indptr[1:] - drop_last
    offsets = np.arange(-width, 0, dtype=np.int64)
    block = max(1, (1 << 22) // width)
    for lo in range(0, num_users, block):
        hi = min(num_users, lo + block)
        index = ends[lo:hi, None] + offsets[None, :]
        valid = index >= starts[lo:hi, None]
        out[lo:hi] = np.where(valid, items[np.where(valid, index, 0)], 0)
    return out


def sequences_table(seqs: Sequences, max_len: int) -> pa.Table:
    """The ``sequences.parquet`` table (see the output contract in ``study.data``)."""
    width = max_len + 1
    if len(seqs.items) > np.iinfo(np.int32).max:
        raise UserError(f"{len(seqs.items)} interactions exceed the list<int32> offsets of sequences.parquet")

    def fixed(drop_last: int) -> pa.Array:
        flat = last_windows(seqs.indptr, seqs.items, drop_last, width).ravel()
        return pa.FixedSizeListArray.from_arrays(pa.array(flat, type=pa.int32()), width)

    return pa.table(
        {
            "user": pa.array(np.arange(seqs.num_users, dtype=np.int64)),
            "raw_user": pa.array(seqs.raw_users.tolist(), type=pa.string()),
            "items": pa.ListArray.from_arrays(
                pa.array(seqs.indptr.astype(np.int32)), pa.array(seqs.items, type=pa.int32())
            ),
            "train": fixed(2),
            "valid": fixed(1),
            "test": fixed(0),
        }
    )


def content_hash(name: str, options: dict[str, Any], checksums: list[str]) -> str:
    """sha256 (hex) identifying a prepared dataset: same inputs and options give the same directory."""
    payload = {"format_version": FORMAT_VERSION, "recipe": name, "options": options, "sources": checksums}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _publish(tmp: Path, final: Path, force: bool) -> None:
    """Move a complete temporary directory into place, replacing an older copy only under ``force``."""
    if force and final.exists():
        old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old-"))
        os.replace(final, old / final.name)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / "meta.json").is_file():
            raise
        # Another process finished the same content first; its copy is identical, keep it.
        shutil.rmtree(tmp, ignore_errors=True)


def _check_counts(recipe: Recipe, raw: Counts, info: dict, downloaded: bool) -> dict | None:
    """Compare raw counts with the recipe's known ones: fatal for a download, a warning for a user's file."""
    if recipe.expected is None:
        return None
    matched = raw == recipe.expected
    if not matched:
        got = ", ".join(f"{v:,} {k}" for k, v in raw.as_dict().items())
        want = ", ".join(f"{v:,} {k}" for k, v in recipe.expected.as_dict().items())
        if downloaded:
            Path(info["path"]).unlink(missing_ok=True)
            raise UserError(
                f"download of {info['url']} is not the expected {recipe.name}: it has {got}, expected "
                f"{want}; the file was removed from the cache, retry or pass a known-good copy with --source"
            )
        print(f"warning: {info['file']} has {got}; the published {recipe.name} has {want}", file=sys.stderr)
    return {"expected": recipe.expected.as_dict(), "matched": matched}


def items_table(seqs: Sequences) -> pa.Table:
    """The ``items.parquet`` table: each model item id (1..num_items) with its id in the source file."""
    return pa.table({"item": pa.array(np.arange(1, seqs.num_items + 1, dtype=np.int64)),
                     "raw_item": pa.array(seqs.raw_items.tolist(), type=pa.string())})


def length_stats(lengths: np.ndarray) -> dict[str, float | int]:
    return {
        "mean": round(float(lengths.mean()), 4),
        "median": float(np.median(lengths)),
        "max": int(lengths.max()),
        "min": int(lengths.min()),
    }


def _reuse(path: Path, max_len: int, *, progress: bool) -> Path:
    """Reuse a prepared directory, widening its stored windows first when ``max_len`` asks for more."""
    meta = json.loads((path / "meta.json").read_text())
    if int(meta["max_len"]) >= max_len:
        _say(progress, f"reusing {path}")
        return path
    _say(progress, f"widening the windows of {path} to {max_len} + 1 items")
    table = pq.read_table(path / "sequences.parquet", columns=["user", "raw_user", "items"])
    items = table.column("items").combine_chunks()
    seqs = Sequences(raw_users=np.asarray(table.column("raw_user").to_pylist(), dtype=str),
                     indptr=np.asarray(items.offsets, dtype=np.int64),
                     items=np.asarray(items.values, dtype=np.int32), num_items=int(meta["num_items"]),
                     raw=Counts(**meta["raw"]), dropped_short_users=int(meta.get("dropped_short_users", 0)))
    partial = path / f".sequences.parquet.tmp-{os.getpid()}"
    pq.write_table(sequences_table(seqs, max_len), partial, compression="zstd")
    os.replace(partial, path / "sequences.parquet")  # readers that opened the old file keep reading it
    meta["max_len"] = max_len
    partial_meta = path / f".meta.json.tmp-{os.getpid()}"
    partial_meta.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(partial_meta, path / "meta.json")
    return path


def prepare(
    name: str,
    *,
    source: str | os.PathLike[str] | None = None,
    max_len: int = 200,
    kcore: int | None = None,
    force: bool = False,
    progress: bool = True,
    **options: Any,
) -> Path:
    """Prepare dataset ``name`` (a recipe) and return its directory; reuse it when it already exists.

    ``source`` is a local zip, folder or file (required by the non-MovieLens recipes); ``max_len`` is the
    longest model input (the stored windows hold ``max_len + 1`` items); ``kcore`` overrides the recipe's
    k-core; ``options`` are recipe options (``user_col``/``item_col``/``time_col`` for csv/parquet, generator
    parameters for synthetic). ``force`` rebuilds an existing directory.
    """
    recipe = get_recipe(name)
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise UserError(f"max_len must be an integer of at least 2, got {max_len!r}")
    k = recipe.default_kcore if kcore is None else kcore
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise UserError(f"kcore must be a non-negative integer, got {k!r}")
    resolved = recipe.resolve_options(options)
    settings = {"kcore": k, **resolved}  # the dataset's identity: data, filter and split, never the window length

    if recipe.synthetic:
        if source is not None:
            raise UserError(f"dataset '{name}' is generated and takes no --source")
        settings["generator_version"] = synthetic.GENERATOR_VERSION
        located, info, checksums = None, {"generator": "study.data.synthetic"}, []
    else:
        if source is None:
            known = known_source(name, settings)
            if isinstance(known, PreparedCopy) and not force:
                return _reuse(known.path, max_len, progress=progress)
            source = known.source if isinstance(known, PreparedCopy) else known
        located, info = _resolve_source(recipe, source, progress)
        checksums = [info["sha256"]]
    digest = content_hash(name, settings, checksums)
    final = prepared_root() / f"{name}-{digest[:12]}"
    if not force and (final / "meta.json").is_file():
        return _reuse(final, max_len, progress=progress)
    if not recipe.synthetic and recipe.download is not None and "url" not in info:
        info["kept"] = str(keep_source(name, located, info))

    _say(progress, f"reading {info.get('file', 'synthetic generator')}")
    if recipe.synthetic:
        frame = synthetic.generate(resolved)
        info["sha256"] = synthetic.fingerprint(frame)
    else:
        reader_options = {key: resolved[key] for key in recipe.options}
        frame = recipe.reader(located, **reader_options)
    _say(progress, f"filtering ({k}-core) and splitting {len(frame):,} interactions")
    seqs = build_sequences(frame, k, label=name)
    verified = _check_counts(recipe, seqs.raw, info, downloaded="url" in info)

    notes = [
        f"item ids are 1..{seqs.num_items} in order of first appearance after sorting by (user, time); "
        "0 is padding",
        "user ids are 0..num_users-1 in the natural order of the raw user ids",
    ]
    if seqs.dropped_short_users:
        notes.append(
            f"{seqs.dropped_short_users} users with fewer than {MIN_INTERACTIONS} interactions were dropped: "
            "leave-one-out cannot split them"
        )
    meta = {
        "name": name,
        "recipe": {"name": name, **settings},
        "synthetic": recipe.synthetic,
        "num_users": seqs.num_users,
        "num_items": seqs.num_items,
        "num_interactions": len(seqs.items),
        "length": length_stats(seqs.lengths),
        "raw": seqs.raw.as_dict(),
        "verified": verified,
        "source": info,
        "kcore": k,
        "max_len": max_len,  # the stored windows' length - 1 (widened in place when a model asks for more)
        "split": SPLIT,
        "dropped_short_users": seqs.dropped_short_users,
        "notes": notes,
        "format_version": FORMAT_VERSION,
        "content_hash": digest,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be readable like any other folder
        pq.write_table(sequences_table(seqs, max_len), tmp / "sequences.parquet", compression="zstd")
        pq.write_table(items_table(seqs), tmp / ITEMS_FILE, compression="zstd")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        _publish(tmp, final, force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename
    _say(progress, f"wrote {final}")
    return final
