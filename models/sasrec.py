"""SASRec (Kang & McAuley, ICDM 2018), the causal softmax-attention baseline of every seed paper.

Defaults follow RecBole 1.2's ``SASRec.yaml``: d = 64, 2 layers, 2 heads, inner size 256, GELU,
hidden and attention dropout 0.5, LayerNorm eps 1e-12, N(0, 0.02) init, and RecBole's window of the last 50
items (``MAX_ITEM_LIST_LENGTH``), not the paper's 200 (its ML-1M setting; 50 on its sparser datasets). An epoch at
50 is several times cheaper than at 200, and under a short time budget on a CPU the first epochs are what the
budget buys, so the shorter window reaches the better validation score there
(``python -m benchmarks.defaults_search`` searches the defaults on validation). A study searches or sets ``max_len``.

Choices stated explicitly because the papers differ on them:
- LayerNorm placement: **post-LN**, as in RecBole (``x = LN(x + drop(attn(x)))``), plus a LayerNorm
  and dropout on the summed item + position embedding. The original TensorFlow SASRec is pre-LN;
  set ``norm_first=True`` for it.
- The output head is tied to the item embedding.
- Trained by default with the ``causal`` objective (next-item CE over all items at every position),
  which is what the SASRec paper's all-position training does with a softmax instead of BCE; the
  ``bce`` objective reproduces the original one-negative loss, ``last`` RecBole's prefix samples.
- The learning rate: the paper's Adam at a constant 1e-3 wherever the trainer's windows are each user's newest one
  or the objective is not ``causal``. On windows over the whole history (the trainer's default for SASRec) an
  epoch makes fewer steps of more targets each, and the default there is a longer step that starts small: 6e-3,
  warmed up linearly over the first 110 steps (two epochs on ml-100k), halved after every 3 epochs without a
  validation gain (``history_schedule``). The warm-up is counted in steps, so on a dataset with fewer windows an
  epoch it lasts more epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.base import (
    ACTIVATIONS,
    ModelConfig,
    SeqRecModel,
    TrainingSchedule,
    heads,
    init_weights,
    one_of,
    positive,
    probability,
)
from models.blocks import ATTENTION_BACKENDS, ItemEmbedding, SoftmaxAttention, TransformerBlock, TransformerEncoder
from models.registry import register


@dataclass
class SASRecConfig(ModelConfig):
    num_layers: int = positive(2)
    num_heads: int = heads(2)
    inner_size: int = 256
    dropout: float = probability(0.5)
    attn_dropout: float = probability(0.5)
    activation: str = one_of("gelu", ACTIVATIONS)
    norm_first: bool = False
    attention_backend: str = one_of("sdpa", ATTENTION_BACKENDS)
    ffn_inner_dropout: bool = False  # True: dropout between the FFN linears too (the zoo's first form, not RecBole's)


@register("sasrec")
class SASRec(SeqRecModel):
    config_class = SASRecConfig
    objectives = ("causal", "last", "bce")
    default_objective = "causal"
    whole_history_windows = True  # chosen on validation by benchmarks/defaults_search.py
    # the learning rate on those windows (module docstring), chosen the same way
    history_schedule = TrainingSchedule(lr=6e-3, lr_warmup_steps=110, lr_decay_patience=3)

    def __init__(self, config: SASRecConfig):
        super().__init__(config)
        c = config
        self.embedding = ItemEmbedding(c.num_items, c.max_len, c.hidden_size, c.dropout)
        self.encoder = TransformerEncoder([
            TransformerBlock(
                SoftmaxAttention(c.hidden_size, c.num_heads, c.attn_dropout, causal=True, backend=c.attention_backend),
                c.hidden_size, c.inner_size, c.dropout, c.activation, c.norm_first,
                ffn_inner_dropout=c.ffn_inner_dropout,
            )
            for _ in range(c.num_layers)
        ], final_norm=torch.nn.LayerNorm(c.hidden_size, eps=1e-12) if c.norm_first else None)
        self.apply(init_weights)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        valid = items > 0
        return self.encoder(self.embedding(items), valid)

    def item_weights(self) -> torch.Tensor:
        return self.embedding.items.weight
