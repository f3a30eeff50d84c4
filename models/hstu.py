"""HSTU (Zhai et al., ICML 2024, "Actions Speak Louder than Words"): the ELASTIC paper's generative baseline.

One HSTU layer, as in the paper's equations (1)-(3), with a pre-norm residual as in the reference code:

    U, V, Q, K = Split(SiLU(f1(LN(X))))
    A(X)V      = SiLU(Q Kᵀ + rab_p) / N · V            (pointwise aggregated attention: no softmax)
    X          = X + f2(drop(Norm(A(X)V) ⊙ U))

Choices the paper leaves open, taken from its reference implementation (``generative-recommenders``):
- ``N`` is the configured window ``max_len`` (the padded length the reference divides by), so a score does not
  depend on how many of the keys are real items nor on a batch trimmed of its padding columns; padded keys and
  future keys are zeroed after the SiLU. Positions count from the newest item (``right_aligned_positions``).
- ``f1`` has no bias; ``Norm`` is a LayerNorm without learned scale over each head's ``dv`` values; the input
  LayerNorm and ``Norm`` use eps 1e-6. Embedding: item × √d + learned absolute position, then dropout.
- rab_p is a learned scalar per relative distance (i − j), shared by the heads, as the reference's
  ``RelativeBucketedTimeAndPositionBasedBias``. Its **time bias is left out**: the prepared windows carry
  item ids only, no timestamps.
- Causal: position t sees items ≤ t. Trained by default with the house ``causal`` objective (full softmax CE at
  every position) rather than the reference's sampled softmax over 128 negatives with L2-normalised embeddings
  and temperature 0.05; the output head is tied to the item embedding and the final states are not normalised.
  It trains on windows over each user's whole history (``window_step``: ``max_len`` / 5 apart, each training item
  a target once an epoch) rather than on each user's newest window.

Defaults are sized for MovieLens-100K on a laptop CPU: d = 64, 2 layers, 1 head, dqk = dv = 64, dropout 0.2.
The reference configuration for ML-1M (search_spaces/paper/hstu-ml1m.yaml) is d = 50, 2 blocks, 1 head,
dqk = dv = 50, dropout 0.2, lr 1e-3, batch 128, max_len 200 (HSTU-large: 8 blocks, 2 heads, dqk = dv = 25).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.base import ModelConfig, SeqRecModel, init_weights, positive, probability
from models.blocks import ItemEmbedding, TokenMixer, right_aligned_positions
from models.registry import register


@dataclass
class HSTUConfig(ModelConfig):
    num_layers: int = positive(2)
    num_heads: int = positive(1)  # heads have their own widths (attention_dim, linear_dim): no divisibility rule
    attention_dim: int = positive(64)  # dqk, per head
    linear_dim: int = positive(64)  # dv (and the U gate), per head
    dropout: float = probability(0.2)


class PointwiseAttention(TokenMixer):
    """HSTU's mixer: SiLU(QKᵀ + rab_p) / N aggregation, the U gate and the output projection f2.

    ``causal=False`` lets every position see the whole window (only the tests use it, as a leaking control).
    """

    def __init__(self, hidden_size: int, num_heads: int, attention_dim: int, linear_dim: int, max_len: int,
                 dropout: float, causal: bool = True):
        super().__init__(causal)
        self.num_heads, self.attention_dim, self.linear_dim = num_heads, attention_dim, linear_dim
        self.uvqk = nn.Linear(hidden_size, num_heads * (2 * linear_dim + 2 * attention_dim), bias=False)
        # one bias per relative distance j - i in [-(max_len - 1), max_len - 1]
        self.relative_bias = nn.Parameter(torch.zeros(2 * max_len - 1))
        self.out = nn.Linear(num_heads * linear_dim, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.max_len = max_len

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        heads, dqk, dv = self.num_heads, self.attention_dim, self.linear_dim
        u, v, q, k = F.silu(self.uvqk(x)).split([heads * dv, heads * dv, heads * dqk, heads * dqk], dim=-1)
        q = q.view(batch, length, heads, dqk).transpose(1, 2)
        k = k.view(batch, length, heads, dqk).transpose(1, 2)
        v = v.view(batch, length, heads, dv).transpose(1, 2)
        positions = torch.arange(length, device=x.device)
        bias = self.relative_bias[positions[None, :] - positions[:, None] + self.max_len - 1]
        allowed = valid[:, None, None, :]
        if self.causal:
            allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        # / N with N = max_len, the configured window (not the batch's width), so a trimmed batch computes the same
        weights = (F.silu(q @ k.transpose(-1, -2) + bias) / self.max_len) * allowed
        mixed = F.layer_norm(weights @ v, (dv,), eps=1e-6)  # Norm(A(X)V), per head
        gated = mixed.transpose(1, 2).reshape(batch, length, heads * dv) * u
        return self.out(self.dropout(gated))


class HSTULayer(nn.Module):
    """Pre-norm residual around :class:`PointwiseAttention`; HSTU has no separate feed-forward."""

    def __init__(self, mixer: PointwiseAttention, hidden_size: int):
        super().__init__()
        self.mixer = mixer
        self.norm = nn.LayerNorm(hidden_size, eps=1e-6)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(self.norm(x), valid)


@register("hstu")
class HSTU(SeqRecModel):
    config_class = HSTUConfig
    objectives = ("causal", "last", "bce")
    default_objective = "causal"
    whole_history_windows = True  # chosen on validation by benchmarks/defaults_search.py

    def __init__(self, config: HSTUConfig):
        super().__init__(config)
        c = config
        self.embedding = ItemEmbedding(c.num_items, c.max_len, c.hidden_size, c.dropout, layer_norm=False)
        self.layers = nn.ModuleList([
            HSTULayer(PointwiseAttention(c.hidden_size, c.num_heads, c.attention_dim, c.linear_dim, c.max_len,
                                         c.dropout), c.hidden_size)
            for _ in range(c.num_layers)
        ])
        self.apply(init_weights)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        valid = items > 0
        positions = right_aligned_positions(items.shape[1], self.config.max_len, items.device)
        scaled_items = self.embedding.items(items) * math.sqrt(self.config.hidden_size)
        embedded = scaled_items + self.embedding.positions(positions)
        x = self.embedding.dropout(embedded) * valid.unsqueeze(-1)
        for layer in self.layers:
            x = layer(x, valid)
        return x * valid.unsqueeze(-1)

    def item_weights(self) -> torch.Tensor:
        return self.embedding.items.weight
