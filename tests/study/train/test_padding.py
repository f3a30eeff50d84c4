"""No compute on padding (issue #16, item 1): trimming the batches changes the work, not the results.

The model-side invariance (every model, trimmed vs full windows) is in ``tests/models/test_padding_invariance.py``;
here: the helper, each objective's loss and gradients, the evaluator, and short real trainings with trimming on
and off. Dropout is off where results are compared: a dropout mask drawn for a narrower tensor assigns different
random draws to the real positions (same distribution, different realisation).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import models
from models import ConfigError
from study.train.batches import history_prefix_windows
from study.train.config import TrainConfig, split_settings
from study.train.cost import EpochCost
from study.train.metrics import EvalSplit, evaluate
from study.train.objectives import NegativeSampler, computed_positions, objective_loss
from study.train.padding import length_groups, padding_columns, trim_padding, trims_padding
from study.train.step import TrainStep
from study.train.trainer import TrialData, run_trial

MAX_LEN = 50
NO_DROPOUT = {"dropout": 0.0}
# one model per objective (each its default), tiny and without dropout so trimmed and full runs can be compared
PER_OBJECTIVE = {
    "causal": ("sasrec", {**NO_DROPOUT, "attn_dropout": 0.0, "num_layers": 1, "num_heads": 1, "inner_size": 16}),
    "last": ("elastic", {**NO_DROPOUT, "attn_dropout": 0.0, "num_layers": 1, "inner_size": 16, "num_experts": 16,
                         "top_k": 2}),
    "cloze": ("bert4rec", {**NO_DROPOUT, "attn_dropout": 0.0, "num_layers": 1, "inner_size": 16}),
    "bce": ("lisa", {**NO_DROPOUT, "variant": "soft", "num_codewords": 8, "inner_size": 16}),  # with its aux loss
}
# `last` computes in length groups; LISA-Soft's auxiliary loss must come out as that of the whole batch
LOSS_CASES = {**PER_OBJECTIVE, "last-lisa-soft": PER_OBJECTIVE["bce"]}


@pytest.fixture(scope="module")
def lastfm(synthetic_lastfm_prepared) -> TrialData:
    """LastFM-sized synthetic data (tests/conftest.py): trimming is machinery, no real file is needed."""
    return TrialData.from_prepared(synthetic_lastfm_prepared, max_len=MAX_LEN)


def test_padding_columns_counts_the_leading_all_padding_columns():
    windows = np.array([[0, 0, 0, 4, 5], [0, 0, 2, 3, 6]])
    for batch in (windows, torch.as_tensor(windows)):
        assert padding_columns(batch) == 2
        assert trim_padding(batch).tolist() == [[0, 4, 5], [2, 3, 6]]
    assert padding_columns(np.array([[1, 2], [0, 3]])) == 0
    assert padding_columns(np.zeros((2, 4), dtype=np.int64)) == 3  # nothing real: one column stays
    assert padding_columns(torch.zeros(2, 4, dtype=torch.long), keep=2) == 2


def _widths_seen(model: models.SeqRecModel) -> list[int]:
    """Record the width of every window the model's ``forward`` or ``last_hidden`` is given."""
    widths: list[int] = []

    def recorder(original):
        def recording(items: torch.Tensor) -> torch.Tensor:
            widths.append(items.shape[1])
            return original(items)
        return recording

    for method in ("forward", "last_hidden"):
        setattr(model, method, recorder(getattr(model, method)))
    return widths


def _loss_grads_widths(objective: str, name: str, hparams: dict, num_items: int, batch: torch.Tensor, trim: bool,
                       sampler: NegativeSampler | None = None) -> tuple[torch.Tensor, dict, list[int]]:
    """One objective's loss, its parameter gradients and the widths the model saw, from a fresh seeded model."""
    torch.manual_seed(0)
    model = models.build(name, num_items=num_items, max_len=MAX_LEN, hidden_size=16, **hparams)
    widths = _widths_seen(model)
    loss = objective_loss(objective, model, batch, mask_prob=0.3, generator=torch.Generator().manual_seed(1),
                          sampler=sampler, trim=trim)
    loss.backward()
    grads = {key: p.grad.clone() for key, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, widths


@pytest.mark.parametrize("case", LOSS_CASES)
def test_each_objective_gives_the_same_loss_and_gradients_on_a_trimmed_batch(lastfm, case):
    objective = case.split("-")[0]
    name, hparams = LOSS_CASES[case]
    windows = lastfm.train[np.argsort((lastfm.train > 0).sum(1))[:64]]  # the shortest users: much padding
    if objective == "last":  # two prefixes of each short user's training history, as the trainer builds them
        split, shortest = lastfm.valid, np.argsort(lastfm.valid.history_lengths)[:64]
        windows = next(history_prefix_windows(split.history_items, split.history_starts[shortest],
                                              split.history_lengths[shortest], MAX_LEN, 2, 10_000,
                                              np.random.default_rng(0))).windows
    batch = torch.as_tensor(windows, dtype=torch.long)
    assert padding_columns(batch) > MAX_LEN // 2
    results = {trim: _loss_grads_widths(objective, name, hparams, lastfm.num_items, batch, trim)
               for trim in (False, True)}
    (full_loss, full_grads, full_widths), (cut_loss, cut_grads, cut_widths) = results[False], results[True]
    assert max(full_widths) >= MAX_LEN and max(cut_widths) < MAX_LEN // 2  # the trimmed run computed less
    assert torch.isfinite(full_loss) and full_loss > 0
    torch.testing.assert_close(cut_loss, full_loss, atol=1e-6, rtol=1e-6)
    assert cut_grads.keys() == full_grads.keys() and full_grads
    for key, grad in full_grads.items():
        torch.testing.assert_close(cut_grads[key], grad, atol=1e-6, rtol=1e-5, msg=key)


@pytest.mark.parametrize("objective", ["causal", "bce", "sampled_ce"])
def test_a_batch_of_mixed_lengths_runs_in_length_groups_with_the_whole_batch_loss_and_gradients(lastfm, objective):
    """The 24 shortest and the 8 longest users in one batch: each group is trimmed to its own longest window, and
    the loss and gradients are those of the untrimmed batch (LISA-Soft for bce: its auxiliary loss recombines)."""
    name, hparams = PER_OBJECTIVE["bce" if objective == "bce" else "causal"]
    by_length = np.argsort((lastfm.train > 0).sum(1), kind="stable")
    batch = torch.as_tensor(lastfm.train[np.concatenate([by_length[:24], by_length[-8:]])], dtype=torch.long)
    assert padding_columns(batch) == 0  # trimming the whole batch would save nothing
    sampler = NegativeSampler(lastfm.num_items, 16) if objective == "sampled_ce" else None
    results = {trim: _loss_grads_widths(objective, name, hparams, lastfm.num_items, batch, trim, sampler)
               for trim in (False, True)}
    (full_loss, full_grads, full_widths), (cut_loss, cut_grads, cut_widths) = results[False], results[True]
    assert full_widths == [MAX_LEN] and len(cut_widths) > 1 and min(cut_widths) < MAX_LEN // 4
    torch.testing.assert_close(cut_loss, full_loss, atol=1e-6, rtol=1e-6)
    for key, grad in full_grads.items():
        torch.testing.assert_close(cut_grads[key], grad, atol=1e-6, rtol=1e-5, msg=key)


def test_a_model_whose_training_mixes_rows_runs_a_training_batch_whole(lastfm):
    """ELASTIC's query BatchNorm normalises a training batch with its own statistics, so its length groups would
    each see other statistics: the batch is trimmed but computed whole, with the untrimmed batch's loss and
    gradients. The same batch without BatchNorm runs in groups."""
    name, hparams = PER_OBJECTIVE["last"]
    by_length = np.argsort((lastfm.train > 0).sum(1), kind="stable")
    middle = len(by_length) // 2
    batch = torch.as_tensor(lastfm.train[np.concatenate([by_length[:24], by_length[middle:middle + 8]])],
                            dtype=torch.long)
    width = MAX_LEN - padding_columns(batch[:, :-1])
    assert width < MAX_LEN
    batchnorm = {**hparams, "query_batchnorm": True}
    (full_loss, full_grads, _), (cut_loss, cut_grads, cut_widths) = (
        _loss_grads_widths("last", name, batchnorm, lastfm.num_items, batch, trim) for trim in (False, True))
    assert cut_widths == [width]
    torch.testing.assert_close(cut_loss, full_loss, atol=1e-6, rtol=1e-6)
    assert "memory.query_norm.weight" in full_grads
    for key, grad in full_grads.items():
        torch.testing.assert_close(cut_grads[key], grad, atol=1e-6, rtol=1e-5, msg=key)
    assert len(_loss_grads_widths("last", name, hparams, lastfm.num_items, batch, True)[2]) > 1


def test_evaluation_on_trimmed_batches_gives_the_same_metrics(lastfm):
    torch.manual_seed(0)
    model = models.build("sasrec", num_items=lastfm.num_items, max_len=MAX_LEN, hidden_size=16)
    widths = _widths_seen(model)
    # users by length, so that the short users' batches are narrow; with mask_history, the histories follow the rows
    order = np.argsort((lastfm.test.inputs > 0).sum(1), kind="stable")
    test = EvalSplit(lastfm.test.inputs[order], lastfm.test.targets[order], lastfm.test.history_items,
                     lastfm.test.history_starts[order], lastfm.test.history_lengths[order])
    full = evaluate(model, test, batch_size=64, device=torch.device("cpu"), mask_history=True, trim=False)
    full_widths, widths[:] = list(widths), []
    trimmed = evaluate(model, test, batch_size=64, device=torch.device("cpu"), mask_history=True, trim=True)
    assert set(full_widths) == {MAX_LEN} and min(widths) < MAX_LEN // 2
    assert trimmed == pytest.approx(full, abs=1e-9)
    assert full["ndcg@10"] > 0


def test_evaluation_runs_batches_of_mixed_lengths_in_groups_with_the_same_metrics(lastfm):
    """Users in shuffled order, so every batch holds long windows: only the length groups can compute less."""
    torch.manual_seed(0)
    model = models.build("sasrec", num_items=lastfm.num_items, max_len=MAX_LEN, hidden_size=16)
    widths = _widths_seen(model)
    order = np.random.default_rng(0).permutation(len(lastfm.test.targets))
    test = EvalSplit(lastfm.test.inputs[order], lastfm.test.targets[order], lastfm.test.history_items,
                     lastfm.test.history_starts[order], lastfm.test.history_lengths[order])
    full = evaluate(model, test, batch_size=64, device=torch.device("cpu"), mask_history=True, trim=False)
    widths[:] = []
    grouped = evaluate(model, test, batch_size=64, device=torch.device("cpu"), mask_history=True, trim=True)
    assert min(widths) < MAX_LEN // 2 and len(widths) > len(range(0, len(order), 64))
    assert grouped == pytest.approx(full, abs=1e-9)


@pytest.mark.parametrize("objective", ["causal", "last", "cloze"])
def test_a_real_training_gives_identical_metrics_with_trimming_on_and_off(lastfm, objective):
    """LastFM, a tiny model, 2 epochs, seed 3, one thread: the same validation and test metrics.

    The epoch losses agree to 1e-3 (relative), not bit for bit: the narrower tensors round differently (the first
    difference is one float ulp, after ~15 steps), and training amplifies that, most in ELASTIC, whose top-k expert
    choice is discrete. The ranking metrics stay the same.
    """
    name, hparams = PER_OBJECTIVE[objective]
    runs = {}
    for trim in (True, False):
        reports = []
        settings = {"max_epochs": 2, "hidden_size": 16, "seed": 3, "lr": 5e-3, "measure_efficiency": False,
                    "prefixes_per_user": 3, "trim_padding": trim, "num_threads": 1, **hparams}
        row = run_trial(name, lastfm, settings, callback=reports.append)
        runs[trim] = row, [report.train_loss for report in reports]
    (on, on_losses), (off, off_losses) = runs[True], runs[False]
    assert on["config"]["trim_padding"] is True and off["config"]["trim_padding"] is False
    assert on["valid_ndcg@10"] > 0 and len(on_losses) == 2
    assert on_losses == pytest.approx(off_losses, rel=1e-3)
    for key in on:
        if key.startswith(("valid_", "test_")):
            assert on[key] == pytest.approx(off[key], abs=1e-9), key


def test_cost_line_says_what_trimming_leaves():
    cost = EpochCost(windows=100, steps=1, tokens=20_000, real_tokens=5_000, computed_tokens=8_000, step_s=0.1,
                     max_len=200, median_length=19)
    line = cost.line(max_epochs=1)
    assert "20k tokens (75% padding), 8k computed after trimming (38% padding)" in line
    assert "most positions are padding" not in line  # the hint goes by what is still computed
    untrimmed = EpochCost(windows=100, steps=1, tokens=20_000, real_tokens=5_000, computed_tokens=20_000,
                          step_s=0.1, max_len=200, median_length=19).line(max_epochs=1)
    assert "computed after trimming" not in untrimmed and "max_len 200 vs a median length of 19" in untrimmed


def test_length_groups_split_a_batch_by_length_and_count_what_it_computes():
    windows = np.zeros((8, 11), dtype=np.int64)
    for row, length in enumerate([1, 10, 2, 9, 3, 8, 4, 7]):
        windows[row, -(length + 1):] = np.arange(1, length + 2)
    lengths = torch.as_tensor((windows[:, :-1] > 0).sum(1))
    groups = length_groups(lengths, groups=4)
    assert [sorted(lengths[rows].tolist()) for rows in groups] == [[1, 2], [3, 4], [7, 8], [9, 10]]
    assert computed_positions("last", windows, trim=True) == 2 * (2 + 4 + 8 + 10)
    for objective in ("causal", "bce", "sampled_ce"):  # every objective but cloze groups its windows
        assert computed_positions(objective, windows, trim=True) == 2 * (2 + 4 + 8 + 10)
    assert computed_positions("causal", windows, trim=False) == 8 * 10
    assert computed_positions("last", windows, trim=False) == 8 * 10
    two_widths = torch.as_tensor([5, 1, 5, 1, 5, 1, 5, 1])  # four parts but two widths: two forward passes
    assert [two_widths[rows].tolist() for rows in length_groups(two_widths, groups=4)] == [[1] * 4, [5] * 4]
    assert len(length_groups(torch.full((8,), 5), groups=4)) == 1  # no padding: the batch stays whole


def test_trimming_by_default_is_on_for_a_cpu_and_off_on_cuda_and_a_setting_wins():
    """The default (None, `auto`) follows the device: CUDA steps at the zoo's sizes wait on kernel launches, which
    the length groups multiply (config.py gives the measurement); an explicit setting is kept on either device."""
    assert trims_padding(None, "cpu") is True and trims_padding(None, torch.device("cuda:1")) is False
    assert trims_padding(True, "cuda") is True and trims_padding(False, "cpu") is False
    # a compiled step keeps full windows unless told otherwise: every trimmed width would be a graph to compile
    assert trims_padding(None, "cpu", compiled=True) is False and trims_padding(True, "cpu", compiled=True) is True
    for given, parsed in (("auto", None), ("AUTO", None), (None, None), ("false", False), ("true", True)):
        assert split_settings("sasrec", {"trim_padding": given})[0].trim_padding is parsed
    with pytest.raises(ConfigError, match="expected a boolean or auto, got 'maybe'"):
        split_settings("sasrec", {"trim_padding": "maybe"})
    with pytest.raises(ConfigError, match="expected a boolean, got 'auto'"):  # only an optional setting takes auto
        split_settings("sasrec", {"mask_history": "auto"})
    step = TrainStep(models.build("sasrec", num_items=20, max_len=8), TrainConfig())
    assert step.train.trim_padding is True  # the step resolves it for its model's device


def test_a_trial_records_the_trimming_that_ran(synthetic_lastfm_prepared):
    settings = {"max_epochs": 1, "hidden_size": 8, "num_layers": 1, "measure_efficiency": False, "num_threads": 1}
    row = run_trial("sasrec", synthetic_lastfm_prepared, settings)
    assert row["status"] == "ok" and row["config"]["trim_padding"] is True  # auto, resolved on this CPU


def test_latency_is_measured_trimmed_on_a_cpu_when_trimming_is_left_to_the_trainer(synthetic_lastfm_prepared,
                                                                                   monkeypatch):
    """Sweeps measure a trial's latency before training, from the unresolved settings: `auto` must still mean
    trimmed on a CPU there, as in the trainer's own rows."""
    from study.train import efficiency
    from study.train.efficiency import efficiency_figures

    asked = []
    monkeypatch.setattr(efficiency, "inference_latency_ms", lambda *a, trim, **k: asked.append(trim) or (1.0, 1.0))
    data = TrialData.from_prepared(synthetic_lastfm_prepared, 50)
    model = models.build("sasrec", num_items=data.num_items, max_len=50, hidden_size=8, num_layers=1)
    efficiency_figures("sasrec", {"hidden_size": 8, "num_layers": 1, "num_items": data.num_items, "max_len": 50},
                       TrainConfig(), data, model, torch.device("cpu"))
    assert asked == [True]
