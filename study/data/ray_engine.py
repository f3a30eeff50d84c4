"""The Ray engine: preparing a dataset with Ray Data, for sources larger than one process should hold.

The pandas engine (:func:`study.data.sequences.build_sequences`) holds every interaction in one process, at 120–280
bytes each (``python -m benchmarks.data_scale`` measures it). This engine keeps the interactions in Ray's object
store (which spills to disk) and holds on the driver only vectors with one entry per user or per item. It writes the
same dataset, byte for byte in every table and statistic; only the layout differs: ``sequences.parquet`` is a folder
of parts ``part-NNNNN.parquet``, each a contiguous range of users in user order, which pyarrow (and
:func:`study.data.load_prepared`) reads as one table in that order.

Steps:

1. read: one Ray Data task per source file, parsed by the recipe's own reader (the pandas engine's parser, so
   both see the same values and errors), every row tagged with its (file, row) position: the file order that
   breaks ties in time;
2. distinct ids: each block's distinct users and items, merged on the driver; users are numbered in their
   natural order (as the pandas engine does), items provisionally;
3. encode: the source is read a second time and its raw ids become integer codes (28 bytes a row); only this
   encoded table is materialised in the object store (which spills to disk), never the raw rows;
4. iterative k-core as distributed aggregations: each round counts, per block, the rows whose user and item are
   both still kept (map side) and sums the counts on the driver (reduce side), then drops every user and item
   with fewer than k; rounds repeat until nothing is dropped, the pandas engine's fixed point exactly;
5. per-user chronological sort: users are cut into contiguous ranges of about :data:`ROWS_PER_PART`
   interactions; ``groupby(range).map_groups`` sorts each range by (user, time, file, row), keeps its item
   sequence in a scratch file and returns each item's first position in the global (user, time) stream;
6. item ids: 1..N in order of first position, the pandas engine's order of first appearance;
7. write: one task per range maps its items to ids, cuts the train/valid/test windows (leave-one-out) and writes
   its part.

On a multi-node cluster the prepared directory (the data cache) must be on storage every node can write.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from study.data.files import Source, ZipMember, open_binary
from study.data.recipes import Counts
from study.data.sequences import MIN_INTERACTIONS, Sequences, Summary, natural_user_codes, sequences_table
from study.errors import UserError

ENGINES = ("auto", "pandas", "ray")
ROWS_ENV = "SEQREC_RAY_ENGINE_ROWS"
# Above this many source interactions ``auto`` picks Ray: the pandas engine then needs 2.4–5.6 GB, up to a quarter
# of a 24 GB machine; ML-20M and everything smaller (all the shipped recipes and the tests) stay on pandas.
DEFAULT_RAY_ROWS = 20_000_000
ROWS_PER_PART = 2_000_000  # interactions per written part: bounded memory per task, few files
PART_PATTERN = "part-{:05d}.parquet"
_NO_POSITION = np.iinfo(np.int64).max


def ray_threshold() -> int:
    """Source interactions above which ``engine="auto"`` uses Ray (``$SEQREC_RAY_ENGINE_ROWS``)."""
    text = os.environ.get(ROWS_ENV, "").strip()
    if not text:
        return DEFAULT_RAY_ROWS
    try:
        value = int(float(text))
    except ValueError:
        raise UserError(f"{ROWS_ENV} must be a number of interactions, got {text!r}") from None
    if value < 0:
        raise UserError(f"{ROWS_ENV} must not be negative, got {value}")
    return value


def _file_rows(src: Source) -> int:
    """Interactions in one source file: exact for Parquet, from the first MiB's line length for text."""
    name = str(src).lower()
    if name.endswith((".parquet", ".pq")) and not isinstance(src, ZipMember):
        return pq.ParquetFile(src).metadata.num_rows
    if isinstance(src, ZipMember):
        import zipfile

        with zipfile.ZipFile(src.archive) as zf:
            size = zf.getinfo(src.member).file_size
    else:
        size = Path(src).stat().st_size
    with open_binary(src) as fh:
        head = fh.read(1 << 20)
    lines = max(1, head.count(b"\n"))
    return int(size / (len(head) / lines)) if head else 0


def estimate_rows(files: list[Source] | None, synthetic_params: dict[str, Any] | None) -> int:
    """A cheap estimate of the source's interactions, to choose an engine without reading the source."""
    if synthetic_params is not None:
        return int(synthetic_params["users"]) * int(synthetic_params["length"])
    return sum(_file_rows(src) for src in files or [])


def choose_engine(engine: str, estimated_rows: int) -> str:
    """``pandas`` or ``ray``: ``auto`` picks Ray above :func:`ray_threshold` interactions."""
    if engine not in ENGINES:
        raise UserError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine != "auto":
        return engine
    return "ray" if estimated_rows > ray_threshold() else "pandas"


@contextmanager
def _quiet_ray() -> Iterator[None]:
    """Ray for one preparation: a local Ray (or ``$RAY_ADDRESS``) unless one is running, and Ray Data set up to
    print nothing and to shuffle with tasks; the caller's Ray and Ray Data settings are restored afterwards.

    A UserError raised in a task (a reader's: a bad line, an empty file) leaves as that UserError, one line, as the
    pandas engine raises it: Ray Data raises the reader's exception itself rather than its own wrapper, and the
    RayTaskError that carries it across processes is unwrapped here."""
    import ray
    import ray.data
    from ray.data.context import ShuffleStrategy

    context = ray.data.DataContext.get_current()
    settings = {
        # stderr of the command holds only warnings and the one-line error: no progress bars or plan printouts
        "enable_progress_bars": False,
        "print_on_execution_start": False,
        "enable_auto_log_stats": False,
        # the sort-based shuffle runs in tasks on the existing workers; the default hash shuffle starts
        # aggregator actors, which costs more than the whole preparation of a small dataset
        "shuffle_strategy": ShuffleStrategy.SORT_SHUFFLE_PULL_BASED,
        "raise_original_map_exception": True,
    }
    settings = {key: value for key, value in settings.items() if hasattr(context, key)}  # older Ray Data lacks some
    saved = {key: getattr(context, key) for key in settings}
    logger = logging.getLogger("ray.data")
    level = logger.level
    started = not ray.is_initialized()
    try:
        # CRITICAL: a failed task is also logged at ERROR, with a traceback; the exception says it all
        logger.setLevel(logging.CRITICAL)
        for key, value in settings.items():
            setattr(context, key, value)
        if started:
            ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                     runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
        yield
    except UserError as exc:
        cause = getattr(exc, "cause", None)  # the RayTaskError of a task is also an instance of its cause's class
        if isinstance(cause, UserError):
            # Ray Data appends lines on retrying to the message; a reader's message is its first line
            raise UserError(str(cause).partition("\n")[0]) from None
        raise
    finally:
        for key, value in saved.items():
            setattr(context, key, value)
        logger.setLevel(level)
        if started:
            ray.shutdown()


def _read_files(files: list[Source], reader: Callable[..., pd.DataFrame], options: dict) -> Any:
    """Step 1: a Ray Dataset of (user, item, timestamp, shard, row), one read task per file."""
    import ray.data

    def read(batch: dict[str, np.ndarray]) -> pd.DataFrame:
        frames = []
        for shard in batch["id"]:
            frame = reader(files[int(shard)], **options)
            frames.append(frame.assign(shard=np.int32(shard), row=np.arange(len(frame), dtype=np.int64)))
        return pd.concat(frames, ignore_index=True)

    return ray.data.range(len(files), override_num_blocks=len(files)).map_batches(read, batch_size=1)


def _frame_dataset(frame: pd.DataFrame) -> Any:
    """Step 1 for an in-memory frame (the synthetic generator): one shard, rows in frame order."""
    import ray.data

    tagged = frame.assign(shard=np.int32(0), row=np.arange(len(frame), dtype=np.int64))
    pieces = [tagged.iloc[lo: lo + ROWS_PER_PART] for lo in range(0, len(tagged), ROWS_PER_PART)]
    return ray.data.from_pandas(pieces)


class _Distinct:
    """The distinct values of one column, merged as blocks arrive (bounded by the distinct count, not the rows)."""

    def __init__(self) -> None:
        self.merged: list[np.ndarray] = []
        self.pending: list[np.ndarray] = []
        self.size = 0

    def add(self, values: np.ndarray) -> None:
        self.pending.append(values)
        self.size += len(values)
        if self.size > 4_000_000:
            self.merged, self.pending, self.size = [self.result()], [], 0

    def result(self) -> np.ndarray:
        parts = self.merged + self.pending
        return np.asarray(pd.unique(np.concatenate(parts))) if parts else np.empty(0)


def _distinct_ids(ds: Any) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Step 2 in one pass: distinct users and items per block, merged on the driver; rows without a time; rows."""

    def per_block(batch: pd.DataFrame) -> pd.DataFrame:
        if not len(batch):
            return pd.DataFrame({"user": batch["user"], "item": batch["item"], "missing": np.zeros(0, np.int64),
                                 "rows": np.zeros(0, np.int64)})
        users, items = np.asarray(pd.unique(batch["user"])), np.asarray(pd.unique(batch["item"]))
        rows = max(len(users), len(items))
        missing, count = np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64)
        # counts in the first row only: they are summed over all rows on the driver
        missing[0], count[0] = batch["timestamp"].isna().sum(), len(batch)
        # users and items padded to one length by repeating them: duplicates vanish in the merge
        return pd.DataFrame({"user": np.resize(users, rows), "item": np.resize(items, rows), "missing": missing,
                             "rows": count})

    users, items, missing, num_rows = _Distinct(), _Distinct(), 0, 0
    for batch in ds.map_batches(per_block, batch_format="pandas", batch_size=None).iter_batches(
            batch_format="pandas", batch_size=None):
        users.add(batch["user"].to_numpy())
        items.add(batch["item"].to_numpy())
        missing += int(batch["missing"].sum())
        num_rows += int(batch["rows"].sum())
    return users.result(), items.result(), missing, num_rows


_INDEXES: dict[tuple[str, str], tuple[pd.Index, pd.Index]] = {}  # per worker: the running preparation's lookups


def _encoder(users_ref: Any, items_ref: Any) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """Step 3: raw ids to codes (users in natural order, items in the provisional order of step 2)."""
    import ray

    def encode(batch: pd.DataFrame) -> pd.DataFrame:
        key = (users_ref.hex(), items_ref.hex())
        if key not in _INDEXES:  # built once per worker, not once per block
            _INDEXES.clear()  # an earlier preparation's lookups are not needed any more
            _INDEXES[key] = pd.Index(ray.get(users_ref)), pd.Index(ray.get(items_ref))
        users, items = _INDEXES[key]
        return pd.DataFrame({
            "user": users.get_indexer(batch["user"]).astype(np.int32),
            "item": items.get_indexer(batch["item"]).astype(np.int32),
            "timestamp": batch["timestamp"].to_numpy(np.float64),
            "shard": batch["shard"].to_numpy(np.int32),
            "row": batch["row"].to_numpy(np.int64),
        })

    return encode


def _kept_counts(encoded: Any, keep_user: np.ndarray, keep_item: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step 4, one round: rows per user and per item among rows whose user and item are both kept."""
    import ray

    user_ref, item_ref = ray.put(keep_user), ray.put(keep_item)

    def per_block(batch: pd.DataFrame) -> pd.DataFrame:
        user, item = batch["user"].to_numpy(), batch["item"].to_numpy()
        kept = ray.get(user_ref)[user] & ray.get(item_ref)[item]
        users, user_counts = np.unique(user[kept], return_counts=True)
        items, item_counts = np.unique(item[kept], return_counts=True)
        return pd.DataFrame({"is_item": np.r_[np.zeros(len(users), bool), np.ones(len(items), bool)],
                             "code": np.r_[users, items], "count": np.r_[user_counts, item_counts]})

    user_count = np.zeros(len(keep_user), dtype=np.int64)
    item_count = np.zeros(len(keep_item), dtype=np.int64)
    for batch in encoded.map_batches(per_block, batch_format="pandas", batch_size=None).iter_batches(
            batch_format="pandas", batch_size=None):
        is_item = batch["is_item"].to_numpy()
        code, count = batch["code"].to_numpy(), batch["count"].to_numpy()
        user_count += np.bincount(code[~is_item], weights=count[~is_item], minlength=len(keep_user)).astype(np.int64)
        item_count += np.bincount(code[is_item], weights=count[is_item], minlength=len(keep_item)).astype(np.int64)
    return user_count, item_count


def _kcore(encoded: Any, num_users: int, num_items: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 4: kept users, kept items and the rows per kept user at the fixed point."""
    keep_user, keep_item = np.ones(num_users, dtype=bool), np.ones(num_items, dtype=bool)
    while True:
        user_count, item_count = _kept_counts(encoded, keep_user, keep_item)
        if k <= 1:
            return keep_user, keep_item, user_count
        # a kept row is dropped when its user or item has fewer than k kept rows (users/items with none have no row)
        short_user, short_item = (user_count > 0) & (user_count < k), (item_count > 0) & (item_count < k)
        if not short_user.any() and not short_item.any():
            return keep_user & (user_count > 0), keep_item & (item_count > 0), user_count
        keep_user &= user_count >= k
        keep_item &= item_count >= k


def _sort_ranges(encoded: Any, keep_item: np.ndarray, part_of_user: np.ndarray, part_offset: np.ndarray,
                 scratch: Path, timed: bool) -> np.ndarray:
    """Step 5: sort each user range by (user, time, file, row), keep its item codes in ``scratch``, and return
    every item's first position in the global stream (:data:`_NO_POSITION` for items no kept row has)."""
    import ray

    part_ref, item_ref = ray.put(part_of_user), ray.put(keep_item)

    def tag(batch: pd.DataFrame) -> pd.DataFrame:
        part = ray.get(part_ref)[batch["user"].to_numpy()]
        kept = (part >= 0) & ray.get(item_ref)[batch["item"].to_numpy()]
        return batch[kept].assign(part=part[kept])

    def sort_range(group: pd.DataFrame) -> pd.DataFrame:
        part = int(group["part"].iloc[0])
        keys = [group["row"].to_numpy(), group["shard"].to_numpy()]
        keys += [group["timestamp"].to_numpy()] if timed else []
        order = np.lexsort([*keys, group["user"].to_numpy()])  # stable: equal times keep file order
        items = group["item"].to_numpy()[order]
        np.save(scratch / f"{part:05d}.npy", items)
        codes, first = np.unique(items, return_index=True)
        return pd.DataFrame({"item": codes, "first": first + part_offset[part]})

    first_position = np.full(len(keep_item), _NO_POSITION, dtype=np.int64)
    parts = len(part_offset)
    ranges = encoded.map_batches(tag, batch_format="pandas", batch_size=None).groupby("part", num_partitions=parts)
    for batch in ranges.map_groups(sort_range, batch_format="pandas").iter_batches(
            batch_format="pandas", batch_size=None):
        np.minimum.at(first_position, batch["item"].to_numpy(), batch["first"].to_numpy())
    return first_position


def _write_parts(out: Path, scratch: Path, lengths: np.ndarray, raw_users: np.ndarray, item_id: np.ndarray,
                 part_first_user: np.ndarray, max_len: int) -> None:
    """Step 7: one task per user range turns its sorted item codes into its ``sequences.parquet`` part."""
    import ray
    import ray.data

    lengths_ref, users_ref, ids_ref = ray.put(lengths), ray.put(raw_users), ray.put(item_id)
    bounds = np.append(part_first_user, len(lengths))

    def write(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for part in batch["id"]:
            lo, hi = int(bounds[part]), int(bounds[part + 1])
            part_lengths = ray.get(lengths_ref)[lo:hi]
            seqs = Sequences(raw_users=ray.get(users_ref)[lo:hi],
                             indptr=np.concatenate([[0], np.cumsum(part_lengths)]).astype(np.int64),
                             items=ray.get(ids_ref)[np.load(scratch / f"{int(part):05d}.npy")],
                             num_items=0, raw=Counts(0, 0, 0), dropped_short_users=0)
            pq.write_table(sequences_table(seqs, max_len, first_user=lo), out / PART_PATTERN.format(int(part)),
                           compression="zstd")
        return {"done": batch["id"]}

    parts = len(part_first_user)
    ray.data.range(parts, override_num_blocks=parts).map_batches(write, batch_size=1).materialize()


def _user_ranges(lengths: np.ndarray) -> np.ndarray:
    """The first user (index in user order) of each range of about :data:`ROWS_PER_PART` interactions."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    _, first = np.unique(starts // ROWS_PER_PART, return_index=True)
    return first.astype(np.int64)


def build_on_ray(source: list[Source] | pd.DataFrame, reader: Callable[..., pd.DataFrame] | None,
                 reader_options: dict, kcore: int, *, label: str, out: Path, max_len: int) -> Summary:
    """Steps 1-7 for the files of a source (or an in-memory frame): writes ``out/sequences.parquet/`` and returns
    the statistics; raises the pandas engine's UserErrors for the same problems."""
    import ray

    with _quiet_ray():
        # The source is read twice (for the distinct ids, then to encode them) rather than kept: only the encoded
        # rows, 28 bytes each, stay in the object store.
        if isinstance(source, pd.DataFrame):
            read = _frame_dataset(source).materialize()  # already in memory: reading it again costs nothing
        else:
            read = _read_files(source, reader, reader_options)
        raw_users, raw_item_values, missing, num_rows = _distinct_ids(read)
        raw = Counts(interactions=num_rows, users=len(raw_users), items=len(raw_item_values))
        if 0 < missing < num_rows:
            raise UserError(f"{label}: {missing} interactions have no timestamp while others do")
        _, sorted_users = natural_user_codes(raw_users)
        encode = _encoder(ray.put(sorted_users), ray.put(raw_item_values))
        encoded = read.map_batches(encode, batch_format="pandas", batch_size=None).materialize()
        del read  # its blocks leave the object store once nothing refers to them

        keep_user, keep_item, user_count = _kcore(encoded, len(sorted_users), len(raw_item_values), kcore)
        if not keep_user.any():
            raise UserError(
                f"dataset '{label}' is empty after the {kcore}-core filter (no user and item set with at least "
                f"{kcore} interactions each); use a smaller --kcore"
            )
        dropped_short_users = int(np.count_nonzero(keep_user & (user_count < MIN_INTERACTIONS)))
        final_users = np.flatnonzero(keep_user & (user_count >= MIN_INTERACTIONS))
        if not len(final_users):
            raise UserError(
                f"dataset '{label}' has no user with at least {MIN_INTERACTIONS} interactions after the "
                f"{kcore}-core filter, so nothing can be split leave-one-out"
            )
        lengths = user_count[final_users]
        part_first_user = _user_ranges(lengths)
        part_of_user = np.full(len(sorted_users), -1, dtype=np.int64)
        part_of_user[final_users] = np.searchsorted(part_first_user, np.arange(len(final_users)), side="right") - 1
        part_offset = np.concatenate([[0], np.cumsum(lengths)])[part_first_user]

        sequences = out / "sequences.parquet"
        scratch = out / ".scratch"
        scratch.mkdir(parents=True)
        sequences.mkdir()
        first_position = _sort_ranges(encoded, keep_item, part_of_user, part_offset, scratch, timed=missing == 0)
        seen = np.flatnonzero(first_position != _NO_POSITION)
        by_first = seen[np.argsort(first_position[seen], kind="stable")]
        item_id = np.zeros(len(raw_item_values), dtype=np.int32)
        item_id[by_first] = np.arange(1, len(by_first) + 1, dtype=np.int32)
        _write_parts(sequences, scratch, lengths, np.asarray(sorted_users[final_users]).astype(str), item_id,
                     part_first_user, max_len)
        shutil.rmtree(scratch)
        return Summary(raw=raw, lengths=lengths, num_items=len(by_first),
                       raw_items=np.asarray(raw_item_values[by_first]).astype(str),
                       dropped_short_users=dropped_short_users)


def widen_parts(sequences: Path, max_len: int) -> None:
    """Rewrite a partitioned ``sequences.parquet`` folder with wider windows, one part at a time, then swap it
    in (the pandas engine's widening, for the Ray engine's layout)."""
    wider = sequences.with_name(f".{sequences.name}.wider-{os.getpid()}")
    wider.mkdir()
    try:
        for part in sorted(sequences.glob("part-*.parquet")):
            table = pq.read_table(part, columns=["user", "raw_user", "items"])
            items = table.column("items").combine_chunks()
            offsets = np.asarray(items.offsets, dtype=np.int64)
            seqs = Sequences(raw_users=np.asarray(table.column("raw_user").to_pylist(), dtype=str),
                             indptr=offsets - offsets[0], items=np.asarray(items.values, dtype=np.int32)[offsets[0]:],
                             num_items=0, raw=Counts(0, 0, 0), dropped_short_users=0)
            first_user = int(table.column("user")[0].as_py())
            pq.write_table(sequences_table(seqs, max_len, first_user=first_user), wider / part.name,
                           compression="zstd")
    except BaseException:
        shutil.rmtree(wider, ignore_errors=True)  # a failed widening leaves the directory as it was
        raise
    old = sequences.with_name(f".{sequences.name}.old-{os.getpid()}")
    os.replace(sequences, old)
    os.replace(wider, sequences)
    shutil.rmtree(old, ignore_errors=True)
