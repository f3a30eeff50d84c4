"""The one training step: forward, loss, finiteness check, backward, gradient clipping, Adam.

The trainer's loop, the peak-memory probe (:mod:`study.train.efficiency`) and the scaling study's cells all call
:class:`TrainStep`, so the step whose memory and time are measured is the step that trains.
"""

from __future__ import annotations

import numpy as np
import torch

import models
from models import SeqRecModel
from study.train.config import TrainConfig
from study.train.objectives import NegativeSampler, objective_loss, resolve_objective


class NonFiniteLoss(FloatingPointError):
    """A training loss that is NaN or infinite: the trial cannot go on."""


class TrainStep:
    """One optimisation step of ``model`` under ``train`` (objective, lr, weight decay, grad clip, mask rate).

    Calling it with a (B, L + 1) batch of windows returns the step's loss as a detached tensor; the caller decides
    when to synchronise with ``.item()`` (once per step in the trainer, never inside the timed scaling cells).
    """

    def __init__(self, model: SeqRecModel, train: TrainConfig, item_popularity: np.ndarray | None = None) -> None:
        """``item_popularity`` (num_items + 1 training counts) is read only by ``sampled_ce`` with the popularity
        sampler, which refuses to run without it."""
        self.model = model
        self.train = train
        self.objective = resolve_objective(model, train.objective)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
        # the cloze mask and the negatives draw from their own generator, so batches do not shift the model's RNG
        self.generator = torch.Generator().manual_seed(train.seed)
        self.item_popularity = item_popularity
        self.sampler = None
        if self.objective == "sampled_ce":
            self.sampler = NegativeSampler(model.config.num_items, train.train_negatives,
                                           train.train_negative_sampler, item_popularity)

    def __call__(self, windows: torch.Tensor, *, check_finite: bool = False,
                 users: torch.Tensor | None = None) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = objective_loss(self.objective, self.model, windows, mask_prob=self.train.mask_prob,
                              generator=self.generator, users=users, sampler=self.sampler,
                              trim=self.train.trim_padding)
        if check_finite and not torch.isfinite(loss):
            raise NonFiniteLoss(f"non-finite training loss {loss.item()}")
        loss.backward()
        if self.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train.grad_clip)
        self.optimizer.step()
        return loss.detach()


def build_step(model_name: str, model_hparams: dict, train_settings: dict, device: torch.device) -> TrainStep:
    """A :class:`TrainStep` over a freshly built registry model (the memory probe and the scaling cells).

    These steps are measured, never trained to a result, and have no dataset: a popularity sampler gets flat
    counts, which draw through the same ``torch.multinomial`` call at the same cost as real ones.
    """
    train = TrainConfig(**train_settings)
    model = models.build(model_name, **model_hparams).to(device)
    flat_counts = np.ones(model.config.num_items + 1) if train.train_negative_sampler == "popularity" else None
    return TrainStep(model, train, item_popularity=flat_counts)
