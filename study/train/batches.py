"""An epoch's training batches, as the trainer draws them: shuffled user windows, or windows built from every
user's whole history (:func:`history_prefix_windows`, :func:`history_windows`, :func:`history_new_target_windows`,
as :func:`study.train.objectives.resolve_windows` resolves them), with each window's user id for the models that
read one and the targets it scores. Its own module so that the trainer holds the training run alone;
:mod:`study.train.trainer` re-exports these names, which the sweep, the benchmarks and the tests import from it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np
import torch

from models import SeqRecModel
from study.errors import UserError
from study.train.config import TrainConfig
from study.train.settings import SCORED_ONCE
from study.train.trial_data import TrialData


class WindowBatch(NamedTuple):
    """One training batch: ``windows`` (B, L + 1), each window's user (B,) or None, and ``scored`` (B,): how many of
    each window's newest target positions carry the loss, or None where every one does (see :func:`history_windows`)."""

    windows: np.ndarray
    users: np.ndarray | None = None
    scored: np.ndarray | None = None


def history_prefix_windows(items: np.ndarray, starts: np.ndarray, lengths: np.ndarray, max_len: int, per_user: int,
                           batch_size: int, rng: np.random.Generator) -> Iterator[WindowBatch]:
    """Shuffled batches of prefix windows (B, max_len + 1) over users' whole training histories.

    User u's training sequence is ``items[starts[u] : starts[u] + lengths[u]]``. Every item of it except
    the first is a target; its window holds the up to ``max_len`` items before it (left-padded) and the
    target last. ``per_user = 0`` yields every target once, which is RecBole's augmentation (one sample
    per training item after the first, however long the history); otherwise ``per_user`` targets per user
    are drawn with replacement. The order is shuffled with ``rng``; only the targets are kept in memory,
    each batch is one gather, so a long dataset never materialises all its windows at once. Each batch carries
    its windows' users (their indices in ``starts``).
    """
    starts, counts = np.asarray(starts, dtype=np.int64), np.maximum(np.asarray(lengths, dtype=np.int64) - 1, 0)
    if per_user:
        owners = np.repeat(np.flatnonzero(counts), per_user)
        offsets = (rng.random(len(owners)) * counts[owners]).astype(np.int64)
    else:
        owners = np.repeat(np.arange(len(counts)), counts)
        offsets = _ranks_within_owner(counts)
    ends = starts[owners] + 1 + offsets  # positions in `items`; the owner's first item is never a target
    yield from _window_batches(items, starts, owners, ends, None, max_len, batch_size, rng)


def history_windows(items: np.ndarray, starts: np.ndarray, lengths: np.ndarray, max_len: int, step: int,
                    batch_size: int, rng: np.random.Generator) -> Iterator[WindowBatch]:
    """Shuffled batches of windows that cover users' whole training histories, the layout of BERT4Rec's
    reference code (its ``prop_sliding_window``): a history of T > ``max_len`` items gives the windows of
    ``max_len`` items that start at T - max_len, T - max_len - ``step``, ... while they start after its first
    item, plus the window of its first ``max_len`` items; a shorter history is one window. So every item is in
    at least one window, a recent one in up to ``ceil(max_len / step)``, and every target of every window is
    scored (``window_targets: all``).

    Each row is (max_len + 1) wide like every training window, the window in its newest ``max_len`` columns
    and the item before it (or padding) in the first: the causal objectives read that item as the first input, so
    every item of a window is a target, and the cloze task does not read it. Histories of fewer than two items are
    skipped, as the newest-window shuffle skips them. Same arguments as :func:`history_prefix_windows`.
    """
    _check_step(step, max_len)
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    overhang = np.maximum(lengths - max_len, 0)  # how far the newest window starts after the first item
    counts = np.where(lengths >= 2, 1 + -(-overhang // step), 0)
    owners = np.repeat(np.arange(len(counts)), counts)
    first_items = np.maximum(overhang[owners] - _ranks_within_owner(counts) * step, 0)
    ends = starts[owners] + np.minimum(first_items + max_len, lengths[owners]) - 1  # each window's newest item
    yield from _window_batches(items, starts, owners, ends, None, max_len, batch_size, rng)


def history_new_target_windows(items: np.ndarray, starts: np.ndarray, lengths: np.ndarray, max_len: int, step: int,
                               batch_size: int, rng: np.random.Generator,
                               targets: str = "new") -> Iterator[WindowBatch]:
    """Shuffled batches of windows over users' whole training histories in which every training item but each
    user's first is scored exactly once (``window_targets`` ``new``, ``tail``, ``aligned``, ``shifting`` or
    ``single``, :data:`SCORED_ONCE`): the older part of a window is context, computed but not scored, which is what
    overlapping windows cost. ``scored`` says how many newest targets each window scores. Same rows and arguments
    as :func:`history_windows`.

    ``new`` and ``tail`` cut a history of T items into 1 + ceil((T - 1 - max_len) / ``step``) windows; they differ
    in where the newest window's targets are scored:

    - ``new``: the newest window (ending at item T - 1) scores all its targets, as the newest-window protocol does,
      so its older targets see only the part of the window before them. Older windows end at T - 1 - max_len,
      T - 1 - max_len - ``step``, ... while they end after the first item, each scoring its newest ``step``
      targets (fewer in the oldest), every one with at least ``max_len - step`` items of context.
    - ``tail``: the windows end at T - 1, T - 1 - ``step``, ..., the newest included scoring only its newest
      ``step`` targets, and the oldest (ending within the first max_len + 1 items, padded before the first) all
      it still holds. So every target sees at least ``max_len - step`` items of context, or every item before it
      where the history is shorter, near the ``max_len`` items ``last`` gives it and evaluation reads (with a step
      of 1, exactly those), at the cost of ``new``. The slots differ: ``last`` scores every target at a window's
      newest slot, the one evaluation reads, where the oldest window scores each of its targets where it stands
      (with absolute positions, another position embedding).
    - ``aligned``: as ``tail``, but the windows go on ending every ``step`` items down to the first target, the
      shorter ones padded before the first item as ``last``'s prefixes are: ceil((T - 1) / ``step``) windows, each
      scoring its newest ``step`` targets (fewer in the oldest). Every target is scored in the newest ``step``
      slots of a window, with the same items before it as under ``tail``; with a step of 1 these are ``last``'s
      windows, slots included. It costs about max_len / ``step`` more windows a user than ``tail``.
    - ``shifting``: as ``aligned``, but every epoch each user's newest window scores a random 1 .. ``step`` of the
      newest targets (uniform), and the older windows end ``step`` apart below them. The windows' ends move from
      epoch to epoch, so over the epochs each target is scored at every one of the newest ``step`` slots, with as
      many different contexts, where ``aligned`` scores it at one slot and context every epoch (``last`` at the
      newest slot, after its max_len items, in a pass of its own). One window a user more at most.
    - ``single``: ``shifting``'s slots in ``last``'s passes. Every target gets a window of its own, ending a random
      0 .. ``step`` - 1 slots after it (uniform, drawn every epoch) with padding in those slots, so it is scored at
      one of the newest ``step`` slots with the items before it that fit, and shares neither its pass nor its
      dropout draw with another target. A causal model's output at the target reads no slot after it, so the
      padding there changes only the slot. It costs ``last``'s windows and computes those padded slots (about a tenth
      of its positions on ml-100k at a step of 10), which no trimming can drop, as positions count from the newest
      slot; with a step of 1 it is ``last``.
    """
    _check_step(step, max_len)
    if targets not in SCORED_ONCE:  # any other value would fall into one of the layouts below unnoticed
        raise ValueError(f"targets must be one of {SCORED_ONCE}, got {targets!r}")
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    if targets == "single":
        counts = np.maximum(lengths - 1, 0)
        owners = np.repeat(np.arange(len(counts)), counts)
        after = rng.integers(0, step, size=len(owners))  # the padded slots after each target
        ends = starts[owners] + 1 + _ranks_within_owner(counts)
        yield from _window_batches(items, starts, owners, ends, after + 1, max_len, batch_size, rng, after)
        return
    if targets in ("aligned", "shifting"):
        shift = rng.integers(0, step, size=len(lengths)) if targets == "shifting" else 0
        newest = np.minimum(step - shift, np.maximum(lengths - 1, 0))  # the targets the newest window scores
        counts = np.where(lengths >= 2, 1 + -(-(lengths - 1 - newest) // step), 0)
    else:
        unscored = np.maximum(lengths - 1 - max_len, 0)  # targets (items 1 ..) the newest window does not reach
        counts = np.where(lengths >= 2, 1 + -(-unscored // step), 0)
    owners = np.repeat(np.arange(len(counts)), counts)
    ranks = _ranks_within_owner(counts)  # 0 = the newest window
    if targets == "new":
        last = np.where(ranks == 0, lengths[owners] - 1, lengths[owners] - 1 - max_len - (ranks - 1) * step)
        scored = np.where(ranks == 0, max_len, np.minimum(step, last))
    elif targets == "tail":
        last = lengths[owners] - 1 - ranks * step
        scored = np.where(ranks == counts[owners] - 1, last, step)  # the oldest scores all it still holds
    else:
        last = np.where(ranks == 0, lengths[owners] - 1, lengths[owners] - 1 - newest[owners] - (ranks - 1) * step)
        scored = np.where(ranks == 0, newest[owners], np.minimum(step, last))
    yield from _window_batches(items, starts, owners, starts[owners] + last, scored, max_len, batch_size, rng)


def _check_step(step: int, max_len: int) -> None:
    if not 1 <= step <= max_len:
        raise ValueError(f"step must be in [1, max_len={max_len}] (a longer one skips items), got {step}")


def _ranks_within_owner(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., counts[u] - 1 for each u in turn: the rank of every entry of ``np.repeat(arange, counts)``."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def _window_batches(items: np.ndarray, starts: np.ndarray, owners: np.ndarray, ends: np.ndarray,
                    scored: np.ndarray | None, max_len: int, batch_size: int, rng: np.random.Generator,
                    after: np.ndarray | None = None) -> Iterator[WindowBatch]:
    """Shuffled batches of the (max_len + 1)-wide windows whose newest item is ``items[ends[i]]``, each padded
    before its owner's first item, and in the ``after[i]`` newest slots where given; one gather a batch."""
    order = rng.permutation(len(ends))
    span = np.arange(-max_len, 1)
    for begin in range(0, len(order), batch_size):
        picked = order[begin:begin + batch_size]
        columns = ends[picked, None] + span + (0 if after is None else after[picked, None])
        windows = items[np.clip(columns, 0, len(items) - 1)]
        # before the user's first item, or after the window's newest one: padding
        windows[(columns < starts[owners[picked], None]) | (columns > ends[picked, None])] = 0
        yield WindowBatch(windows, owners[picked], None if scored is None else scored[picked])


Batch = WindowBatch  # (windows (B, L + 1), their user ids (B,) or None, scored targets (B,) or None)


def user_batches(windows: np.ndarray, batch_size: int, rng: np.random.Generator) -> Iterable[Batch]:
    """Shuffled batches of user windows that hold at least one (input, target) pair, with their user ids
    (rows of the prepared windows are users 0..U-1)."""
    trainable = np.flatnonzero((windows[:, :-1] > 0).any(1) & (windows[:, -1] > 0))
    order = rng.permutation(trainable)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        yield Batch(windows[rows], rows)


def epoch_windows(data: TrialData, users: Iterable[Batch | np.ndarray], objective: str, train_cfg: TrainConfig,
                  rng: np.random.Generator) -> Iterator[Batch]:
    """One epoch's training batches. With ``window_step`` 0 the trial trains on the user windows as they come (a
    source without user ids, such as a Ray Data shard, yields bare windows). ``last``, and every other objective
    with a ``window_step`` (``train_cfg`` holds resolved settings, :func:`~study.train.objectives.resolve_windows`),
    build their windows from every user's whole training history, which every trial holds in ``data`` (the
    validation split's histories end right before the validation target), so they never read ``users``.
    """
    histories = data.valid
    arrays = (histories.history_items, histories.history_starts, histories.history_lengths, data.train.shape[1] - 1)
    if objective == "last":
        yield from history_prefix_windows(*arrays, train_cfg.prefixes_per_user, train_cfg.batch_size, rng)
    elif train_cfg.window_step and train_cfg.window_targets in SCORED_ONCE:
        yield from history_new_target_windows(*arrays, train_cfg.window_step, train_cfg.batch_size, rng,
                                              targets=train_cfg.window_targets)
    elif train_cfg.window_step:
        yield from history_windows(*arrays, train_cfg.window_step, train_cfg.batch_size, rng)
    else:
        for batch in users:
            yield Batch(*batch) if isinstance(batch, tuple) else Batch(batch)


def batch_user_ids(model: SeqRecModel, users: np.ndarray | None, device: torch.device) -> torch.Tensor | None:
    """The batch's user ids as a tensor for models that read them (``needs_users``), else None."""
    if not model.needs_users:
        return None
    if users is None:
        raise UserError(f"{type(model).__name__} reads user ids, but this batch source carries windows only")
    return torch.as_tensor(users, dtype=torch.long, device=device)
