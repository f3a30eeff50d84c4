"""Ranking metrics, the batched evaluator and sampled negatives, checked against brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from study.train.metrics import (
    EvalSplit,
    NonFiniteScores,
    evaluate,
    metrics_from_ranks,
    popularity_metrics,
    rank_of_target,
    sample_negatives,
)
from study.train.trainer import TrialData


def test_metrics_from_known_ranks():
    out = metrics_from_ranks(torch.tensor([1.0, 2.0, 11.0, 5.0]), ks=(5, 10))
    assert out["hr@5"] == pytest.approx(3 / 4)
    assert out["hr@10"] == pytest.approx(3 / 4)
    assert out["ndcg@5"] == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(6)) / 4)
    assert out["mrr@10"] == pytest.approx((1 + 1 / 2 + 1 / 5) / 4)


class FixedScores(torch.nn.Module):
    """A 'model' whose scores for user u are a fixed row; hidden = one-hot user, weights = scores.T."""

    def __init__(self, scores: torch.Tensor):
        super().__init__()
        self.scores = scores

    def last_hidden(self, items: torch.Tensor) -> torch.Tensor:
        users = items[:, 0] - 1  # the test stores the user id + 1 in the first input column
        return torch.nn.functional.one_hot(users, self.scores.shape[0]).float()

    def item_weights(self) -> torch.Tensor:
        return self.scores.T


def _split(num_users: int, num_items: int, rng: np.random.Generator) -> EvalSplit:
    histories = [rng.choice(np.arange(1, num_items + 1), size=rng.integers(2, 6), replace=False)
                 for _ in range(num_users)]
    lengths = np.array([len(h) for h in histories])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    inputs = np.zeros((num_users, 4), dtype=np.int64)
    inputs[:, 0] = np.arange(num_users) + 1
    targets = rng.integers(1, num_items + 1, size=num_users)
    return EvalSplit(inputs=inputs, targets=targets, history_items=np.concatenate(histories),
                     history_starts=starts, history_lengths=lengths)


@pytest.mark.parametrize("mask_history", [False, True])
def test_full_ranking_equals_brute_force(mask_history):
    rng = np.random.default_rng(0)
    num_users, num_items = 37, 25
    split = _split(num_users, num_items, rng)
    scores = torch.randn(num_users, num_items + 1)
    scores[:, 3] = scores[:, 4]  # ties exist
    got = evaluate(FixedScores(scores), split, batch_size=8, device=torch.device("cpu"), mask_history=mask_history)
    ranks = []
    for u in range(num_users):
        row = scores[u, 1:].numpy().copy()
        target = split.targets[u]
        if mask_history:
            history = split.history_items[split.history_starts[u]:split.history_starts[u] + split.history_lengths[u]]
            blocked = [i for i in history if i != target]
            row[np.array(blocked, dtype=int) - 1] = -np.inf
        t = row[target - 1]
        ranks.append(1 + (row > t).sum() + ((row == t).sum() - 1) / 2)
    expected = metrics_from_ranks(torch.tensor(ranks))
    assert got == pytest.approx(expected)


def test_sampled_negatives_are_fixed_per_seed_and_avoid_history_and_target():
    rng = np.random.default_rng(1)
    split = _split(50, 300, rng)
    a = sample_negatives(split, 300, 100, None, seed=7)
    b = sample_negatives(split, 300, 100, None, seed=7)
    c = sample_negatives(split, 300, 100, None, seed=8)
    assert (a == b).all() and not (a == c).all()
    for u in range(50):
        history = split.history_items[split.history_starts[u]:split.history_starts[u] + split.history_lengths[u]]
        assert len(set(a[u])) == 100
        assert not set(a[u]) & (set(history) | {split.targets[u], 0})


def test_popularity_sampler_prefers_popular_items():
    rng = np.random.default_rng(2)
    split = _split(200, 100, rng)
    popularity = np.zeros(101)
    popularity[1:11] = 1000.0
    popularity[11:] = 1.0
    negatives = sample_negatives(split, 100, 5, popularity, seed=0)
    assert (negatives <= 10).mean() > 0.8


def test_sampled_evaluation_ranks_among_the_candidates_only():
    rng = np.random.default_rng(3)
    split = _split(20, 60, rng)
    scores = torch.randn(20, 61)
    negatives = sample_negatives(split, 60, 10, None, seed=0)
    got = evaluate(FixedScores(scores), split, device=torch.device("cpu"), negatives=negatives)
    target_scores = scores[torch.arange(20), torch.as_tensor(split.targets)]
    negative_scores = scores.gather(1, torch.as_tensor(negatives))
    ranks = 1 + (negative_scores > target_scores[:, None]).sum(1).double()
    assert got == pytest.approx(metrics_from_ranks(ranks))


def test_popularity_baseline_on_a_dataset_matches_brute_force(synthetic_lastfm_prepared):
    data = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=50)
    got = popularity_metrics(data.test, data.item_popularity)
    popularity = data.item_popularity.astype(float)
    popularity[0] = -np.inf
    target = popularity[data.test.targets]
    higher = (popularity[None, :] > target[:, None]).sum(1)
    tied = (popularity[None, :] == target[:, None]).sum(1) - 1
    assert got == pytest.approx(metrics_from_ranks(torch.tensor(1.0 + higher + tied / 2.0)))
    assert 0.0 < got["ndcg@10"] < 0.2


@pytest.mark.parametrize("mask_history", [False, True])
def test_popularity_baseline_ranks_as_evaluate_ranks_a_popularity_model(mask_history):
    # the baseline is the model that scores every user with the training popularity: evaluate gives its figures,
    # history masking, ties, repeated history items and targets inside the history included
    rng = np.random.default_rng(4)
    num_users, num_items = 60, 30
    split = _split(num_users, num_items, rng)
    firsts = split.history_starts[:5]
    split.history_items[firsts] = split.history_items[firsts + 1]  # five users had an item twice
    split.targets[5:10] = split.history_items[split.history_starts[5:10]]  # five targets repeat a history item
    popularity = rng.integers(0, 6, size=num_items + 1).astype(np.float64)  # few values: many ties
    model = FixedScores(torch.tensor(popularity, dtype=torch.float32).repeat(num_users, 1))
    expected = evaluate(model, split, batch_size=16, device=torch.device("cpu"), mask_history=mask_history)
    got = popularity_metrics(split, popularity, mask_history=mask_history)
    assert got == pytest.approx(expected)


def test_masking_the_history_lifts_the_popularity_baseline(synthetic_lastfm_prepared):
    data = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=50)
    plain = popularity_metrics(data.test, data.item_popularity)
    masked = popularity_metrics(data.test, data.item_popularity, mask_history=True)
    # a user's own popular items no longer stand above the target
    assert masked["mrr@20"] > plain["mrr@20"]


def test_non_finite_scores_rank_last():
    scores = torch.tensor([[float("-inf"), 0.3, float("nan"), 0.1, 0.2],
                           [float("-inf"), 0.3, 0.9, float("nan"), float("inf")],
                           [float("-inf"), 0.3, 0.2, 0.1, float("inf")]])
    targets = torch.tensor([2, 2, 1])  # user 0's target is NaN, user 1's is finite, user 2's beaten only by +inf
    ranks = rank_of_target(scores, scores.gather(1, targets[:, None]).squeeze(1))
    assert ranks.tolist() == [5.0, 1.0, 1.0]  # NaN target: last of 5; NaN/inf rivals: below every finite score
    out = metrics_from_ranks(ranks, ks=(1,))
    assert 0.0 <= out["ndcg@1"] <= 1.0 and 0.0 <= out["mrr@1"] <= 1.0 and out["hr@1"] == pytest.approx(2 / 3)


def test_a_nan_model_scores_zero_and_fails_when_strict():
    rng = np.random.default_rng(0)
    split = _split(6, 40, rng)  # 40 items: last place is beyond every cut-off (5, 10, 20)
    nan_model = FixedScores(torch.full((6, 41), float("nan")))
    metrics = evaluate(nan_model, split, device=torch.device("cpu"))
    assert all(value == 0.0 for value in metrics.values()), metrics  # never a hit, never NDCG > 1
    with pytest.raises(NonFiniteScores, match="non-finite score to the target of 6 of 6 users"):
        evaluate(nan_model, split, device=torch.device("cpu"), strict=True)
