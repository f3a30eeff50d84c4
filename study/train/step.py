"""The one training step: forward, loss, finiteness check, backward, gradient clipping, Adam at a warmed-up rate.

The trainer's loop, the peak-memory probe (:mod:`study.train.efficiency`) and the scaling study's cells all call
:class:`TrainStep`, so the step whose memory and time are measured is the step that trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import numpy as np
import torch

import models
from models import ConfigError, SeqRecModel
from study.train.config import PRECISIONS, TrainConfig, asks_for_cuda_graphs, cuda_graph_conflict
from study.train.objectives import NegativeSampler, objective_loss, resolve_auto_settings, resolve_objective
from study.train.padding import trims_padding


class NonFiniteLoss(FloatingPointError):
    """A training loss that is NaN or infinite: the trial cannot go on."""


class TrainStep:
    """One optimisation step of ``model`` under ``train`` (objective, lr and its warm-up, Adam's β₂, weight decay,
    grad clip, mask rate).

    Calling it with a (B, L + 1) batch of windows returns the step's loss as a detached tensor; the caller decides
    when to synchronise with ``.item()`` (once per step in the trainer, never inside the timed scaling cells).

    Two settings of ``train`` change the arithmetic, hence the results, so both are off by default:
    - ``precision``: ``bf16``/``fp16`` run the forward pass and the loss under CUDA autocast (fp16 with a gradient
      scaler); on a CPU model they are ignored and the step stays fp32 (CPU autocast is slower than fp32 on the
      machines this study runs on, and bf16 matmuls there lose accuracy for nothing);
    - ``compile``: ``torch.compile`` the step's loss: the network, the scores and the cross-entropy. The model
      object is left as it is, so the state_dict keys stay the same, and evaluation runs eager. Inductor draws
      its own dropout random numbers, so a compiled run is not the eager run's twin; on a CPU its first step
      compiles for minutes (``python -m benchmarks.speed --compile`` measures it). ``compile_mode`` is
      torch.compile's mode; under ``reduce-overhead`` on CUDA the loss's forward and backward replay as CUDA
      graphs, whose outputs live in memory the next replay overwrites, so the step hands back a copy of its loss.
      Only the ``last`` objective may use a CUDA-graph mode (causal CE and cloze crashed it:
      :func:`~study.train.config.cuda_graph_conflict`).
    """

    def __init__(self, model: SeqRecModel, train: TrainConfig, item_popularity: np.ndarray | None = None) -> None:
        """``item_popularity`` (num_items + 1 training counts) is read only by ``sampled_ce`` with the popularity
        sampler, which refuses to run without it."""
        if train.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {train.precision!r}")
        self.model = model
        device = next(model.parameters()).device
        self.objective = resolve_objective(model, train.objective)
        conflict = cuda_graph_conflict(train, self.objective)
        if conflict:
            raise ConfigError([("compile_mode", conflict)])
        # the settings this step runs with, `auto` ones resolved (the trainer records these)
        self.train = dataclasses.replace(
            resolve_auto_settings(train, self.objective, model.config.max_len, model.name),
            trim_padding=trims_padding(train.trim_padding, device, train.compile))
        self.optimizer = torch.optim.Adam(model.parameters(), lr=self.train.lr, betas=(0.9, train.adam_beta2),
                                          weight_decay=train.weight_decay)
        # the cloze mask and the negatives draw from their own generator, so batches do not shift the model's RNG
        self.generator = torch.Generator().manual_seed(train.seed)
        self.item_popularity = item_popularity
        self.sampler = None
        if self.objective == "sampled_ce":
            self.sampler = NegativeSampler(model.config.num_items, train.train_negatives,
                                           train.train_negative_sampler, item_popularity)
        on_cuda = next(model.parameters()).is_cuda
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(train.precision) if on_cuda else None
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range and needs none
        self.scaler = torch.amp.GradScaler("cuda") if self.autocast_dtype is torch.float16 else None
        # The loss is compiled, not nn.Module.forward: `last` reaches the network through last_hidden (ELASTIC's
        # through encode), which bypasses a compiled forward, so its steps would stay eager.
        self.loss = objective_loss
        if train.compile:
            mode = None if train.compile_mode == "default" else train.compile_mode
            self.loss = torch.compile(objective_loss, mode=mode)
        self.cuda_graphs = asks_for_cuda_graphs(train) and on_cuda

    def __call__(self, windows: torch.Tensor, *, check_finite: bool = False, users: torch.Tensor | None = None,
                 scored: torch.Tensor | None = None) -> torch.Tensor:
        """``users``: each window's user, for the models that read one; ``scored``: how many newest targets of each
        window carry the loss (whole-history windows with ``window_targets`` in ``SCORED_ONCE``), None for all."""
        self.optimizer.zero_grad(set_to_none=True)
        mixed = self.autocast_dtype is not None
        if self.cuda_graphs:  # a new step: the previous step's graph outputs may be overwritten from here on
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=self.autocast_dtype) if mixed else contextlib.nullcontext():
            loss = self.loss(self.objective, self.model, windows, mask_prob=self.train.mask_prob,
                             generator=self.generator, users=users, sampler=self.sampler,
                             trim=self.train.trim_padding, scored=scored)
        if check_finite and not torch.isfinite(loss):
            raise NonFiniteLoss(f"non-finite training loss {loss.item()}")
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
        if self.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train.grad_clip)
        with _scaled_lr(self.optimizer, self._warmup_scale()):
            if self.scaler is None:
                self.optimizer.step()
            else:
                self.scaler.step(self.optimizer)
                self.scaler.update()
        loss = loss.detach().float()
        return loss.clone() if self.cuda_graphs else loss

    def _warmup_scale(self) -> float:
        """The fraction of the rate in force that this step takes under ``lr_warmup_steps`` (1 after the warm-up).
        The steps taken are Adam's own count, which a training state carries, so a resumed trial warms up where it
        stopped; a step that fp16's scaler skips is not counted."""
        warmup = self.train.lr_warmup_steps
        if not warmup:
            return 1.0
        taken = max((int(state["step"]) for state in self.optimizer.state.values() if "step" in state), default=0)
        return min(1.0, (taken + 1) / warmup)


@contextlib.contextmanager
def _scaled_lr(optimizer: torch.optim.Optimizer, scale: float) -> Iterator[None]:
    """The optimizer's rates times ``scale`` inside the block, the rates in force again after: the warm-up never
    writes its fraction into the rate that a plateau decay scales and a training state saves."""
    if scale == 1.0:
        yield
        return
    in_force = [group["lr"] for group in optimizer.param_groups]
    for group, lr in zip(optimizer.param_groups, in_force, strict=True):
        group["lr"] = lr * scale
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, in_force, strict=True):
            group["lr"] = lr


def build_step(model_name: str, model_hparams: dict, train_settings: dict, device: torch.device) -> TrainStep:
    """A :class:`TrainStep` over a freshly built registry model (the memory probe and the scaling cells).

    These steps are measured, never trained to a result, and have no dataset: a popularity sampler gets flat
    counts, which draw through the same ``torch.multinomial`` call at the same cost as real ones.
    """
    train = TrainConfig(**train_settings)
    model = models.build(model_name, **model_hparams).to(device)
    flat_counts = np.ones(model.config.num_items + 1) if train.train_negative_sampler == "popularity" else None
    return TrainStep(model, train, item_popularity=flat_counts)
