"""FPMC (Rendle, Freudenthaler & Schmidt-Thieme, WWW 2010): factorised personalised Markov chains.

The score of item i for user u whose last item is l is matrix factorisation plus a factorised first-order
Markov chain (the paper's equation for a basket of one item, which is how sequential recommenders apply it):

    x(u, l, i) = <V_u^{U,I}, V_i^{I,U}> + <V_i^{I,L}, V_l^{L,I}>

To fit the house contract (scores = hidden @ item_weights().T) the hidden state at position t is the
concatenation [V_u^{U,I}, V_{item_t}^{L,I}] and the item weights are [V^{I,U}, V^{I,L}], both of width 2d;
their product is exactly the sum above. ``hidden_size`` is d, the width of each of the four factor tables.

Choices the paper leaves open, or that differ from it:
- The user id is an input: the model sets ``needs_users``, and the trainer, the objectives, the evaluator and the
  efficiency probes pass ``users`` (B,) with every batch. ``num_users`` is sized from the dataset by the trainer.
  Called without ``users`` (the scaling study's cells, which time windows, not users) the model scores with the
  Markov-chain term alone, i.e. the paper's non-personalised FMC; the user term costs one (B, d) lookup whatever
  the window length, so cost figures are unchanged.
- Loss: the paper's S-BPR is replaced by the house objectives; the default ``causal`` is softmax CE over all items
  for every transition of a user's window (``bce`` is the closest to S-BPR: one sampled negative per transition).
  The windows cover each user's whole history (``window_step``: ``max_len`` / 5 apart, each training transition a
  target once an epoch), as the paper trains on every transition, rather than only each user's newest window.
  On those windows it trains with SASRec's learning-rate schedule (``history_schedule``: 6e-3, warmed up linearly
  over the first 110 steps, halved after every 3 epochs without a validation gain), where the paper and RecBole use
  a constant rate (RecBole's 1e-3, which FPMC keeps on the newest window and under ``last`` and ``bce``).
- Init: Xavier-normal factor tables, as RecBole's FPMC (the paper draws from N(0, 0.01)); no regularisation
  beyond the trainer's weight decay. d = 64 is RecBole's default.
- No dropout: FPMC has none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.base import ModelConfig, SeqRecModel, TrainingSchedule, knob
from models.registry import register


@dataclass
class FPMCConfig(ModelConfig):
    # from the dataset (users are 0..num_users - 1); the trainer sets it, 0 = not set yet
    num_users: int = knob(0, at_least=1, why="the dataset's user count")


@register("fpmc")
class FPMC(SeqRecModel):
    config_class = FPMCConfig
    objectives = ("causal", "last", "bce")
    default_objective = "causal"
    needs_users = True
    whole_history_windows = True  # chosen on validation by benchmarks/defaults_search.py
    # the learning rate on those windows (module docstring), chosen the same way
    history_schedule = TrainingSchedule(lr=6e-3, lr_warmup_steps=110, lr_decay_patience=3)

    def __init__(self, config: FPMCConfig):
        super().__init__(config)
        c = config
        self.user_item = nn.Embedding(c.num_users, c.hidden_size)  # V^{U,I}
        self.item_user = nn.Embedding(c.num_items + 1, c.hidden_size, padding_idx=0)  # V^{I,U}
        self.last_item = nn.Embedding(c.num_items + 1, c.hidden_size, padding_idx=0)  # V^{L,I}
        self.item_last = nn.Embedding(c.num_items + 1, c.hidden_size, padding_idx=0)  # V^{I,L}
        for table in (self.user_item, self.item_user, self.last_item, self.item_last):
            nn.init.xavier_normal_(table.weight)
            if table.padding_idx is not None:
                table.weight.data[table.padding_idx].zero_()

    def forward(self, items: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        """``items`` (B, L), ``users`` (B,) → (B, L, 2d): at each real position, [user factor, that item's factor]."""
        valid = items > 0
        if users is None:  # FMC: no user term (see the module docstring)
            user = items.new_zeros(items.shape[0], 1, self.config.hidden_size, dtype=self.user_item.weight.dtype)
        elif users.shape != items.shape[:1]:
            raise ValueError(f"users must have shape ({items.shape[0]},), got {tuple(users.shape)}")
        else:
            user = self.user_item(users)[:, None, :]
        user = user.expand(-1, items.shape[1], -1)
        return torch.cat([user, self.last_item(items)], dim=-1) * valid.unsqueeze(-1)

    def last_hidden(self, items: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        # FPMC reads only the newest item, so the (B, L, 2d) pass over the whole window is not needed
        return self.forward(items[:, -1:], users)[:, -1]

    def item_weights(self) -> torch.Tensor:
        return torch.cat([self.item_user.weight, self.item_last.weight], dim=-1)
