"""What an epoch will cost, said before the first one starts: windows, steps, tokens, and one measured step.

The estimate times real training steps of a throw-away copy of the model on one of the epoch's batches, with the
global RNG state saved and restored, so measuring never changes what the trial then learns. With
``trim_padding`` a batch computes only the columns from its longest real window on (:mod:`study.train.padding`):
the line then says how many positions that leaves, and times a full-size batch of median trimmed width.
"""

from __future__ import annotations

import copy
import dataclasses
import textwrap
import time
from dataclasses import dataclass

import numpy as np
import torch

from study.train.batches import batch_user_ids, epoch_windows, user_batches
from study.train.config import TrainConfig
from study.train.metrics import evaluate
from study.train.objectives import cloze_samples_per_window, computed_positions
from study.train.step import TrainStep
from study.train.trial_data import TrialData

PADDING_HINT = 0.5  # above this share of padded positions, the line suggests a shorter max_len


@dataclass
class EpochCost:
    windows: int  # training windows (sequences) per epoch
    steps: int
    tokens: int  # input positions processed, padding included
    real_tokens: int  # input positions that hold an item
    computed_tokens: int  # input positions the model computes: ``tokens`` less the trimmed padding columns
    step_s: float  # mean time of one step over measured real batches spread across the epoch's widths
    max_len: int
    median_length: float  # the dataset's median sequence length
    overhead_s: float = 0.0  # the rest of an epoch: drawing its windows, and the validation pass

    def scaled(self, factor: float) -> EpochCost:
        """The cost of an epoch ``factor`` times as large (an estimate from a sample of the windows)."""
        counts = ("windows", "steps", "tokens", "real_tokens", "computed_tokens")
        return dataclasses.replace(self, **{name: round(getattr(self, name) * factor) for name in counts})

    @property
    def epoch_s(self) -> float:
        return self.steps * self.step_s + self.overhead_s

    @property
    def padding(self) -> float:
        return 1.0 - self.real_tokens / self.tokens if self.tokens else 0.0

    @property
    def computed_padding(self) -> float:
        return 1.0 - self.real_tokens / self.computed_tokens if self.computed_tokens else 0.0

    def line(self, max_epochs: int) -> str:
        """The estimate for a person, wrapped to lines of at most 120 characters."""
        trimmed = ""
        if self.computed_tokens < self.tokens:
            trimmed = f", {_si(self.computed_tokens)} computed after trimming ({self.computed_padding:.0%} padding)"
        parts = [f"cost estimate: {self.windows:,} windows/epoch in {self.steps:,} steps, {_si(self.tokens)} tokens "
                 f"({self.padding:.0%} padding){trimmed};",
                 f"one step {self.step_s * 1e3:.0f} ms, loader and validation {_duration(self.overhead_s)} -> "
                 f"~{_duration(self.epoch_s)}/epoch, at most "
                 f"~{_duration(self.epoch_s * max_epochs)} for {max_epochs} epochs"]
        if self.computed_padding > PADDING_HINT:
            parts[-1] += ";"
            parts.append(f"most positions are padding: max_len {self.max_len} vs a median length of "
                         f"{self.median_length:g}")
        return textwrap.fill(" ".join(parts), width=120, subsequent_indent="  ", break_on_hyphens=False)


def estimate_epoch(step: TrainStep, batches: list[tuple[np.ndarray, torch.Tensor | None]], device: torch.device,
                   median_length: float, repeats: int = 5, overhead_s: float = 0.0) -> EpochCost:
    """Cost of one epoch made of ``batches`` ((B, L + 1) windows and their user ids), timing a copy of the model.

    The step is timed on ``repeats`` real full-size batches at evenly spaced quantiles of their trimmed width (their
    mean, so that the wide and narrow batches of a trimmed epoch weigh as they do in it), after one warm-up step.
    """
    windows = sum(len(batch) for batch, _ in batches)
    tokens = sum(batch[:, :-1].size for batch, _ in batches)
    real = sum(int(np.count_nonzero(batch[:, :-1])) for batch, _ in batches)
    samples = cloze_samples_per_window(step.model.config)
    computed = [computed_positions(step.objective, batch, step.train.trim_padding, samples) for batch, _ in batches]
    full_size = max(len(batch) for batch, _ in batches)
    by_cost = sorted((cost, index) for index, (cost, (batch, _)) in enumerate(zip(computed, batches))
                     if len(batch) == full_size)
    picks = sorted({by_cost[round(q * (len(by_cost) - 1) / max(1, repeats - 1))][1] for q in range(repeats)})
    largest = batches[by_cost[-1][1]][0]
    cpu_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    try:
        trial = TrainStep(copy.deepcopy(step.model), step.train, step.item_popularity)
        warm, warm_users = batches[by_cost[len(by_cost) // 2][1]]
        trial(torch.as_tensor(warm, dtype=torch.long, device=device), users=warm_users)  # allocator, kernels, lazy init
        timings = []
        for index in picks:
            measured, users = batches[index]
            batch = torch.as_tensor(measured, dtype=torch.long, device=device)
            begin = time.perf_counter()
            trial(batch, users=users).item()  # .item() waits for the device
            timings.append(time.perf_counter() - begin)
    finally:
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
    return EpochCost(windows=windows, steps=len(batches), tokens=tokens, real_tokens=real,
                     computed_tokens=sum(computed), step_s=float(np.mean(timings)), max_len=largest.shape[1] - 1,
                     median_length=median_length, overhead_s=overhead_s)


def epoch_cost(step: TrainStep, data: TrialData, train_cfg: TrainConfig, device: torch.device) -> EpochCost:
    """The cost of one epoch of this trial, as the trainer runs it: the data loader drawing the epoch's windows,
    the training steps, and the validation pass over every user (its batches drawn with a separate generator:
    training is unchanged)."""
    rng = np.random.default_rng(train_cfg.seed)
    started = time.perf_counter()
    batches = [(windows, batch_user_ids(step.model, users, device)) for windows, users, _ in
               epoch_windows(data, user_batches(data.train, train_cfg.batch_size, rng), step.objective, train_cfg, rng)]
    loader_s = time.perf_counter() - started
    started = time.perf_counter()
    with torch.no_grad():
        evaluate(step.model, data.valid, batch_size=train_cfg.eval_batch_size, device=device,
                 mask_history=train_cfg.mask_history, trim=train_cfg.trim_padding)
    validation_s = time.perf_counter() - started
    return estimate_epoch(step, batches, device, float(data.meta.get("length", {}).get("median", float("nan"))),
                          overhead_s=loader_s + validation_s)



def _si(count: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:.0f}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
