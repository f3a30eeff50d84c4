"""Training objectives. Each maps a batch of left-padded windows (B, L + 1) to a scalar loss.

A window's last column is the newest item. The objectives read it differently:
- ``causal``: next-item softmax CE at every position (input = window[:, :-1], target = window[:, 1:]).
  Efficient, and correct only for causal models.
- ``last``: CE at the last position only (input = window[:, :-1], target = window[:, -1]). Windows are
  prefixes of user sequences, produced by :func:`expand_prefixes`, which is RecBole's augmentation.
- ``cloze``: BERT4Rec's masked-item CE over the newest L items.
- ``bce``: the original SASRec loss, one uniformly sampled negative per position.

With ``trim`` (``TrainStep`` passes ``TrainConfig.trim_padding``, on by default) the columns that are padding
in every window of the batch are dropped before the model runs (:mod:`study.train.padding`); the target column
always stays, and the cloze mask is drawn over the full width first, so the random draws are the untrimmed ones.
``last`` also groups the batch's prefixes by length (:func:`last_hidden_by_length`): the batch, hence the
sampling, is unchanged; only the forward pass runs in ``LENGTH_GROUPS`` narrower pieces.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from models import ConfigError, SeqRecModel
from study.train.padding import padding_columns, trim_padding


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


def causal_loss(model: SeqRecModel, windows: torch.Tensor) -> torch.Tensor:
    inputs, targets = windows[:, :-1], windows[:, 1:]
    hidden = model(inputs)
    scored = (targets > 0) & (inputs > 0)
    return _full_softmax_ce(hidden[scored], targets[scored], model.item_weights())


def last_loss(model: SeqRecModel, windows: torch.Tensor, trim: bool = False) -> torch.Tensor:
    inputs = windows[:, :-1]
    hidden = last_hidden_by_length(model, inputs) if trim else model.last_hidden(inputs)
    return _full_softmax_ce(hidden, windows[:, -1], model.item_weights())


# Prefixes of one shuffled batch range from 1 item to max_len, so one long prefix makes the whole batch wide
# (LastFM at max_len 200: trimming alone saves 3% of the positions, four groups 58%).
LENGTH_GROUPS = 4


def length_groups(lengths: torch.Tensor, groups: int = LENGTH_GROUPS) -> list[torch.Tensor]:
    """Row indices of a batch, by real length, in at most ``groups`` nearly equal parts (shortest first).

    Neighbouring parts with the same longest prefix are merged, as splitting them would save nothing: a batch
    without padding (the scaling study's) stays one part, computed as one forward pass.
    """
    lengths = lengths.cpu()
    merged: list[torch.Tensor] = []
    for rows in torch.argsort(lengths, stable=True).tensor_split(groups):
        if len(rows) and merged and lengths[rows].max() == lengths[merged[-1]].max():
            merged[-1] = torch.cat([merged[-1], rows])
        elif len(rows):
            merged.append(rows)
    return merged


def last_hidden_by_length(model: SeqRecModel, inputs: torch.Tensor) -> torch.Tensor:
    """``model.last_hidden(inputs)`` computed in length groups, each trimmed to its own longest prefix.

    The rows are the same and no model mixes rows, so each row's hidden state is the one of the whole batch (up
    to float rounding); they come back in the batch's order. An auxiliary loss (LISA-Soft's) is a mean over real
    input positions, so the groups' terms are recombined weighted by their numbers of real positions.
    """
    real = inputs > 0
    groups = length_groups(real.sum(1))
    if len(groups) == 1:
        return model.last_hidden(trim_padding(inputs))
    parts, order, aux_terms = [], [], []
    for rows in groups:
        parts.append(model.last_hidden(trim_padding(inputs[rows])))
        order.append(rows)
        aux = model.aux_loss()
        if aux is not None:
            aux_terms.append(aux * real[rows].sum())
    if aux_terms:
        model.record_aux_loss(torch.stack(aux_terms).sum() / real.sum().clamp(min=1))
    return torch.cat(parts)[torch.argsort(torch.cat(order))]


def computed_positions(objective: str, windows: np.ndarray, trim: bool) -> int:
    """Input positions the model computes for one batch of (B, L + 1) windows (the cost line's figure)."""
    inputs = windows[:, :-1]
    if not trim:
        return inputs.size
    if objective == "cloze":
        return len(windows) * (windows.shape[1] - 1 - padding_columns(windows[:, 1:]))
    if objective != "last":
        return len(windows) * (windows.shape[1] - padding_columns(windows, keep=2) - 1)
    lengths = torch.as_tensor((inputs > 0).sum(1))
    return sum(len(rows) * max(int(lengths[rows].max()), 1) for rows in length_groups(lengths))


def cloze_loss(model: SeqRecModel, windows: torch.Tensor, mask_prob: float, generator: torch.Generator,
               trim: bool = False) -> torch.Tensor:
    items = windows[:, 1:]
    real = items > 0
    masked = real & (torch.rand(items.shape, generator=generator, device="cpu").to(items.device) < mask_prob)
    # every sequence predicts at least one item: mask its newest one if the coin flips left none
    none_masked = ~masked.any(1)
    masked[none_masked, -1] = real[none_masked, -1]
    if trim:  # after the draw, so the mask is the untrimmed batch's; dropped columns hold no item, hence no mask
        start = padding_columns(items)
        items, masked = items[:, start:], masked[:, start:]
    hidden = model(items.masked_fill(masked, model.mask_token))
    return _full_softmax_ce(hidden[masked], items[masked], model.item_weights())


def bce_loss(model: SeqRecModel, windows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    inputs, targets = windows[:, :-1], windows[:, 1:]
    hidden = model(inputs)
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
                   generator: torch.Generator, trim: bool = False) -> torch.Tensor:
    if trim and objective != "cloze":
        windows = trim_padding(windows, keep=2)  # at least one input column beside the targets
    if objective == "causal":
        loss = causal_loss(model, windows)
    elif objective == "last":
        loss = last_loss(model, windows, trim)
    elif objective == "cloze":
        loss = cloze_loss(model, windows, mask_prob, generator, trim)
    elif objective == "bce":
        loss = bce_loss(model, windows, generator)
    else:
        raise ValueError(f"unknown objective {objective!r}")
    aux = model.aux_loss()
    return loss if aux is None else loss + aux


def expand_prefixes(windows: np.ndarray, per_user: int, rng: np.random.Generator) -> np.ndarray:
    """Turn user windows (U, L + 1) into prefix windows, each ending at one training target.

    ``per_user = 0`` keeps every prefix (RecBole's augmentation); otherwise ``per_user`` targets are
    drawn per user with replacement. Built with one gather, no loop over users.
    """
    width = windows.shape[1]
    has_input = np.zeros_like(windows, dtype=bool)
    has_input[:, 1:] = (windows[:, 1:] > 0) & (windows[:, :-1] > 0)
    users, ends = np.nonzero(has_input)
    if per_user and len(users):
        counts = np.bincount(users, minlength=len(windows))
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        owners = np.repeat(np.flatnonzero(counts), per_user)
        picks = offsets[owners] + (rng.random(len(owners)) * counts[owners]).astype(np.int64)
        users, ends = users[picks], ends[picks]
    columns = ends[:, None] - (width - 1) + np.arange(width)[None, :]
    prefixes = windows[users[:, None], np.clip(columns, 0, None)]
    prefixes[columns < 0] = 0
    return prefixes
