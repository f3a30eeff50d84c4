"""The pieces of a data-parallel trial that need no Ray: padding rows in a shard's batches and the weighted gradient
average. The two-worker sweep itself runs in test_sweep_run.py (on ml-100k, with its shards asserted)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from study.search.data_parallel import (
    ShardBatches,
    pack_gradients,
    padding_owner,
    unpack_average,
    weighted_gradient_average,
)


def test_shard_batches_leave_padding_out_and_a_padding_only_batch_steps_with_weight_zero() -> None:
    windows = np.arange(12).reshape(6, 2)
    users = np.array([4, padding_owner(np.array([7]))[0], 2, 0, 5, -1 - 3])
    source = [(windows[:2], users[:2]), (windows[2:5], users[2:5]), (windows[5:], users[5:])]
    logged = []
    batches = ShardBatches(lambda epoch: iter(source), on_epoch_end=lambda *record: logged.append(record))
    seen = []
    for batch_windows, batch_users in batches(3):
        seen.append((batch_windows.tolist(), batch_users.tolist(), batches.weight))
    assert seen == [([[0, 1]], [4], 1),  # the padding row of the first batch is dropped
                    ([[4, 5], [6, 7], [8, 9]], [2, 0, 5], 3),
                    ([[10, 11]], [3], 0)]  # padding only: user 3's window, trained with weight 0
    ((epoch, trained, steps, first_batch_at),) = logged
    assert epoch == 3 and trained.tolist() == [4, 2, 0, 5] and steps == 3 and first_batch_at > 0


def _linear_worker(rows: np.ndarray, targets: np.ndarray, seed: int = 0) -> torch.nn.Linear:
    """A replica of one linear model after backward on the mean squared error of its rows."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    loss = ((model(torch.as_tensor(rows)) - torch.as_tensor(targets)) ** 2).sum(1).mean()
    loss.backward()
    return model


def test_the_weighted_average_is_the_gradient_of_the_whole_step_whatever_the_shard_sizes() -> None:
    rng = np.random.default_rng(0)
    rows, targets = rng.normal(size=(7, 3)).astype(np.float32), rng.normal(size=(7, 2)).astype(np.float32)
    whole = _linear_worker(rows, targets)
    # three workers: 5 windows, 2 windows, and one whose batch was padding only (its gradient must not count)
    workers = [_linear_worker(rows[:5], targets[:5]), _linear_worker(rows[5:], targets[5:]),
               _linear_worker(rows[:1] * 100, targets[:1])]
    packs = [pack_gradients(list(w.parameters()), weight, step=4) for w, weight in zip(workers, (5.0, 2.0, 0.0))]
    summed = torch.stack(packs).sum(0)  # what the all-reduce leaves on every worker
    for worker in workers:
        unpack_average(list(worker.parameters()), summed.clone(), step=4, world=3)
        for mine, reference in zip(worker.parameters(), whole.parameters()):
            torch.testing.assert_close(mine.grad, reference.grad)
    # an unweighted mean of the three workers' gradients is not that gradient
    plain = torch.stack([pack_gradients(list(w.parameters()), 1.0, 4) for w in
                         (_linear_worker(rows[:5], targets[:5]), _linear_worker(rows[5:], targets[5:]))]).mean(0)
    assert not torch.allclose(plain[:-2], pack_gradients(list(whole.parameters()), 1.0, 4)[:-2])


def test_workers_out_of_step_fail_the_step_instead_of_averaging_unrelated_batches() -> None:
    rng = np.random.default_rng(1)
    rows, targets = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32)
    ahead, behind = _linear_worker(rows[:2], targets[:2]), _linear_worker(rows[2:], targets[2:])
    summed = pack_gradients(list(ahead.parameters()), 2.0, step=8) + pack_gradients(list(behind.parameters()), 2.0, 7)
    with pytest.raises(RuntimeError, match="out of step"):
        unpack_average(list(ahead.parameters()), summed, step=8, world=2)


def test_the_hook_all_reduces_once_per_step_and_counts_the_steps() -> None:
    rng = np.random.default_rng(2)
    rows, targets = rng.normal(size=(3, 3)).astype(np.float32), rng.normal(size=(3, 2)).astype(np.float32)
    model = _linear_worker(rows, targets)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reduced = []

    def as_if_two_equal_workers(packed: torch.Tensor) -> None:  # a second worker with the same batch and step
        reduced.append(packed[-2:].tolist())
        packed.mul_(2)

    batches = ShardBatches(lambda epoch: iter(()))
    batches.weight = 3
    hook = weighted_gradient_average(batches, as_if_two_equal_workers, world=2)
    before = [p.grad.clone() for p in model.parameters()]
    for _ in range(2):
        hook(optimizer, (), {})
    assert reduced == [[3.0, 1.0], [3.0, 2.0]]
    for grad, p in zip(before, model.parameters()):
        torch.testing.assert_close(p.grad, grad)  # two equal halves average to the same gradient
