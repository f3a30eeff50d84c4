"""LinRec (Liu et al., SIGIR 2023): SASRec with L2-normalised linear attention.

Per head (L2 with eps 1e-6 inside the square root)::

    Q̂ = row-L2(ELU(Q))            each query over its features
    K̂ = col-L2(ELU(K))            each feature column over the sequence positions
    O = Q̂ (K̂ᵀ V) / √d_head        O(L·d²); no softmax, no denominator

inside the RecBole SASRec backbone (learned positions, embedding LayerNorm + dropout, post-LN blocks,
GELU FFN, tied output). Defaults are the LinRec configuration shipped with the RecGRELA code, the
run behind the published ML-1M LinRec figures (reference_numbers.md §1.4): d = 128, 2 layers,
8 heads, FFN 256, dropout 0.2. ELU is plain ELU (α = 1), not ELU + 1: L2 normalisation, not a
positive feature map, is what keeps the sums bounded.

Choices stated explicitly:
- ``key_norm="column"`` (default) is the paper's ρ_col. The official code (LinRec's
  ``MultiHeadAttention``, also bundled with RecGRELA) normalises K over ``dim=2`` of its (B, H, d, L)
  key layout, which is each *position's* key over its features; ``key_norm="row"`` reproduces that.
  The 1/√d_head factor is the official code's.
- Padding: padded keys and values are zeroed before the sums (and before the column norms). The
  official code sums over pads too; here pads carry no information, so the causal and non-causal
  forms agree exactly at the newest position.
- ``causal=False`` (default) is the paper's bidirectional form, trained with the ``last`` objective
  (RecBole's prefix CE, the only way it cannot see its target). ``causal=True`` restricts every sum to
  s ≤ t and trains with ``causal`` (all positions at once), via
  ``kernels.causal_linear_attention(normalize=False)``.
- Making the column norm causal: the norm of key column j is taken over the prefix, n_tj =
  sqrt(Σ_{s≤t} k_sj² + eps). Because it depends on the query time t and the feature j only, it moves
  onto the query: Σ_{s≤t} Σ_j q̂_tj (k_sj / n_tj) v_s = Σ_{s≤t} (q̂_t / n_t)·k_s v_s, so the kernel's
  plain prefix sum with q̂_t / n_t is exact. It keeps the paper's normalisation at every step instead
  of switching to per-row keys. What holds exactly is per mixer: given the same inputs, the causal
  mixer's output at t = L - 1 equals the non-causal one. For the whole model that carries over only
  with ``num_layers = 1``. From the second layer on, the keys and values at earlier positions are
  the first layer's outputs there, which differ between the two forms (a causal position sees only
  its prefix). So a 2-layer model trained causally is a close relative of the paper's model, not
  the same function: with shared weights its ranked hidden state (entries of order 1) differs by up to about
  1e-3 on real ml-100k windows, against below 1e-6 with one layer.
- ``feature_map="elu"`` is LinRec as the Cotten4Rec paper describes its baseline: φ = ELU + 1 on
  Q and K, ``O = φ(Q) (φ(K)ᵀ V)``, with no L2 normalisation, no denominator and no 1/√d_head (its
  formula has none). ``key_norm`` then has no effect. ``feature_map="l2"`` (default) is LinRec's own paper.
- ``cloze=True`` puts the mixer inside BERT4Rec, Cotten4Rec's setting for that baseline: a mask token
  (id ``num_items + 1``), BERT's prediction transform ``LN(GELU(W h + b))`` before the tied output,
  training with ``cloze`` (or ``last``) and ranking through an appended mask token, as ``models/bert4rec.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from models.base import ACTIVATIONS, ModelConfig, SeqRecModel, heads, init_weights, one_of, positive, probability
from models.blocks import ItemEmbedding, TransformerBlock, TransformerEncoder, next_item_query
from models.mixers import LinearAttentionMixer, row_l2, zero_padding
from models.registry import register

KEY_NORMS = ("column", "row")
FEATURE_MAPS = ("l2", "elu")
NORM_EPS = 1e-6


class LinRecAttention(LinearAttentionMixer):
    """ELU + L2-normalised linear attention (or ELU + 1 without norms), bidirectional or causal (prefix sums)."""

    def __init__(self, hidden_size: int, num_heads: int, causal: bool, key_norm: str = "column",
                 feature_map: str = "l2"):
        super().__init__(hidden_size, num_heads, causal)
        self.key_norm = key_norm
        self.feature_map = feature_map

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        if self.feature_map == "elu":
            q, k, v = F.elu(q) + 1.0, zero_padding(F.elu(k) + 1.0, valid), zero_padding(v, valid)
            if self.causal:
                return kernels.causal_linear_attention(q, k, v, normalize=False)
            return q @ (k.transpose(-1, -2) @ v)
        scale = q.shape[-1] ** -0.5
        q = row_l2(F.elu(q), NORM_EPS)
        k, v = zero_padding(F.elu(k), valid), zero_padding(v, valid)
        if self.key_norm == "row":
            k = row_l2(k, NORM_EPS)  # a zeroed padding row stays zero
        elif self.causal:
            q = q * torch.rsqrt(k.pow(2).cumsum(dim=2) + NORM_EPS)  # prefix column norm, moved onto q
        else:
            k = k * torch.rsqrt(k.pow(2).sum(dim=2, keepdim=True) + NORM_EPS)
        if self.causal:
            mixed = kernels.causal_linear_attention(q, k, v, normalize=False)
        else:
            mixed = q @ (k.transpose(-1, -2) @ v)
        return mixed * scale


@dataclass
class LinRecConfig(ModelConfig):
    hidden_size: int = 128
    num_layers: int = positive(2)
    num_heads: int = heads(8)
    inner_size: int = positive(256)
    dropout: float = probability(0.2)
    activation: str = one_of("gelu", ACTIVATIONS)
    key_norm: str = one_of("column", KEY_NORMS)
    causal: bool = False
    feature_map: str = one_of("l2", FEATURE_MAPS)
    cloze: bool = False
    ffn_inner_dropout: bool = False  # True: dropout between the FFN linears too (the zoo's first form, not RecBole's)

    def constraint_errors(self) -> list[tuple[str, str]]:
        errors = super().constraint_errors()
        if self.cloze and self.causal:  # a rule between two fields, so not field metadata
            errors.append(("cloze", "the BERT4Rec (cloze) form is bidirectional; it cannot be combined with causal"))
        return errors


@register("linrec")
class LinRec(SeqRecModel):
    config_class = LinRecConfig
    # The class lists every objective some configuration supports; each instance narrows it by `causal`.
    objectives = ("causal", "last", "cloze", "bce")
    default_objective = "last"

    def __init__(self, config: LinRecConfig):
        super().__init__(config)
        c = config
        self.narrow_objectives(c.causal, otherwise=("cloze", "last") if c.cloze else ("last",))
        self.embedding = ItemEmbedding(c.num_items, c.max_len, c.hidden_size, c.dropout, extra_tokens=int(c.cloze))
        self.encoder = TransformerEncoder([
            TransformerBlock(LinRecAttention(c.hidden_size, c.num_heads, c.causal, c.key_norm, c.feature_map),
                             c.hidden_size, c.inner_size, c.dropout, c.activation,
                             ffn_inner_dropout=c.ffn_inner_dropout)
            for _ in range(c.num_layers)
        ])
        # BERT4Rec's prediction transform, only in the cloze (BERT4Rec-backbone) form
        self.head = (nn.Sequential(nn.Linear(c.hidden_size, c.hidden_size), nn.GELU(),
                                   nn.LayerNorm(c.hidden_size, eps=1e-12)) if c.cloze else nn.Identity())
        self.apply(init_weights)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        valid = items > 0
        return self.head(self.encoder(self.embedding(items), valid))

    def last_hidden(self, items: torch.Tensor) -> torch.Tensor:
        if not self.config.cloze:
            return super().last_hidden(items)
        # as BERT4Rec: ask for the next item through the mask token at the newest position
        return self.forward(next_item_query(items, self.mask_token, self.config.max_len))[:, -1]

    def item_weights(self) -> torch.Tensor:
        return self.embedding.items.weight[: self.config.num_items + 1]  # the mask token is never ranked
