"""The training step's learning-rate warm-up, on synthetic windows sized like LastFM's (no ``../shared`` needed)."""

from __future__ import annotations

import pytest
import torch

import models
from models.registry import ConfigError
from study.train.config import TrainConfig, split_settings
from study.train.step import TrainStep
from study.train.trainer import TrialData, run_trial

LR, WARMUP = 0.01, 4


@pytest.fixture(scope="module")
def windows(synthetic_lastfm_prepared) -> torch.Tensor:
    return torch.as_tensor(TrialData.from_prepared(synthetic_lastfm_prepared, max_len=20).train[:64], dtype=torch.long)


def fresh_step(num_items: int, **settings) -> TrainStep:
    """A small SASRec without dropout, the same weights every call, so two steps differ only by their settings."""
    torch.manual_seed(0)
    model = models.build("sasrec", num_items=num_items, max_len=20, hidden_size=16, num_layers=1, dropout=0.0,
                         attn_dropout=0.0)
    return TrainStep(model, TrainConfig(lr=LR, **{"lr_warmup_steps": 0, "lr_decay_patience": 0, **settings}))


def weights(step: TrainStep) -> list[torch.Tensor]:
    return [p.detach().clone() for p in step.model.parameters()]


def test_each_warm_up_step_takes_its_fraction_of_the_rate_in_force(windows):
    num_items = int(windows.max())
    warm, by_hand = fresh_step(num_items, lr_warmup_steps=WARMUP), fresh_step(num_items)
    for n in range(1, WARMUP + 3):
        by_hand.optimizer.param_groups[0]["lr"] = LR * min(1.0, n / WARMUP)  # the rule, set by hand
        warm(windows), by_hand(windows)
        assert all(torch.equal(a, b) for a, b in zip(weights(warm), weights(by_hand), strict=True)), f"step {n}"
        # the fraction is never written into the rate that a decay scales and a training state saves
        assert warm.optimizer.param_groups[0]["lr"] == LR
    # and it matters: Adam's first update is about the rate a weight, so the warm-up's first moves a quarter as far
    first_warm, first_full = fresh_step(num_items, lr_warmup_steps=WARMUP), fresh_step(num_items)
    before = weights(first_warm)[0]
    first_warm(windows), first_full(windows)
    moved = [(weights(step)[0] - before).abs().max().item() for step in (first_warm, first_full)]
    assert moved == pytest.approx([LR / WARMUP, LR], rel=1e-3)


def test_a_resumed_step_warms_up_where_its_state_stopped(windows):
    num_items = int(windows.max())
    straight = fresh_step(num_items, lr_warmup_steps=WARMUP)
    for _ in range(WARMUP + 1):
        straight(windows)
    stopped = fresh_step(num_items, lr_warmup_steps=WARMUP)
    for _ in range(2):
        stopped(windows)
    resumed = fresh_step(num_items, lr_warmup_steps=WARMUP)  # a new process: fresh weights, its state loaded
    resumed.model.load_state_dict(stopped.model.state_dict())
    resumed.optimizer.load_state_dict(stopped.optimizer.state_dict())
    for _ in range(WARMUP - 1):
        resumed(windows)
    assert all(torch.equal(a, b) for a, b in zip(weights(straight), weights(resumed), strict=True))


def test_the_row_records_the_warm_up_and_a_negative_one_is_refused(synthetic_lastfm_prepared):
    data = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=20)
    row = run_trial("sasrec", data, {"max_epochs": 1, "batch_size": 256, "measure_efficiency": False,
                                     "num_threads": 1, "max_len": 20, "window_step": 0, "lr_warmup_steps": 3})
    assert row["config"]["lr_warmup_steps"] == 3
    with pytest.raises(ConfigError, match="lr_warmup_steps: must be >= 0"):
        split_settings("sasrec", {"lr_warmup_steps": -1})
