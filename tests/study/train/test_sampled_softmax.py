"""The sampled-softmax objective: exactness against full CE, the logQ correction by hand, gradients, a real run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import models
from models import ConfigError
from study.train.config import split_settings
from study.train.objectives import NegativeSampler, objective_loss, resolve_objective, sampled_softmax_ce
from study.train.step import TrainStep
from study.train.trainer import TrialData, run_trial


def _tiny(seed: int = 0, num_items: int = 7, positions: int = 5, dim: int = 4):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(positions, dim, generator=g, dtype=torch.float64)
    weights = torch.randn(num_items + 1, dim, generator=g, dtype=torch.float64)
    positives = torch.randint(1, num_items + 1, (positions,), generator=g)
    return hidden, weights, positives


def test_sampling_every_item_once_uniformly_is_the_full_softmax_ce():
    hidden, weights, positives = _tiny()
    num_items = weights.shape[0] - 1
    every_item = torch.arange(1, num_items + 1)
    uniform = NegativeSampler(num_items, num_items, "uniform").log_probs.double()
    sampled = sampled_softmax_ce(hidden, positives, weights, every_item, uniform)
    logits = hidden @ weights.T
    logits[:, 0] = -math.inf
    assert torch.allclose(sampled, F.cross_entropy(logits, positives), atol=1e-12)


def test_logq_correction_matches_a_hand_computation():
    hidden = torch.tensor([[1.0, 0.0], [0.5, 2.0]], dtype=torch.float64)
    weights = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, -1.0], [0.0, 3.0]], dtype=torch.float64)
    positives = torch.tensor([1, 3])
    negatives = torch.tensor([2, 3, 2])  # shared by both positions; 3 is position 2's own positive
    counts = np.array([0, 5, 1, 2])  # popularity q ∝ count + 1 = (6, 2, 3) / 11
    log_q = NegativeSampler(3, 3, "popularity", counts).log_probs.double()
    assert torch.allclose(log_q[1:].exp(), torch.tensor([6 / 11, 2 / 11, 3 / 11], dtype=torch.float64))

    def score(h, item):
        return float(h @ weights[item]) - math.log([0, 6 / 11, 2 / 11, 3 / 11][item])

    # position 1 (positive 1): candidates 1 | 2, 3, 2
    row1 = [score(hidden[0], 1), score(hidden[0], 2), score(hidden[0], 3), score(hidden[0], 2)]
    # position 2 (positive 3): candidates 3 | 2, (3 masked: it is the positive), 2
    row2 = [score(hidden[1], 3), score(hidden[1], 2), score(hidden[1], 2)]
    expected = np.mean([math.log(sum(math.exp(x) for x in row)) - row[0] for row in (row1, row2)])
    got = sampled_softmax_ce(hidden, positives, weights, negatives, log_q)
    assert got.item() == pytest.approx(expected, abs=1e-6)  # log q is kept in float32
    # without the correction the loss differs: the test would notice a sampler that forgot it
    plain = sampled_softmax_ce(hidden, positives, weights, negatives, torch.zeros_like(log_q))
    assert abs(plain.item() - expected) > 1e-3


def test_samplers_draw_ids_by_their_distribution_and_never_padding():
    generator = torch.Generator().manual_seed(0)
    counts = np.array([1000, 90, 9, 0, 0])  # padding's count must be ignored
    draws = torch.cat([NegativeSampler(4, 512, "popularity", counts).draw(generator, torch.device("cpu"))
                       for _ in range(40)])
    frequency = torch.bincount(draws, minlength=5).double() / len(draws)
    assert frequency[0] == 0
    assert torch.allclose(frequency[1:], torch.tensor([91, 10, 1, 1], dtype=torch.float64) / 103, atol=0.01)
    uniform = NegativeSampler(4, 20_000, "uniform").draw(generator, torch.device("cpu"))
    assert uniform.min() == 1 and uniform.max() == 4
    with pytest.raises(ValueError, match="needs the training item counts"):
        NegativeSampler(4, 8, "popularity")


@pytest.mark.parametrize("sampler", ["uniform", "popularity"])
def test_gradients_reach_the_encoder_and_the_item_table(sampler):
    torch.manual_seed(0)
    model = models.build("sasrec", num_items=30, max_len=6, hidden_size=16, num_heads=2, inner_size=16)
    windows = torch.randint(1, 31, (4, 7))
    windows[0, :3] = 0  # left padding is never scored
    negatives = NegativeSampler(30, 8, sampler, np.arange(31))
    loss = objective_loss("sampled_ce", model, windows, mask_prob=0.2, generator=torch.Generator().manual_seed(0),
                          sampler=negatives)
    loss.backward()
    assert torch.isfinite(loss)
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert sum(float(g.abs().sum()) for g in grads.values()) > 0


def test_sampled_ce_is_offered_exactly_where_causal_is():
    causal = models.build("sasrec", num_items=10, max_len=5)
    assert resolve_objective(causal, "sampled_ce") == "sampled_ce"
    bidirectional = models.build("bert4rec", num_items=10, max_len=5)
    with pytest.raises(ConfigError, match="cannot train with 'sampled_ce': its token mixer is not causal"):
        resolve_objective(bidirectional, "sampled_ce")


def test_training_negative_keys_are_typed_and_checked():
    train, _ = split_settings("sasrec", {"objective": "sampled_ce", "train_negatives": "64",
                                         "train_negative_sampler": "popularity"})
    assert (train.train_negatives, train.train_negative_sampler) == (64, "popularity")
    with pytest.raises(ConfigError) as error:
        split_settings("sasrec", {"train_negatives": "0", "train_negative_sampler": "zipf"})
    keys = {key for key, _ in error.value.errors}
    assert keys == {"train_negatives", "train_negative_sampler"}


def test_the_step_draws_its_negatives_from_the_training_counts():
    model = models.build("sasrec", num_items=5, max_len=4)
    settings, _ = split_settings("sasrec", {"objective": "sampled_ce", "train_negative_sampler": "popularity"})
    step = TrainStep(model, settings, item_popularity=np.array([0, 9, 0, 0, 0, 0]))
    assert step.sampler.probs[1] == pytest.approx(10 / 14)  # counts + 1 over items 1..5
    with pytest.raises(ValueError, match="needs the training item counts"):
        TrainStep(model, settings)


@pytest.mark.slow
def test_sampled_softmax_learns_ml100k_beyond_popularity(ml100k_prepared):
    """20 epochs on ml-100k: test NDCG@10 0.033–0.035 (uniform) and 0.027–0.029 (popularity) over seeds 0–2,
    against popularity's 0.0224. Not LastFM: there both samplers sit on its popularity plateau for 8–20 epochs
    (0.014–0.024 against 0.0168 over seeds; experiments/reproduction/NOTES.md), so a test of it would be a coin flip."""
    data = TrialData.from_prepared(ml100k_prepared, max_len=50)
    for sampler in ("uniform", "popularity"):  # one test for both samplers: one skip where ../shared is absent
        result = run_trial("sasrec", data, {"objective": "sampled_ce", "train_negatives": 64,
                                            "train_negative_sampler": sampler, "max_epochs": 20, "batch_size": 128,
                                            "lr": 3e-3, "measure_efficiency": False, "num_threads": 1, "max_len": 50,
                                            "window_step": 0})  # each user's newest window, as measured above
        assert result["status"] == "ok" and result["objective"] == "sampled_ce", sampler
        assert result["test_ndcg@10"] > result["pop_ndcg@10"], sampler
