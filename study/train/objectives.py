"""Training objectives. Each maps a batch of left-padded windows (B, L + 1) to a scalar loss.

A window's last column is the newest item. The objectives read it differently:
- ``causal``: next-item softmax CE at every position (input = window[:, :-1], target = window[:, 1:]).
  Efficient, and correct only for causal models.
- ``last``: CE at the last position only (input = window[:, :-1], target = window[:, -1]). Windows are
  prefixes of whole user histories (RecBole's augmentation).
- ``cloze``: BERT4Rec's masked-item CE over the newest L items of each window.
- ``bce``: the original SASRec loss, one uniformly sampled negative per position.
- ``sampled_ce``: sampled softmax with the logQ correction at every position (like ``causal``), against
  ``train_negatives`` negatives drawn ``uniform``-ly or by ``popularity`` (gSASRec/eSASRec, Petrov & Macdonald).
  See :func:`sampled_softmax_ce` for the choices.

Every objective but ``last`` trains on windows of L items cut from each user's training history as
:func:`resolve_windows` says: over the whole history or the newest window only. :mod:`study.train.batches` cuts
them (and ``last``'s prefixes).

With ``trim`` (``TrainStep`` passes ``TrainConfig.trim_padding``, by default on a CPU) the columns that are padding
in every window of the batch are dropped before the model runs (:mod:`study.train.padding`); the target column
always stays, and the cloze mask is drawn over the full width first, so the random draws are the untrimmed ones.
Every objective but ``cloze`` also groups the batch's windows by length (``hidden_by_length`` and
``last_hidden_by_length`` in :mod:`study.train.padding`): the batch, hence the sampling, is unchanged; only the
forward pass runs in ``LENGTH_GROUPS`` narrower pieces. A dropout mask drawn per piece is a different draw from
the same distribution, so grouped and ungrouped runs are twins only without dropout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import models
from models import ConfigError, SeqRecModel
from study.train.padding import hidden_by_length, last_hidden_by_length, length_groups, padding_columns, trim_padding
from study.train.settings import LR, SCORED_ONCE, TrainConfig, resolve_patience

# objectives that score every position of a window, so they need a causal model
CAUSAL_OBJECTIVES = ("causal", "sampled_ce")
# objectives that score every position of a window: windows over older items score only their new targets
SCORING_OBJECTIVES = ("causal", "bce", "sampled_ce")


def resolve_objective(model: SeqRecModel, objective: str) -> str:
    """The objective a trial uses; an objective the model cannot train with is a config error."""
    chosen = model.default_objective if objective == "auto" else objective
    # sampled_ce is causal training with a cheaper softmax: any model that may train with `causal` may use it
    allowed = chosen in model.objectives or (chosen == "sampled_ce" and "causal" in model.objectives)
    if not allowed:
        leak = "its token mixer is not causal, so all-position training would leak future items"
        reason = {
            "causal": leak,
            "sampled_ce": leak,
            "cloze": "it is a causal-only model; cloze needs a bidirectional mixer and a mask token",
        }.get(chosen, "it is not supported by this model")
        raise ConfigError([("objective", f"{model.name} cannot train with {chosen!r}: {reason}; "
                                         f"supported: {', '.join(model.objectives)}")])
    return chosen


def resolve_windows(objective: str, window_step: int | None, window_targets: str | None, max_len: int,
                    model_name: str) -> tuple[int, str]:
    """How a trial cuts each user's training history into windows, as ``(window_step, window_targets)``.

    ``window_step`` 0 trains on each user's newest window only, scoring all of it (``all``). Otherwise windows
    ``window_step`` items apart cover the whole history, so every training item is a target an epoch: ``all`` scores
    every target of every window (``history_windows``, BERT4Rec's reference layout), ``new``, ``tail``,
    ``aligned``, ``shifting`` and ``single`` only the ones no newer window scored, the older part of a window being
    context (``history_new_target_windows``; ``tail`` scores the newest window's older targets in older windows
    too, where they see more context, ``aligned`` also scores every target in a window's newest slots, ``shifting``
    moves those windows every epoch, and ``single`` gives each target a window of its own at those slots).

    The defaults (``None``): under ``cloze``, windows 0.1 x max_len apart (BERT4Rec's ``prop_sliding_window``)
    with ``all``, since a cloze window's targets are the random masked positions, none of which is newer than
    another; under the objectives that score every position, for a model whose family was validated on them
    (``SeqRecModel.whole_history_windows``; else each user's newest window), windows max_len / 5 apart with
    ``new``, so each target older than the newest window sees at least 0.8 x max_len items of context, and an
    epoch computes about five windows per max_len items of history beyond the newest window. ``last`` trains on
    every prefix and has no windows: a step or ``new`` given with it are an error, as are the layouts that score
    each target once (:data:`SCORED_ONCE`) under cloze and a step past max_len (it would skip items). ``tail``,
    ``aligned``, ``shifting`` and ``single`` are never defaults: a study names them. Resolved settings resolve to
    themselves.
    """
    def refuse(key: str, why: str) -> ConfigError:
        return ConfigError([(key, f"{why}; this trial trains {model_name} with {objective!r}")])

    if objective == "last":
        # (0, "all") is what `last` resolves to: settings resolved once (a step's, handed to another) pass again
        if window_step or window_targets not in (None, "all"):
            raise refuse("window_step" if window_step else "window_targets",
                         "`last` trains on every prefix of the whole history, not on windows")
        return 0, "all"
    if objective == "cloze" and window_targets in SCORED_ONCE:
        raise refuse("window_targets", "cloze scores randomly masked positions, which no window order makes new")
    if window_step is None and objective == "cloze":
        window_step = max(1, max_len // 10)
    elif window_step is None:
        window_step = max(1, max_len // 5) if models.model_class(model_name).whole_history_windows else 0
    if window_step > max_len:
        raise refuse("window_step", f"{window_step} is longer than the window (max_len {max_len}), so the windows "
                                    "would skip items")
    if window_step == 0:
        return 0, "all"
    return window_step, window_targets or ("all" if objective == "cloze" else "new")


SCHEDULE_KEYS = ("lr", "lr_warmup_steps", "lr_decay_patience")
CONSTANT_SCHEDULE = {"lr": LR, "lr_warmup_steps": 0, "lr_decay_patience": 0}


def resolve_schedule(objective: str, window_step: int, model_name: str) -> dict[str, float | int]:
    """The learning-rate schedule that the `auto` ones among :data:`SCHEDULE_KEYS` take, for a trial of
    ``model_name`` with ``objective`` and ``window_step`` (both resolved): the family's validated schedule
    (``SeqRecModel.history_schedule``) where it trains its default objective on whole-history windows, the setting
    it was validated in; anywhere else :data:`CONSTANT_SCHEDULE`, since a longer step validated on one objective's
    windows says nothing of another's or of the newest window's."""
    family = models.model_class(model_name)
    if family.history_schedule is not None and objective == family.default_objective and window_step > 0:
        return dataclasses.asdict(family.history_schedule)
    return dict(CONSTANT_SCHEDULE)


def resolve_auto_settings(train: TrainConfig, objective: str, max_len: int, model_name: str) -> TrainConfig:
    """``train`` with its objective-dependent `auto` settings resolved for ``objective`` (already resolved): the
    windows (:func:`resolve_windows`), the patience (:func:`~study.train.settings.resolve_patience`) and the
    learning-rate schedule (:func:`resolve_schedule`). The training step, the memory probe and the recorder's rows
    all resolve them here, so they agree. A decay set at or past the patience is refused (training would stop
    before it); an `auto` one is then 0, which is what would run."""
    window_step, window_targets = resolve_windows(objective, train.window_step, train.window_targets, max_len,
                                                  model_name)
    patience = resolve_patience(objective, train.patience)
    schedule = {key: getattr(train, key) for key in SCHEDULE_KEYS if getattr(train, key) is not None}
    if patience and schedule.get("lr_decay_patience", 0) >= patience:
        raise ConfigError([("lr_decay_patience", f"{train.lr_decay_patience} never decays the learning rate: "
                                                 f"training stops after {patience} epochs without a gain (patience)")])
    schedule = {**resolve_schedule(objective, window_step, model_name), **schedule}
    if patience and schedule["lr_decay_patience"] >= patience:
        schedule["lr_decay_patience"] = 0
    return dataclasses.replace(train, window_step=window_step, window_targets=window_targets, patience=patience,
                               **schedule)


def trains_on_histories(objective: str, window_step: int) -> bool:
    """Whether a trial with these resolved settings builds its batches from every user's whole history (which
    data-parallel workers and streamed datasets do not hold)."""
    return objective == "last" or window_step > 0


def _full_softmax_ce(hidden: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    logits = hidden @ weights.T
    logits[:, 0] = float("-inf")  # padding is never a valid prediction
    return F.cross_entropy(logits, targets)


def _hidden(model: SeqRecModel, inputs: torch.Tensor, users: torch.Tensor | None, trim: bool) -> torch.Tensor:
    return hidden_by_length(model, inputs, users) if trim else model(inputs, **model.user_inputs(users))


def scored_positions(windows: torch.Tensor, scored: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L) mask of the target positions of (B, L + 1) windows that carry a causal objective's loss: a real
    target after a real input, and among each window's newest ``scored`` (B,) targets where given
    (``history_new_target_windows``). Counted from the newest column, so trimming leading padding keeps it."""
    inputs, targets = windows[:, :-1], windows[:, 1:]
    mask = (targets > 0) & (inputs > 0)
    if scored is not None:
        columns = torch.arange(targets.shape[1], device=targets.device)
        mask &= columns[None, :] >= targets.shape[1] - scored[:, None]
    return mask


def causal_loss(model: SeqRecModel, windows: torch.Tensor, users: torch.Tensor | None = None,
                trim: bool = False, scored: torch.Tensor | None = None) -> torch.Tensor:
    inputs, targets = windows[:, :-1], windows[:, 1:]
    hidden = _hidden(model, inputs, users, trim)
    scored = scored_positions(windows, scored)
    return _full_softmax_ce(hidden[scored], targets[scored], model.item_weights())


def last_loss(model: SeqRecModel, windows: torch.Tensor, users: torch.Tensor | None = None,
              trim: bool = False) -> torch.Tensor:
    inputs = windows[:, :-1]
    hidden = (last_hidden_by_length(model, inputs, users) if trim
              else model.last_hidden(inputs, **model.user_inputs(users)))
    return _full_softmax_ce(hidden, windows[:, -1], model.item_weights())


def cloze_samples_per_window(config: Any) -> int:
    """Cloze samples made of each window: its masked copies plus the §3.6 last-item sample (see cloze_inputs)."""
    return getattr(config, "cloze_copies", 1) + bool(getattr(config, "cloze_last_item_samples", False))


def computed_positions(objective: str, windows: np.ndarray, trim: bool, cloze_samples: int = 1) -> int:
    """Input positions the model computes for one batch of (B, L + 1) windows (the cost line's figure);
    ``cloze_samples``: samples per window of the cloze task (:func:`cloze_samples_per_window`)."""
    inputs = windows[:, :-1]
    if objective == "cloze":
        width = windows.shape[1] - 1 - (padding_columns(windows[:, 1:]) if trim else 0)
        return cloze_samples * len(windows) * width
    if not trim:
        return inputs.size
    lengths = torch.as_tensor((inputs > 0).sum(1))
    return sum(len(rows) * max(int(lengths[rows].max()), 1) for rows in length_groups(lengths))


def cloze_inputs(windows: torch.Tensor, mask_prob: float, generator: torch.Generator, *, copies: int = 1,
                 last_item_samples: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The cloze task of one batch: ``(items, masked)``, both (B', L), the newest L items of each window.

    Each window appears ``copies`` times, each copy with its own random mask (the BERT4Rec reference code's
    ``dupe_factor``: more supervised targets per pass over the users, at one evaluation per epoch). With
    ``last_item_samples`` one more copy per window masks only its newest item (the paper's §3.6 samples, which
    train exactly the next-item query). With the defaults the batch and its random draws are the plain cloze ones.
    """
    items = windows[:, 1:].repeat(copies, 1)
    real = items > 0
    masked = real & (torch.rand(items.shape, generator=generator, device="cpu").to(items.device) < mask_prob)
    # every sequence predicts at least one item: mask its newest one if the coin flips left none
    none_masked = ~masked.any(1)
    masked[none_masked, -1] = real[none_masked, -1]
    if last_item_samples:
        newest = windows[:, 1:]
        only_newest = torch.zeros_like(newest, dtype=torch.bool)
        only_newest[:, -1] = newest[:, -1] > 0  # the newest column holds each window's last real item
        items, masked = torch.cat([items, newest]), torch.cat([masked, only_newest])
    return items, masked


def cloze_loss(model: SeqRecModel, windows: torch.Tensor, mask_prob: float, generator: torch.Generator,
               trim: bool = False) -> torch.Tensor:
    """Masked-item CE; the model config's ``cloze_copies`` and ``cloze_last_item_samples`` (BERT4Rec's, read
    with the plain cloze task as default for models without them) shape the samples, see :func:`cloze_inputs`."""
    items, masked = cloze_inputs(windows, mask_prob, generator,
                                 copies=getattr(model.config, "cloze_copies", 1),
                                 last_item_samples=getattr(model.config, "cloze_last_item_samples", False))
    if trim:  # after the draw, so the mask is the untrimmed batch's; dropped columns hold no item, hence no mask
        start = padding_columns(items)
        items, masked = items[:, start:], masked[:, start:]
    hidden = model(items.masked_fill(masked, model.mask_token))
    return _full_softmax_ce(hidden[masked], items[masked], model.item_weights())


def bce_loss(model: SeqRecModel, windows: torch.Tensor, generator: torch.Generator,
             users: torch.Tensor | None = None, trim: bool = False,
             scored: torch.Tensor | None = None) -> torch.Tensor:
    inputs, targets = windows[:, :-1], windows[:, 1:]
    hidden = _hidden(model, inputs, users, trim)
    scored = scored_positions(windows, scored)
    hidden, positives = hidden[scored], targets[scored]
    weights = model.item_weights()
    num_items = weights.shape[0] - 1
    negatives = torch.randint(1, num_items + 1, positives.shape, generator=generator).to(positives.device)
    # resample collisions once by shifting: keeps the draw uniform over the other items
    negatives = torch.where(negatives == positives, negatives % num_items + 1, negatives)
    pos_logits = (hidden * weights[positives]).sum(-1)
    neg_logits = (hidden * weights[negatives]).sum(-1)
    return F.softplus(-pos_logits).mean() + F.softplus(neg_logits).mean()


class NegativeSampler:
    """Draws the training negatives of ``sampled_ce`` and knows each item's log sampling probability.

    ``uniform``: q = 1 / num_items over ids 1..num_items. ``popularity``: q ∝ training count + 1; the +1 keeps
    every item drawable and its log q finite, so a positive never seen in the counts still gets a finite
    correction. Padding (id 0) has q = 0 and is never drawn. Draws are with replacement, from the step's own
    CPU generator (so they never shift the model's RNG), then moved to the model's device.
    """

    def __init__(self, num_items: int, num_negatives: int, kind: str = "uniform",
                 item_popularity: np.ndarray | None = None) -> None:
        if kind == "popularity":
            if item_popularity is None:
                raise ValueError("the popularity sampler needs the training item counts")
            counts = torch.as_tensor(np.asarray(item_popularity, dtype=np.float64)[: num_items + 1])
            if counts.shape != (num_items + 1,):
                raise ValueError(f"item_popularity must hold {num_items + 1} counts (padding first), "
                                 f"got {tuple(counts.shape)}")
            weights = counts.clamp(min=0) + 1.0
        elif kind == "uniform":
            weights = torch.ones(num_items + 1, dtype=torch.float64)
        else:
            raise ValueError(f"unknown negative sampler {kind!r}")
        weights[0] = 0.0
        self.kind = kind
        self.num_negatives = num_negatives
        self.probs = weights / weights.sum()  # (num_items + 1,), float64 on the CPU: what torch.multinomial reads
        self.log_probs = torch.log(self.probs).float()  # log 0 = -inf at padding, which is never a candidate
        self._device_log_probs: dict[torch.device, torch.Tensor] = {}

    def draw(self, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        """``num_negatives`` item ids (with replacement), shared by every position of the step."""
        if self.kind == "uniform":  # randint: no (num_items,) scan per step
            ids = torch.randint(1, len(self.probs), (self.num_negatives,), generator=generator)
        else:
            ids = torch.multinomial(self.probs, self.num_negatives, replacement=True, generator=generator)
        return ids.to(device)

    def log_q(self, device: torch.device) -> torch.Tensor:
        """log q of every id, (num_items + 1,) float32 on ``device`` (cached: moved once per device)."""
        if device not in self._device_log_probs:
            self._device_log_probs[device] = self.log_probs.to(device)
        return self._device_log_probs[device]


def sampled_softmax_ce(hidden: torch.Tensor, positives: torch.Tensor, weights: torch.Tensor,
                       negatives: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Sampled softmax CE with the logQ correction over scored positions.

    ``hidden`` (P, d) and ``positives`` (P,) are the scored positions; ``negatives`` (K,) are ONE draw shared by
    every position of the batch (one (P, d) x (d, K) product instead of P gathers of K rows, which is what makes
    it cheap); ``log_q`` (num_items + 1,) is each id's log sampling probability.

    Each candidate's logit is ``h·w_j − log q_j`` (Bengio & Senécal's logQ correction, as in Yi et al. 2019 and
    eSASRec): the positive is corrected too, so that when every item is sampled once under a uniform q the shift
    is one constant and the loss is exactly the full softmax CE. A negative that equals the position's own
    positive (an accidental hit, likely under popularity sampling) is masked to −∞ rather than redrawn, so the
    positive appears exactly once among the logits.
    """
    target_logits = (hidden * weights[positives]).sum(-1) - log_q[positives]
    negative_logits = hidden @ weights[negatives].T - log_q[negatives]
    negative_logits = negative_logits.masked_fill(negatives[None, :] == positives[:, None], float("-inf"))
    logits = torch.cat([target_logits[:, None], negative_logits], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


def sampled_ce_loss(model: SeqRecModel, windows: torch.Tensor, sampler: NegativeSampler,
                    generator: torch.Generator, users: torch.Tensor | None = None,
                    trim: bool = False, scored: torch.Tensor | None = None) -> torch.Tensor:
    inputs, targets = windows[:, :-1], windows[:, 1:]
    hidden = _hidden(model, inputs, users, trim)
    scored = scored_positions(windows, scored)
    negatives = sampler.draw(generator, windows.device)
    return sampled_softmax_ce(hidden[scored], targets[scored], model.item_weights(), negatives,
                              sampler.log_q(windows.device))


def objective_loss(objective: str, model: SeqRecModel, windows: torch.Tensor, *, mask_prob: float,
                   generator: torch.Generator, users: torch.Tensor | None = None,
                   sampler: NegativeSampler | None = None, trim: bool = False,
                   scored: torch.Tensor | None = None) -> torch.Tensor:
    """``users`` (B,): the user of each window, read only by models that set ``needs_users`` (FPMC);
    ``sampler``: the negatives of ``sampled_ce``; ``trim``: drop the batch's all-padding columns first;
    ``scored`` (B,): how many newest targets of each window the causal objectives score (None: all)."""
    if scored is not None and objective not in SCORING_OBJECTIVES:
        raise ValueError(f"the {objective!r} objective does not score a window's positions selectively")
    if trim and objective != "cloze":
        windows = trim_padding(windows, keep=2)  # at least one input column beside the targets
    if objective == "causal":
        loss = causal_loss(model, windows, users, trim, scored)
    elif objective == "last":
        loss = last_loss(model, windows, users, trim)
    elif objective == "cloze":
        loss = cloze_loss(model, windows, mask_prob, generator, trim)
    elif objective == "bce":
        loss = bce_loss(model, windows, generator, users, trim, scored)
    elif objective == "sampled_ce":
        if sampler is None:
            raise ValueError("the sampled_ce objective needs a NegativeSampler")
        loss = sampled_ce_loss(model, windows, sampler, generator, users, trim, scored)
    else:
        raise ValueError(f"unknown objective {objective!r}")
    aux = model.aux_loss()
    return loss if aux is None else loss + aux
