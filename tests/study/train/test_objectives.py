"""Training objectives: prefix expansion, each loss on real batches, and objective/model compatibility."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import models
from study.train.objectives import expand_prefixes, objective_loss, resolve_objective
from study.train.trainer import TrialData


def test_every_prefix_is_expanded_exactly_once():
    windows = np.array([[0, 0, 3, 4, 5], [0, 0, 0, 0, 7], [1, 2, 3, 4, 5]])
    prefixes = expand_prefixes(windows, 0, np.random.default_rng(0))
    naive = []
    for row in windows:
        for end in range(1, len(row)):
            if row[end] > 0 and row[end - 1] > 0:
                prefix = np.zeros(len(row), dtype=row.dtype)
                kept = row[:end + 1]
                prefix[len(row) - len(kept):] = kept
                naive.append(prefix)
    assert sorted(map(tuple, prefixes)) == sorted(map(tuple, naive))
    assert len(prefixes) == 2 + 0 + 4


def test_sampled_prefixes_come_from_each_user():
    windows = np.array([[0, 3, 4, 5, 6], [0, 0, 8, 9, 10]])
    prefixes = expand_prefixes(windows, 3, np.random.default_rng(0))
    assert len(prefixes) == 6
    first_user = prefixes[:3]
    assert set(first_user[:, -1]) <= {4, 5, 6}
    assert set(prefixes[3:, -1]) <= {9, 10}


@pytest.mark.parametrize("objective", ["causal", "last", "bce"])
def test_each_objective_decreases_its_loss_on_a_real_batch(lastfm_prepared, objective):
    data = TrialData.from_prepared(lastfm_prepared, max_len=50)
    torch.manual_seed(0)
    model = models.build("sasrec", num_items=data.num_items, max_len=50, dropout=0.0, attn_dropout=0.0)
    windows = data.train[:64]
    if objective == "last":
        windows = expand_prefixes(windows, 1, np.random.default_rng(0))
    batch = torch.as_tensor(windows, dtype=torch.long)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = objective_loss(objective, model, batch, mask_prob=0.2, generator=generator)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.8 * losses[0]


def test_objective_compatibility_errors_name_the_key_and_reason():
    model = models.build("sasrec", num_items=10, max_len=5)
    assert resolve_objective(model, "auto") == "causal"
    with pytest.raises(models.ConfigError, match="objective: sasrec cannot train with 'cloze': it is a causal-only"):
        resolve_objective(model, "cloze")
