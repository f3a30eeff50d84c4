"""Turning interactions into leave-one-out sequences and their Parquet tables: steps 1-6 of :mod:`study.data.pipeline`.

Both preparation engines use these functions: the pandas engine on the whole table at once, the Ray engine
(:mod:`study.data.ray_engine`) on one user range at a time, so the two write the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from study.data.recipes import Counts
from study.errors import UserError

MIN_INTERACTIONS = 3  # leave-one-out needs one training, one validation and one test item


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


@dataclass
class Summary:
    """What meta.json records about a prepared dataset, whichever engine built it."""

    raw: Counts
    lengths: np.ndarray  # (num_users,) interactions per user, in user order
    num_items: int
    raw_items: np.ndarray  # (num_items,) str: raw_items[i - 1] is item id i's id in the source
    dropped_short_users: int

    @classmethod
    def of(cls, seqs: Sequences) -> Summary:
        return cls(raw=seqs.raw, lengths=seqs.lengths, num_items=seqs.num_items, raw_items=seqs.raw_items,
                   dropped_short_users=seqs.dropped_short_users)

    @property
    def num_users(self) -> int:
        return len(self.lengths)

    @property
    def num_interactions(self) -> int:
        return int(self.lengths.sum())


def natural_user_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    user, raw_users = natural_user_codes(frame["user"].to_numpy())
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


def sequences_table(seqs: Sequences, max_len: int, *, first_user: int = 0) -> pa.Table:
    """The ``sequences.parquet`` table (see the output contract in ``study.data``); ``first_user`` is the id of
    ``seqs``' first user when it holds one user range of a partitioned table."""
    width = max_len + 1
    if len(seqs.items) > np.iinfo(np.int32).max:
        raise UserError(f"{len(seqs.items)} interactions exceed the list<int32> offsets of sequences.parquet")

    def fixed(drop_last: int) -> pa.Array:
        flat = last_windows(seqs.indptr, seqs.items, drop_last, width).ravel()
        return pa.FixedSizeListArray.from_arrays(pa.array(flat, type=pa.int32()), width)

    return pa.table(
        {
            "user": pa.array(np.arange(first_user, first_user + seqs.num_users, dtype=np.int64)),
            "raw_user": pa.array(seqs.raw_users.tolist(), type=pa.string()),
            "items": pa.ListArray.from_arrays(
                pa.array(seqs.indptr.astype(np.int32)), pa.array(seqs.items, type=pa.int32())
            ),
            "train": fixed(2),
            "valid": fixed(1),
            "test": fixed(0),
        }
    )


def items_table(raw_items: np.ndarray) -> pa.Table:
    """The ``items.parquet`` table: each model item id (1..num_items) with its id in the source file
    (``raw_items[i - 1]`` for id i)."""
    return pa.table({"item": pa.array(np.arange(1, len(raw_items) + 1, dtype=np.int64)),
                     "raw_item": pa.array(raw_items.tolist(), type=pa.string())})


def length_stats(lengths: np.ndarray) -> dict[str, float | int]:
    return {
        "mean": round(float(lengths.mean()), 4),
        "median": float(np.median(lengths)),
        "max": int(lengths.max()),
        "min": int(lengths.min()),
    }
