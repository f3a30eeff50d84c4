"""The model contract every zoo member follows.

A model maps a left-padded window of item ids ``(B, L)`` (0 = padding, the newest item at position
``L - 1``) to hidden states ``(B, L, d)``. Scoring is always ``hidden @ item_weights().T``, so the
trainer, the objectives and the evaluator never need to know which token mixer a model uses.

Each model declares the objectives it can be trained with; ``causal`` (next-item CE at every
position) is only allowed when every token mixer is causal, otherwise training would leak the
future items the model is asked to predict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

OBJECTIVES = ("causal", "last", "cloze", "bce")


@dataclass
class ModelConfig:
    """Fields shared by every model. Subclasses add their own knobs with the paper's defaults.

    ``num_items`` comes from the dataset (ids 1..num_items, 0 = padding); ``max_len`` is the length
    of the input window and doubles as the size of learned position tables.
    """

    num_items: int = 0
    max_len: int = 200
    hidden_size: int = 64

    def constraint_errors(self) -> list[tuple[str, str]]:
        """Return ``(key, message)`` for every violated constraint; subclasses extend this list.

        Returning all errors at once (rather than raising on the first) lets the sweep validator
        report a whole YAML file's problems in one go.
        """
        errors = []
        if self.num_items < 1:
            errors.append(("num_items", f"must be >= 1, got {self.num_items}"))
        if self.max_len < 2:
            errors.append(("max_len", f"must be >= 2, got {self.max_len}"))
        if self.hidden_size < 1:
            errors.append(("hidden_size", f"must be >= 1, got {self.hidden_size}"))
        return errors

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def heads_divide_hidden(config: ModelConfig, num_heads: int) -> list[tuple[str, str]]:
    """The constraint shared by every multi-head model."""
    if num_heads < 1:
        return [("num_heads", f"must be >= 1, got {num_heads}")]
    if config.hidden_size % num_heads:
        return [("num_heads", f"must divide hidden_size={config.hidden_size}, got {num_heads}")]
    return []


def at_least_one_errors(config: ModelConfig, *keys: str) -> list[tuple[str, str]]:
    """Sizes and counts that must be positive integers (layers, inner size, kernel size, …)."""
    return [(key, f"must be >= 1, got {getattr(config, key)}") for key in keys if getattr(config, key) < 1]


def probability_errors(config: ModelConfig, *keys: str) -> list[tuple[str, str]]:
    return [(key, f"must be in [0, 1), got {getattr(config, key)}")
            for key in keys if not 0.0 <= getattr(config, key) < 1.0]


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

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config

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
        """Output embedding of items 0..num_items, (num_items + 1, d); row 0 (padding) is never ranked."""
        raise NotImplementedError

    def extra_losses(self) -> torch.Tensor | None:
        """Auxiliary loss of the last forward pass (e.g. a quantizer's reconstruction term), or None."""
        return None

    def extra_stats(self) -> dict[str, float]:
        """Model-specific figures to record with a trial (e.g. ELASTIC's expert usage, the RELA form)."""
        return {}

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
