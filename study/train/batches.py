"""An epoch's training batches, as the trainer draws them: shuffled user windows, or windows built from every
user's whole history, with each window's user id for the models that read one and the targets it scores. Its own
module so that the trainer holds the training run alone; :mod:`study.train.trainer` re-exports these names, which
the sweep, the benchmarks and the tests import from it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from models import SeqRecModel
from study.errors import UserError
from study.train.config import TrainConfig
from study.train.objectives import WindowBatch, history_new_target_windows, history_prefix_windows, history_windows
from study.train.settings import SCORED_ONCE
from study.train.trial_data import TrialData

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
