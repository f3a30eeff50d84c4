"""Cotten4Rec (Veludandi et al., IntelliSys 2026): BERT4Rec with bidirectional cosine attention.

Per head, with padded rows of Q, K, V zeroed::

    Q̂, K̂ = row-L2(Q), row-L2(K)            (|x| = sqrt(Σx² + 1e-6))
    V′   = V / max(1, n_valid ** σ(m))        m: one learnable scalar per head and layer, init 0.5
    O    = Q̂ (K̂ᵀ V′)                         O(L·d²), no L×L matrix, no softmax, no 1/√d

computed by ``kernels.cosine_attention`` (a fused Triton kernel on CUDA, the torch reference on CPU).

Choices where the paper is open:
- m is σ-squashed, per head, initialised to 0.5, and n is the number of real items, clamped so the
  scale never enlarges V (the Cottention reference code); the paper's Eq. 9 writes ``1/n^m``.
- Backbone, defaults and cloze training are BERT4Rec's (``models/bert4rec.py``): 2 layers, 2 heads,
  d = 64, FFN 256, GELU, dropout 0.1, tied output embedding behind BERT's prediction transform (the
  paper's Eq. 11; its "additional two-layer FFN" remark is not followed). Eq. 11 scores ``h·e_i`` alone, so
  BERT4Rec's per-item output bias is not part of this head. There is no attention dropout: cosine attention
  has no probability matrix to drop from.
- The paper's optimiser settings (lr 1e-3, weight decay 1e-3, grad clip 1.0, batch 128) are trainer
  keys; they are set in ``search_spaces/paper/cotten4rec.yaml``.

Causal variant (``causal=True``, not in the paper; for the ``causal`` objective): the same cosine
scores summed over the prefix s ≤ t only, by ``kernels.causal_linear_attention(..., normalize=False)``.
The length scale then uses the prefix count n_t (the number of real items up to t) instead of
n_valid, so output t depends on nothing after t; at the newest position (t = L - 1, where n_t =
n_valid) it equals the bidirectional output exactly. The causal variant reads the newest position
for next-item ranking instead of appending a mask token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from models.base import ACTIVATIONS, ModelConfig, heads, one_of, positive, probability
from models.bert4rec import BERT4Rec
from models.blocks import TokenMixer
from models.mixers import LinearAttentionMixer, row_l2, zero_padding
from models.registry import register


class CosineAttention(LinearAttentionMixer):
    """Multi-head cosine attention with a learnable per-head length scale; bidirectional or causal."""

    def __init__(self, hidden_size: int, num_heads: int, causal: bool, m_init: float = 0.5):
        super().__init__(hidden_size, num_heads, causal)
        self.m = torch.nn.Parameter(torch.full((num_heads,), float(m_init)))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        if not self.causal:
            return kernels.cosine_attention(q, k, v, valid, self.m)
        q, k = row_l2(q, kernels.COSINE_EPS), zero_padding(row_l2(k, kernels.COSINE_EPS), valid)
        mixed = kernels.causal_linear_attention(q, k, zero_padding(v, valid), normalize=False)
        # 1 / max(1, n_t^σ(m)) with n_t = real items up to t; n_t >= 1 after the clamp, so max() is a no-op
        prefix_count = valid.cumsum(dim=1).clamp(min=1).to(mixed.dtype)
        scale = prefix_count[:, None, :, None].pow(-torch.sigmoid(self.m)[None, :, None, None])
        return mixed * scale


@dataclass
class Cotten4RecConfig(ModelConfig):
    num_layers: int = positive(2)
    num_heads: int = heads(2)
    inner_size: int = positive(256)
    dropout: float = probability(0.1)
    activation: str = one_of("gelu", ACTIVATIONS)
    m_init: float = 0.5
    causal: bool = False
    ffn_inner_dropout: bool = False  # True: dropout between the FFN linears too (the zoo's first form, not RecBole's)


@register("cotten4rec")
class Cotten4Rec(BERT4Rec):
    config_class = Cotten4RecConfig
    # The class lists every objective some configuration supports; each instance narrows it by `causal`.
    objectives = ("cloze", "last", "causal", "bce")
    default_objective = "cloze"
    uses_mask_token = True

    def __init__(self, config: Cotten4RecConfig):
        super().__init__(config)
        self.narrow_objectives(config.causal, otherwise=("cloze", "last"))

    def make_mixer(self, config: Cotten4RecConfig) -> TokenMixer:
        return CosineAttention(config.hidden_size, config.num_heads, config.causal, config.m_init)

    def last_hidden(self, items: torch.Tensor) -> torch.Tensor:
        if self.config.causal:
            return self.forward(items)[:, -1]
        return super().last_hidden(items)
