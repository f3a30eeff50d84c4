"""GRU4Rec (Hidasi et al., ICLR 2016) as RecBole 1.2 implements it: the non-attention baseline.

Defaults are RecBole's ``GRU4Rec.yaml``: item embedding 64, GRU hidden size 128, 1 layer, dropout 0.3
on the embeddings, a linear map from the GRU state back to the embedding width, and scores tied to the
item embedding. Init as RecBole: Xavier-normal embedding, Xavier-uniform GRU weights.

Left padding without leaking the pad count: the GRU has no biases (as in RecBole) and padded inputs
are zeroed, so from a zero initial state every gate sees 0 and the candidate state tanh(0) is 0 — the
state stays exactly 0 through the pads. Outputs at real items are therefore identical to those of the
right-padded RecBole model, whatever the amount of padding.

A recurrent network is causal by construction, so it trains with the ``causal`` objective (next-item
CE at every position, the all-position form of RecBole's prefix CE); ``last`` and ``bce`` work too. By default it
trains on windows over each user's whole history (``window_step``: ``max_len`` / 5 apart, each training item a
target once an epoch), where RecBole trains on every prefix: both score every training item, and an older window
starts its state from zero, as the newest one does at evaluation once a history is longer than ``max_len``.
On those windows it trains with SASRec's learning-rate schedule (``history_schedule``: 6e-3, warmed up linearly
over the first 110 steps, halved after every 3 epochs without a validation gain) where RecBole and the paper use a
constant rate (RecBole's 1e-3, which it keeps on the newest window and under ``last``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.base import ModelConfig, SeqRecModel, TrainingSchedule, positive, probability
from models.registry import register


@dataclass
class GRU4RecConfig(ModelConfig):
    hidden_size: int = 128
    embedding_size: int = positive(64)
    num_layers: int = positive(1)
    dropout: float = probability(0.3)


@register("gru4rec")
class GRU4Rec(SeqRecModel):
    config_class = GRU4RecConfig
    objectives = ("causal", "last", "bce")
    default_objective = "causal"
    whole_history_windows = True  # chosen on validation by benchmarks/defaults_search.py
    # the learning rate on those windows (module docstring), chosen the same way
    history_schedule = TrainingSchedule(lr=6e-3, lr_warmup_steps=110, lr_decay_patience=3)

    def __init__(self, config: GRU4RecConfig):
        super().__init__(config)
        c = config
        self.items = nn.Embedding(c.num_items + 1, c.embedding_size, padding_idx=0)
        self.dropout = nn.Dropout(c.dropout)
        self.gru = nn.GRU(c.embedding_size, c.hidden_size, c.num_layers, bias=False, batch_first=True)
        self.dense = nn.Linear(c.hidden_size, c.embedding_size)
        nn.init.xavier_normal_(self.items.weight)
        for weight in self.gru.parameters():  # bias=False: weight matrices only
            nn.init.xavier_uniform_(weight)
        nn.init.xavier_uniform_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        valid = items > 0
        embedded = self.dropout(self.items(items)) * valid.unsqueeze(-1)
        states, _ = self.gru(embedded)
        return self.dense(states) * valid.unsqueeze(-1)

    def item_weights(self) -> torch.Tensor:
        return self.items.weight
