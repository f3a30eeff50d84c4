"""Training objectives. Each maps a batch of left-padded windows (B, L + 1) to a scalar loss.

A window's last column is the newest item. The objectives read it differently:
- ``causal``: next-item softmax CE at every position (input = window[:, :-1], target = window[:, 1:]).
  Efficient, and correct only for causal models.
- ``last``: CE at the last position only (input = window[:, :-1], target = window[:, -1]). Windows are
  prefixes of whole user histories, produced by :func:`history_prefix_windows`, RecBole's augmentation.
- ``cloze``: BERT4Rec's masked-item CE over the newest L items.
- ``bce``: the original SASRec loss, one uniformly sampled negative per position.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from models import ConfigError, SeqRecModel


def resolve_objective(model: SeqRecModel, objective: str) -> str:
    """The objective a trial uses; an objective the model cannot train with is a config error."""
    chosen = model.default_objective if objective == "auto" else objective
    if chosen not in model.objectives:
        reason = {
            "causal": "its token mixer is not causal, so all-position training would leak future items",
            "cloze": "it is a causal-only model; cloze needs a bidirectional mixer and a mask token",
        }.get(chosen, "it is not supported by this model")
        raise ConfigError([("objective", f"{model.name} cannot train with {chosen!r}: {reason}; "
                                         f"supported: {', '.join(model.objectives)}")])
    return chosen


def _full_softmax_ce(hidden: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    logits = hidden @ weights.T
    logits[:, 0] = float("-inf")  # padding is never a valid prediction
    return F.cross_entropy(logits, targets)


def causal_loss(model: SeqRecModel, windows: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
    inputs, targets = windows[:, :-1], windows[:, 1:]
    hidden = model(inputs, **model.user_inputs(users))
    scored = (targets > 0) & (inputs > 0)
    return _full_softmax_ce(hidden[scored], targets[scored], model.item_weights())


def last_loss(model: SeqRecModel, windows: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
    hidden = model.last_hidden(windows[:, :-1], **model.user_inputs(users))
    return _full_softmax_ce(hidden, windows[:, -1], model.item_weights())


def cloze_loss(model: SeqRecModel, windows: torch.Tensor, mask_prob: float, generator: torch.Generator) -> torch.Tensor:
    items = windows[:, 1:]
    real = items > 0
    masked = real & (torch.rand(items.shape, generator=generator, device="cpu").to(items.device) < mask_prob)
    # every sequence predicts at least one item: mask its newest one if the coin flips left none
    none_masked = ~masked.any(1)
    masked[none_masked, -1] = real[none_masked, -1]
    hidden = model(items.masked_fill(masked, model.mask_token))
    return _full_softmax_ce(hidden[masked], items[masked], model.item_weights())


def bce_loss(model: SeqRecModel, windows: torch.Tensor, generator: torch.Generator,
             users: torch.Tensor | None = None) -> torch.Tensor:
    inputs, targets = windows[:, :-1], windows[:, 1:]
    hidden = model(inputs, **model.user_inputs(users))
    scored = (targets > 0) & (inputs > 0)
    hidden, positives = hidden[scored], targets[scored]
    weights = model.item_weights()
    num_items = weights.shape[0] - 1
    negatives = torch.randint(1, num_items + 1, positives.shape, generator=generator).to(positives.device)
    # resample collisions once by shifting: keeps the draw uniform over the other items
    negatives = torch.where(negatives == positives, negatives % num_items + 1, negatives)
    pos_logits = (hidden * weights[positives]).sum(-1)
    neg_logits = (hidden * weights[negatives]).sum(-1)
    return F.softplus(-pos_logits).mean() + F.softplus(neg_logits).mean()


def objective_loss(objective: str, model: SeqRecModel, windows: torch.Tensor, *, mask_prob: float,
                   generator: torch.Generator, users: torch.Tensor | None = None) -> torch.Tensor:
    """``users`` (B,): the user of each window, read only by models that set ``needs_users`` (FPMC)."""
    if objective == "causal":
        loss = causal_loss(model, windows, users)
    elif objective == "last":
        loss = last_loss(model, windows, users)
    elif objective == "cloze":
        loss = cloze_loss(model, windows, mask_prob, generator)
    elif objective == "bce":
        loss = bce_loss(model, windows, generator, users)
    else:
        raise ValueError(f"unknown objective {objective!r}")
    aux = model.aux_loss()
    return loss if aux is None else loss + aux


def history_prefix_windows(items: np.ndarray, starts: np.ndarray, lengths: np.ndarray, max_len: int, per_user: int,
                           batch_size: int, rng: np.random.Generator, *,
                           with_users: bool = False) -> Iterator[np.ndarray | tuple[np.ndarray, np.ndarray]]:
    """Shuffled batches of prefix windows (B, max_len + 1) over users' whole training histories.

    User u's training sequence is ``items[starts[u] : starts[u] + lengths[u]]``. Every item of it except
    the first is a target; its window holds the up to ``max_len`` items before it (left-padded) and the
    target last. ``per_user = 0`` yields every target once, which is RecBole's augmentation (one sample
    per training item after the first, however long the history); otherwise ``per_user`` targets per user
    are drawn with replacement. The order is shuffled with ``rng``; only the targets are kept in memory,
    each batch is one gather, so a long dataset never materialises all its windows at once.
    ``with_users`` yields ``(windows, users)``: each window's user (its index in ``starts``).
    """
    starts, counts = np.asarray(starts, dtype=np.int64), np.maximum(np.asarray(lengths, dtype=np.int64) - 1, 0)
    if per_user:
        owners = np.repeat(np.flatnonzero(counts), per_user)
        offsets = (rng.random(len(owners)) * counts[owners]).astype(np.int64)
    else:
        owners = np.repeat(np.arange(len(counts)), counts)
        offsets = np.arange(len(owners)) - np.repeat(np.cumsum(counts) - counts, counts)
    targets = starts[owners] + 1 + offsets  # positions in `items`; the owner's first item is never a target
    order = rng.permutation(len(targets))
    span = np.arange(-max_len, 1)
    for begin in range(0, len(order), batch_size):
        picked = order[begin:begin + batch_size]
        columns = targets[picked, None] + span
        windows = items[np.maximum(columns, 0)]
        windows[columns < starts[owners[picked], None]] = 0  # before the user's first item: padding
        yield (windows, owners[picked]) if with_users else windows
