"""BERT4Rec (Sun et al., CIKM 2019): a bidirectional softmax encoder trained as a cloze task.

Defaults are the paper's: d = 64, 2 layers, 2 heads, FFN 4·d = 256 with GELU, dropout 0.1 on hidden
states and attention, max length 200 (ML-1M/ML-20M; the paper uses 50 for Beauty and Steam), learned
absolute positions, N(0, 0.02) init, LayerNorm eps 1e-12, post-LN blocks (BERT's layout). The mask
probability is a trainer key (``mask_prob``): 0.2 for MovieLens, 0.6 for Beauty in the paper.

Choices stated explicitly:
- Output head: BERT's prediction transform ``LN(GELU(W h + b))``, then a dot product with the tied
  item embedding plus a per-item output bias, the paper's ``softmax(GELU(h W^P + b^P) E^T + b^O)`` (RecBole 1.2
  has the bias too). The bias joins the house scoring contract ``hidden @ item_weights().T`` as one more
  column: the hidden state ends in a constant 1 and each item's weight row in its bias, so every objective, the
  evaluator and the exports score ``h·e_i + b_i`` without knowing of it. ``output_bias: false`` leaves it out,
  as the head did before the key existed; a study that compares with runs recorded then pins it.
- The mask token is id ``num_items + 1`` (one extra embedding row); :meth:`item_weights` drops it so it
  is never ranked.
- Next-item prediction appends the mask token: the window is shifted left by one and the mask sits at
  position L-1, the position the cloze objective trains most often to fill with the newest item. A window
  narrower than ``max_len`` (leading padding trimmed) keeps its oldest column: positions count from the
  newest item (``models.blocks.ItemEmbedding``), so the result is that of the full window.
- Cloze samples. The paper masks a random ``mask_prob`` share of each training sequence (at least one item
  here: the newest one when the draw masks none) and, in §3.6, "also" adds samples that mask only the last item,
  without saying how many. Its code builds ``dupe_factor`` = 10 randomly masked copies of every sequence and
  trains 400k steps of 256 at lr 1e-4 (Beauty); the text gives neither. Here one epoch is one pass over the
  users' windows; ``cloze_copies`` (default 1) masks each window that many times per step, and
  ``cloze_last_item_samples`` (default off) adds one sample per window whose only mask is its newest item: the
  next-item query that evaluation asks. Both are BERT4Rec config keys, so they are recorded with the model's
  settings in every result row (``config``). Which windows an epoch holds is a trainer key,
  ``window_step``: by default the reference code's windows over each user's whole training history, their
  starts 0.1 · max_len items apart (its ``prop_sliding_window`` 0.1), which the paper's "training sequences" are in
  that code; 0 keeps each user's newest window only (what data-parallel and streamed studies hold). The newest
  window holds 40 % of ml-100k's training items and half of LastFM's; the whole-history windows hold all of them,
  and since they overlap an epoch masks several times the targets. A study that trains on the newest windows says
  so in its file (``window_step: 0``). The §3.6 samples stay off by default because on a small dataset
  (ml-100k) they cost test accuracy, and a higher mask probability wins back only part of it
  (``experiments/validation-grid/`` compares such cells on validation).
- Budget. A cloze epoch supervises only the masked ~``mask_prob`` share of its windows' items, where causal CE
  supervises every position: at the same number of epochs BERT4Rec has seen several
  times fewer targets, and at ~15 epochs it stays near the popularity baseline. Train it with a large epoch
  budget and early stopping on validation NDCG@10 (``experiments/validation-grid/`` measures the epochs): its
  best validation epoch comes several times later than SASRec's, later still on the newest windows only, so the
  reproduction studies give it a patience of 50 epochs and at most 500.
- Objectives: ``cloze`` (default) and ``last`` (RecBole-style prefix CE, read through the same mask
  token). ``causal`` and ``bce`` train on every position at once and would leak future items through
  the bidirectional attention, so they are refused.

Cotten4Rec (``models/cotten4rec.py``) reuses this backbone and swaps the token mixer through
:meth:`BERT4Rec.make_mixer`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.base import ACTIVATIONS, ModelConfig, SeqRecModel, heads, init_weights, one_of, positive, probability
from models.blocks import (
    ATTENTION_BACKENDS,
    ItemEmbedding,
    SoftmaxAttention,
    TokenMixer,
    TransformerBlock,
    TransformerEncoder,
    next_item_query,
)
from models.registry import register


@dataclass
class BERT4RecConfig(ModelConfig):
    num_layers: int = positive(2)
    num_heads: int = heads(2)
    inner_size: int = positive(256)
    dropout: float = probability(0.1)
    attn_dropout: float = probability(0.1)
    activation: str = one_of("gelu", ACTIVATIONS)
    attention_backend: str = one_of("sdpa", ATTENTION_BACKENDS)
    ffn_inner_dropout: bool = False  # True: dropout between the FFN linears too (the zoo's first form, not RecBole's)
    # cloze samples per training window and step (the reference code's dupe_factor); see the module docstring
    cloze_copies: int = positive(1)
    cloze_last_item_samples: bool = False  # one more sample per window that masks only its newest item (§3.6)
    output_bias: bool = True  # the paper's per-item output bias b^O (see "Output head" above)



@register("bert4rec")
class BERT4Rec(SeqRecModel):
    config_class = BERT4RecConfig
    objectives = ("cloze", "last")
    default_objective = "cloze"
    uses_mask_token = True

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        c = config
        self.embedding = ItemEmbedding(c.num_items, c.max_len, c.hidden_size, c.dropout, extra_tokens=1)
        self.encoder = TransformerEncoder([
            TransformerBlock(self.make_mixer(c), c.hidden_size, c.inner_size, c.dropout, c.activation,
                             ffn_inner_dropout=c.ffn_inner_dropout)
            for _ in range(c.num_layers)
        ])
        self.head = nn.Sequential(nn.Linear(c.hidden_size, c.hidden_size), nn.GELU(),
                                  nn.LayerNorm(c.hidden_size, eps=1e-12))
        self.apply(init_weights)
        # zero at the start, as BERT's and RecBole's; Cotten4Rec, which reuses this class with a config that has no
        # such key, keeps the head without it
        self.output_bias = nn.Parameter(torch.zeros(c.num_items + 1)) if getattr(c, "output_bias", False) else None

    def make_mixer(self, config: ModelConfig) -> TokenMixer:
        """The token mixer of one block; subclasses (Cotten4Rec) replace the softmax attention here."""
        return SoftmaxAttention(config.hidden_size, config.num_heads, config.attn_dropout, causal=False,
                                backend=config.attention_backend)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        valid = items > 0
        hidden = self.head(self.encoder(self.embedding(items), valid))
        if self.output_bias is None:
            return hidden
        return torch.cat([hidden, hidden.new_ones(*hidden.shape[:-1], 1)], dim=-1)  # the bias's column: see above

    def last_hidden(self, items: torch.Tensor) -> torch.Tensor:
        return self.forward(next_item_query(items, self.mask_token, self.config.max_len))[:, -1]

    def item_weights(self) -> torch.Tensor:
        weights = self.embedding.items.weight[: self.config.num_items + 1]
        if self.output_bias is None:
            return weights
        return torch.cat([weights, self.output_bias[:, None]], dim=1)
