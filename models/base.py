"""The model contract every zoo member follows.

A model maps a left-padded window of item ids ``(B, L)`` (0 = padding, the newest item at position
``L - 1``) to hidden states ``(B, L, d)``. ``L`` may be less than ``max_len``: the trainer drops the leading
columns that are padding in every row of a batch, so at real items a model's outputs must not depend on ``L``
(positions count from the newest item, ``models.blocks.right_aligned_positions``). Scoring is always
``hidden @ item_weights().T``, so the trainer, the objectives and the evaluator never need to know which token
mixer a model uses.

Hyperparameters are dataclass fields whose constraints are declared once, as field metadata (:func:`knob`,
:func:`positive`, :func:`probability`, :func:`one_of`, :func:`heads`), and checked generically. Models
report figures through :meth:`SeqRecModel.stats` and auxiliary loss terms through :meth:`SeqRecModel.aux_loss`.

Each model declares the objectives it can be trained with; ``causal`` (next-item CE at every
position) is only allowed when every token mixer is causal, otherwise training would leak the
future items the model is asked to predict.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

# sampled_ce (study.train.objectives) is allowed wherever causal is: it is causal training with a sampled softmax
OBJECTIVES = ("causal", "last", "cloze", "bce", "sampled_ce")
ACTIVATIONS = ("gelu", "relu", "silu")  # what models.blocks.FeedForward accepts
CONSTRAINT = "constraint"  # the dataclass field metadata key that holds a field's Constraint


@dataclass(frozen=True)
class Constraint:
    """What one hyperparameter must satisfy, declared once on its field (see :func:`knob`).

    Numeric bounds: ``at_least`` (>=), ``above`` (>), ``below`` (<); a bounded float must also be finite.
    ``choices``: allowed values. ``divides_hidden``: the value (a head count) must divide ``hidden_size``.
    ``why`` is appended to the bound in the message; ``only_if=(field, value)`` checks the field only when
    that other field has that value (e.g. LISA's target codebooks exist only in the ``mini`` variant).
    """

    at_least: float | None = None
    above: float | None = None
    below: float | None = None
    choices: tuple[Any, ...] | None = None
    divides_hidden: bool = False
    why: str = ""
    only_if: tuple[str, Any] | None = None

    def bound_text(self) -> str:
        if self.at_least is not None and self.below is not None:
            text = f"in [{self.at_least}, {self.below})"
        elif self.at_least is not None:
            text = f">= {self.at_least}"
        elif self.above is not None:
            text = f"> {self.above}"
        else:
            text = f"< {self.below}"
        return f"{text} {self.why}" if self.why else text

    def error(self, value: Any, config: ModelConfig) -> str | None:
        """The message for a violated constraint, or None when ``value`` satisfies it."""
        if self.only_if is not None and getattr(config, self.only_if[0]) != self.only_if[1]:
            return None
        if self.choices is not None and value not in self.choices:
            return f"must be one of {self.choices}, got {value!r}"
        bounded = (self.at_least, self.above, self.below) != (None, None, None)
        if bounded and not self.within_bounds(value):
            return f"must be {self.bound_text()}, got {value}"
        if self.divides_hidden and config.hidden_size % value:
            return f"must divide hidden_size={config.hidden_size}, got {value}"
        return None

    def within_bounds(self, value: Any) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return ((self.at_least is None or value >= self.at_least) and (self.above is None or value > self.above)
                and (self.below is None or value < self.below))


def knob(default: Any, **constraint: Any) -> Any:
    """A config field with its constraint, e.g. ``num_layers: int = knob(2, at_least=1)``."""
    return field(default=default, metadata={CONSTRAINT: Constraint(**constraint)})


def positive(default: int) -> Any:
    """Sizes and counts (layers, inner size, kernel size, ...) that must be >= 1."""
    return knob(default, at_least=1)


def probability(default: float) -> Any:
    """Dropout-like rates in [0, 1)."""
    return knob(default, at_least=0, below=1)


def one_of(default: Any, choices: tuple[Any, ...]) -> Any:
    return knob(default, choices=choices)


def heads(default: int) -> Any:
    """A head count: >= 1 and a divisor of ``hidden_size``, as every multi-head model needs."""
    return knob(default, at_least=1, divides_hidden=True)


def field_constraint(cls: type[ModelConfig], name: str) -> Constraint | None:
    """The constraint of field ``name``, from the nearest class in the MRO that declares one.

    A subclass that only changes a default (``hidden_size: int = 128``) keeps its base class's constraint.
    """
    for klass in cls.__mro__:
        declared = getattr(klass, "__dataclass_fields__", {}).get(name)
        if declared is not None and CONSTRAINT in declared.metadata:
            return declared.metadata[CONSTRAINT]
    return None


@dataclass
class ModelConfig:
    """Fields shared by every model. Subclasses add their own knobs with the paper's defaults.

    ``num_items`` comes from the dataset (ids 1..num_items, 0 = padding); ``max_len`` is the length
    of the input window and doubles as the size of learned position tables. Each field declares its
    constraint once (:func:`knob` and friends); :meth:`constraint_errors` checks them all.
    """

    num_items: int = positive(0)
    # 50: the window the defaults search chose for SASRec on ml-100k (benchmarks/defaults_search.py), and the one
    # every model of the reproduction campaign was validated at; a long-sequence study sets its own
    max_len: int = knob(50, at_least=2)
    hidden_size: int = positive(64)

    def constraint_errors(self) -> list[tuple[str, str]]:
        """Return ``(key, message)`` for every violated constraint.

        Returning all errors at once (rather than raising on the first) lets the sweep validator
        report a whole YAML file's problems in one go. Subclasses with rules that tie several fields
        together (e.g. ELASTIC's ``top_k <= sqrt(num_experts)``) extend this list.
        """
        errors = []
        for declared in dataclasses.fields(self):
            constraint = field_constraint(type(self), declared.name)
            message = constraint.error(getattr(self, declared.name), self) if constraint else None
            if message is not None:
                errors.append((declared.name, message))
        return errors

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TrainingSchedule:
    """A learning-rate schedule a model family's default training was validated with (see
    :attr:`SeqRecModel.history_schedule`). Each field is the trainer setting of the same name: the rate, the steps
    of its linear warm-up, and the epochs without a validation gain after which it decays (0 = none)."""

    lr: float
    lr_warmup_steps: int = 0
    lr_decay_patience: int = 0


class SeqRecModel(nn.Module):
    """Base class: subclasses set ``config_class``, build layers, and implement :meth:`forward`."""

    config_class: ClassVar[type[ModelConfig]] = ModelConfig
    objectives: ClassVar[tuple[str, ...]] = ("causal", "last", "bce")
    default_objective: ClassVar[str] = "causal"
    # Models trained with ``cloze`` reserve id ``num_items + 1`` as the mask token.
    uses_mask_token: ClassVar[bool] = False
    # Models that read the user id (FPMC's user-item term) set this; the trainer, the objectives and the evaluator
    # then pass ``users`` (B,) long to them, and only to them, so every other model keeps the items-only contract.
    needs_users: ClassVar[bool] = False
    # Whether the trainer's `auto` windows cover each user's whole history for this model under the objectives that
    # score every position (study.train.objectives.resolve_windows), rather than its newest window. A family gets
    # them once its validation improved with them (benchmarks/defaults_search.py), and keeps the newest window
    # until then.
    whole_history_windows: ClassVar[bool] = False
    # The schedule that the trainer's `auto` lr, lr_warmup_steps and lr_decay_patience take when this model trains
    # its default objective on whole-history windows (study.train.objectives.resolve_schedule); under any other
    # objective or window, or without one, they take the trainer's constant rate. A family gets one once its
    # validation improved with it on those windows (benchmarks/defaults_search.py).
    history_schedule: ClassVar[TrainingSchedule | None] = None

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self._pending_aux_loss: torch.Tensor | None = None

    def narrow_objectives(self, causal: bool, otherwise: tuple[str, ...]) -> None:
        """Narrow the class's objectives to this instance's mixer: a causal one trains like SASRec (default
        ``causal``); a bidirectional one only with ``otherwise``, whose first entry becomes the default."""
        self.objectives = ("causal", "last", "bce") if causal else otherwise
        self.default_objective = self.objectives[0]

    def user_inputs(self, users: torch.Tensor | None) -> dict[str, torch.Tensor | None]:
        """Keyword arguments for :meth:`forward` / :meth:`last_hidden`: ``users`` for models that ask for it."""
        return {"users": users} if self.needs_users else {}

    @property
    def mask_token(self) -> int:
        return self.config.num_items + 1

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        """``items`` (B, L) long, left-padded with 0 → hidden states (B, L, d)."""
        raise NotImplementedError

    def last_hidden(self, items: torch.Tensor) -> torch.Tensor:
        """Hidden state used to rank the item that follows ``items``: (B, L) → (B, d).

        Causal models read the newest position. Bidirectional cloze models override this to
        append a mask token, which is how BERT4Rec asks "what comes next?".
        """
        return self.forward(items)[:, -1]

    def item_weights(self) -> torch.Tensor:
        """Output embedding of items 0..num_items, (num_items + 1, d); row 0 (padding) is never ranked.

        An evaluator fetches it once per pass, before ranking any batch (``study.train.metrics.evaluate``), so
        in eval mode this call marks the start of an evaluation pass (ELASTIC counts its expert usage by it).
        """
        raise NotImplementedError

    def record_aux_loss(self, loss: torch.Tensor) -> None:
        """Called by a training-mode :meth:`forward` that produces an auxiliary loss term (LISA-Soft)."""
        self._pending_aux_loss = loss

    def aux_loss(self) -> torch.Tensor | None:
        """The auxiliary loss recorded by the last training forward pass, or None; the objective adds it.

        It is handed out once: a step's term can never be added to a later step's loss, and the graph
        it holds is released with the step.
        """
        loss, self._pending_aux_loss = self._pending_aux_loss, None
        return loss

    def stats(self) -> dict[str, float]:
        """Model-specific figures to record with a trial (e.g. ELASTIC's expert usage, the RELA form)."""
        return {}

    @property
    def mixes_rows_in_training(self) -> bool:
        """Whether a training forward makes a row's output depend on the other rows of its batch (batch statistics:
        ELASTIC's query BatchNorm). The trainer then computes a training batch whole, never in length groups
        (``study.train.padding``); in eval mode no model mixes rows."""
        return False

    @property
    def is_causal(self) -> bool:
        return "causal" in self.objectives


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """RecBole/BERT initialisation: N(0, std) for linear and embedding weights, identity LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
