"""The trainer and the single-trial CLI, end to end on synthetic data sized like LastFM (no ``../shared`` needed);
one test learns on real MovieLens-100K."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from models.registry import ConfigError
from study.errors import UserError
from study.train.config import TrainConfig, split_settings
from study.train.metrics import NonFiniteScores, metrics_from_ranks, popularity_metrics
from study.train.trainer import TrialData, epoch_windows, run_trial, user_batches

REPO = Path(__file__).resolve().parents[3]
QUICK = {"max_epochs": 2, "batch_size": 256, "measure_efficiency": False, "num_threads": 1, "max_len": 20}
# each user's newest window, about an eighth of a whole-history epoch: for tests of what happens around the training
QUICK_NEWEST = {**QUICK, "window_step": 0}


@pytest.fixture(scope="module")
def synthetic(synthetic_lastfm_prepared):
    return TrialData.from_prepared(synthetic_lastfm_prepared, max_len=20)


@pytest.mark.slow
def test_same_seed_gives_identical_metrics_and_reports_every_epoch(synthetic):
    reports = []
    first = run_trial("sasrec", synthetic, {**QUICK, "seed": 3}, callback=reports.append)
    second = run_trial("sasrec", synthetic, {**QUICK, "seed": 3})
    other = run_trial("sasrec", synthetic, {**QUICK, "seed": 4})
    metric_keys = [k for k in first if k.startswith(("valid_", "test_"))]
    assert len(metric_keys) == 18
    assert [first[k] for k in metric_keys] == [second[k] for k in metric_keys]
    assert [first[k] for k in metric_keys] != [other[k] for k in metric_keys]
    assert [r.epoch for r in reports] == [1, 2]
    assert all(r.throughput > 0 and r.epoch_time_s > 0 for r in reports)
    best = max(reports, key=lambda r: r.valid["ndcg@10"])
    assert first["best_epoch"] == best.epoch
    assert first["valid_ndcg@10"] == best.valid["ndcg@10"]
    assert first["test_ndcg@10"] == reports[-1].best_test["ndcg@10"]
    # each report's validation ranks, one a validation user, are what its every validation metric averages
    for report in reports:
        assert len(report.valid_ranks) == len(synthetic.valid.targets) and report.valid_ranks.min() >= 1
        assert metrics_from_ranks(torch.as_tensor(report.valid_ranks)) == pytest.approx(report.valid, abs=1e-12)
    assert not np.array_equal(reports[0].valid_ranks, reports[1].valid_ranks)  # each epoch its own


def test_data_prepared_for_a_longer_window_is_cut_to_the_models(synthetic_lastfm_prepared, synthetic):
    wider = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=50)
    settings = {**QUICK, "max_epochs": 1, "seed": 3}
    cut, direct = run_trial("sasrec", wider, settings), run_trial("sasrec", synthetic, settings)
    assert {k: v for k, v in cut.items() if k.startswith(("valid_", "test_"))} == \
        {k: v for k, v in direct.items() if k.startswith(("valid_", "test_"))}
    assert wider.width == 50  # the caller's data is left as it was
    with pytest.raises(UserError, match="max_len=60 exceeds the 50 items"):
        wider.cropped(60)


def test_the_selection_metric_picks_the_best_epoch_and_drives_early_stopping(synthetic):
    reports = []
    settings = {**QUICK_NEWEST, "max_epochs": 6, "seed": 5, "lr": 0.01, "selection_metric": "mrr@5", "patience": 2}
    result = run_trial("sasrec", synthetic, settings, callback=reports.append)
    scores = [r.valid["mrr@5"] for r in reports]
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))  # the first epoch with the highest score
    assert result["best_epoch"] == reports[best].epoch and result["valid_mrr@5"] == scores[best]
    assert result["selection_metric"] == "mrr@5"  # recorded with the protocol
    # it stopped after `patience` epochs without a better score, or ran out of epochs
    assert len(reports) == min(6, reports[best].epoch + 2)
    assert all(score <= scores[best] for score in scores[best + 1:])


def test_a_watched_run_says_why_it_stopped(synthetic, capsys: pytest.CaptureFixture) -> None:
    """Patience, the time budget or max_epochs: the bar alone would leave a person guessing why it stopped short."""
    reports = []
    result = run_trial("sasrec", synthetic, {**QUICK_NEWEST, "seed": 1}, progress=True)
    stderr = capsys.readouterr().err
    assert "time budget" not in stderr  # none was set
    assert stderr.endswith(f"stopped after epoch 2: max_epochs (2) reached; the result is that of epoch "
                           f"{result['best_epoch']} (valid ndcg@10 {result['valid_ndcg@10']:.4f})\n")
    run_trial("sasrec", synthetic, {**QUICK_NEWEST, "time_budget_s": 1e-3}, progress=True)
    stderr = capsys.readouterr().err
    assert "the time budget of 0.001 s ends training after about 1 epoch(s)" in stderr  # said before it starts
    assert "stopped after epoch 1: time budget of 0.001 s spent; the result is that of epoch 1" in stderr
    run_trial("sasrec", synthetic, {**QUICK_NEWEST, "max_epochs": 1, "time_budget_s": 1e6}, progress=True)
    assert "ends training after" not in capsys.readouterr().err  # max_epochs ends it first
    run_trial("sasrec", synthetic, {**QUICK_NEWEST, "max_epochs": 30, "seed": 5, "lr": 0.05, "patience": 1},
              callback=reports.append, progress=True)
    assert len(reports) < 30 and reports[-1].best_epoch == len(reports) - 1
    assert f"stopped after epoch {len(reports)}: no gain in ndcg@10 for 1 epochs (patience)" in capsys.readouterr().err
    run_trial("sasrec", synthetic, {**QUICK_NEWEST, "max_epochs": 1})
    assert "stopped" not in capsys.readouterr().err  # inside a sweep the console reports each trial's end


def test_result_records_protocol_and_efficiency(synthetic):
    result = run_trial("sasrec", synthetic, {**QUICK, "max_epochs": 1, "measure_efficiency": True,
                                          "eval_mode": "sampled", "num_negatives": 50})
    assert (result["objective"], result["eval_mode"], result["num_negatives"]) == ("causal", "sampled", 50)
    assert result["negative_sampler"] == "uniform" and result["synthetic"] is True
    assert result["params"] > 0 and result["infer_ms_p50"] > 0 and result["infer_ms_p95"] >= result["infer_ms_p50"]
    assert result["peak_mem_mb"] > 1.0, result["peak_mem_method"]
    assert "fresh process" in result["peak_mem_method"]
    # sampled ranking among 51 candidates is far easier than ranking all 2,703 items
    assert result["test_hr@10"] > 0.2


def test_sampled_test_metrics_beside_full_ranking_are_the_sampled_protocols_and_are_recorded(synthetic):
    plain = run_trial("sasrec", synthetic, {**QUICK_NEWEST, "max_epochs": 1})
    both = run_trial("sasrec", synthetic, {**QUICK_NEWEST, "max_epochs": 1, "sampled_test_negatives": 50})
    sampled = run_trial("sasrec", synthetic, {**QUICK_NEWEST, "max_epochs": 1, "eval_mode": "sampled",
                                              "num_negatives": 50})
    metrics = [k for k in plain if k.startswith("test_")]
    # the setting adds figures and changes neither training nor the protocol's own metrics
    assert {k: both[k] for k in metrics} == {k: plain[k] for k in metrics}
    assert not any(k.startswith("test_sampled_") for k in plain)
    # the same weights against the negatives the sampled protocol draws give that protocol's figures
    assert both["test_sampled_ndcg@10"] == pytest.approx(sampled["test_ndcg@10"], abs=1e-12)
    assert both["test_sampled_hr@20"] == pytest.approx(sampled["test_hr@20"], abs=1e-12)
    # 51 candidates are a subset of all items, so no target ranks worse among them
    assert all(both[f"test_sampled_{k}"] >= both[f"test_{k}"] for k in ("hr@10", "ndcg@10", "mrr@10"))
    assert both["test_sampled_hr@10"] > 2 * both["test_hr@10"]
    assert (plain["sampled_test_negatives"], both["sampled_test_negatives"], sampled["sampled_test_negatives"]) == \
        (0, 50, 0)


def test_sampled_test_metrics_are_refused_where_the_protocol_already_samples():
    with pytest.raises(ConfigError, match="already are sampled"):
        split_settings("sasrec", {"eval_mode": "sampled", "sampled_test_negatives": 100})
    with pytest.raises(ConfigError, match="sampled_test_negatives: must be >= 0"):
        split_settings("sasrec", {"sampled_test_negatives": -1})


def test_last_and_bce_objectives_train(synthetic):
    for objective in ("last", "bce"):
        result = run_trial("sasrec", synthetic, {**QUICK, "max_epochs": 1, "objective": objective,
                                              "prefixes_per_user": 2})
        assert result["objective"] == objective and result["status"] == "ok"


@pytest.mark.parametrize(("model", "objective", "targets"), [("bert4rec", "cloze", "all"), ("sasrec", "causal", "new"),
                                                            ("sasrec", "bce", "all")])
def test_whole_history_windows_train_and_record_their_step(synthetic, model, objective, targets):
    counts = {}
    for step in (0, 4):
        settings = {**QUICK, "max_epochs": 1, "objective": objective, "window_step": step, "window_targets": targets}
        result = run_trial(model, synthetic, settings)
        assert result["status"] == "ok" and result["config"]["window_step"] == step
        assert result["config"]["window_targets"] == (targets if step else "all")  # one window: all of it
        config = TrainConfig(batch_size=64, window_step=step, window_targets=targets)
        batches = epoch_windows(synthetic, user_batches(synthetic.train, 64, np.random.default_rng(0)), objective,
                                config, np.random.default_rng(0))
        counts[step] = sum(len(batch.windows) for batch in batches)
    assert counts[4] > counts[0]  # the histories longer than the 20-item windows give more than one


@pytest.mark.slow
def test_each_objective_trains_on_its_default_windows_and_records_them(synthetic):
    default = run_trial("bert4rec", synthetic, {**QUICK, "max_epochs": 1})
    assert (default["config"]["window_step"], default["config"]["window_targets"]) == (2, "all")  # 0.1 x max_len 20
    assert split_settings("bert4rec", {"window_step": "auto"})[0].window_step is None  # = the default
    causal = run_trial("sasrec", synthetic, {**QUICK, "max_epochs": 1})["config"]
    assert (causal["window_step"], causal["window_targets"]) == (4, "new")  # max_len / 5
    # `last` trains on prefixes, not windows, whatever their number: one prefix per user keeps the epoch to a second
    last = run_trial("sasrec", synthetic, {**QUICK, "max_epochs": 1, "objective": "last", "prefixes_per_user": 1})
    assert (last["config"]["window_step"], last["config"]["window_targets"]) == (0, "all")


def test_a_trial_fed_batches_refuses_the_whole_history_windows(synthetic):
    def shard(epoch: int):
        return user_batches(synthetic.train, 64, np.random.default_rng(epoch))

    with pytest.raises(UserError, match="set window_step: 0"):
        run_trial("bert4rec", synthetic, {**QUICK, "max_epochs": 1}, train_batches=shard)
    result = run_trial("bert4rec", synthetic, {**QUICK, "max_epochs": 1, "window_step": 0}, train_batches=shard)
    assert result["status"] == "ok" and result["config"]["window_step"] == 0


def test_the_popularity_baseline_follows_the_history_masking(synthetic):
    for masked in (False, True):
        result = run_trial("sasrec", synthetic, {**QUICK_NEWEST, "max_epochs": 1, "mask_history": masked})
        expected = popularity_metrics(synthetic.test, synthetic.item_popularity, mask_history=masked)
        assert result["pop_ndcg@10"] == pytest.approx(expected["ndcg@10"])
    assert popularity_metrics(synthetic.test, synthetic.item_popularity, mask_history=True)["ndcg@10"] != \
        pytest.approx(popularity_metrics(synthetic.test, synthetic.item_popularity)["ndcg@10"])


@pytest.mark.slow
def test_sasrec_beats_popularity_on_movielens(ml100k_prepared):
    """On each user's newest window, the cheapest epoch: windows over the whole history cost about six times as
    much on ml-100k (benchmarks.defaults_search compares what they learn)."""
    data = TrialData.from_prepared(ml100k_prepared, max_len=50)
    result = run_trial("sasrec", data, {"max_epochs": 8, "measure_efficiency": False, "dropout": 0.2,
                                        "attn_dropout": 0.2, "batch_size": 64, "window_step": 0})
    assert result["test_ndcg@10"] > result["pop_ndcg@10"]


def test_settings_are_routed_and_typed():
    train, model = split_settings("sasrec", {"lr": "0.01", "hidden_size": "128", "mask_history": "true",
                                             "max_epochs": "3"})
    assert isinstance(train, TrainConfig) and train.lr == 0.01 and train.mask_history is True
    assert model == {"hidden_size": 128} and train.max_epochs == 3


def test_adam_beta2_reaches_the_optimizer_changes_the_steps_and_is_recorded(synthetic):
    import torch

    import models
    from models import ConfigError
    from study.train.step import TrainStep

    windows = torch.as_tensor(synthetic.train[:64], dtype=torch.long)
    weights = {}
    for beta2 in (0.999, 0.98):
        torch.manual_seed(0)
        model = models.build("sasrec", num_items=synthetic.num_items, max_len=20, hidden_size=16, dropout=0.0,
                             attn_dropout=0.0)
        step = TrainStep(model, TrainConfig(adam_beta2=beta2))
        assert step.optimizer.param_groups[0]["betas"] == (0.9, beta2)
        for _ in range(3):  # the first Adam step is sign-like whatever β₂; later ones weigh the history by it
            step(windows)
        weights[beta2] = model.embedding.items.weight.detach().clone()
    assert not torch.allclose(weights[0.999], weights[0.98])

    assert TrainConfig().adam_beta2 == 0.999  # torch's default stays the trainer's
    row = run_trial("sasrec", synthetic, {**QUICK, "max_epochs": 1, "adam_beta2": "0.98"})
    assert row["config"]["adam_beta2"] == 0.98
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ConfigError, match=r"adam_beta2: must be in \[0, 1\)"):
            split_settings("sasrec", {"adam_beta2": bad})


def test_the_learning_rate_decays_after_each_run_of_epochs_without_a_gain_and_travels_in_the_state(synthetic):
    # a long step on a small model: validation stalls within a few epochs, so the decay is reached
    settings = {**QUICK_NEWEST, "max_epochs": 8, "lr": 0.05, "patience": 0, "lr_decay_patience": 2,
                "lr_decay_factor": 0.25, "hidden_size": 16, "num_layers": 1, "seed": 3}
    reports, rates = [], []

    def record(report) -> None:  # a snapshot reads the live optimizer: taken as the epoch ends
        reports.append(report)
        rates.append(report.snapshot().optimizer["param_groups"][0]["lr"])

    row = run_trial("sasrec", synthetic, settings, callback=record)
    expected, lr, without_gain = [], 0.05, 0
    for report in reports:  # the rule, replayed from the epochs that did and did not beat the best so far
        without_gain = 0 if report.best_epoch == report.epoch else without_gain + 1
        if without_gain and without_gain % 2 == 0:
            lr *= 0.25
        expected.append(lr)
    assert rates == pytest.approx(expected) and min(rates) < 0.05  # it did decay, at the epochs the rule says
    assert row["config"]["lr_decay_patience"] == 2 and row["config"]["lr"] == 0.05  # the setting, not the rate reached

    rates.clear()
    run_trial("sasrec", synthetic, {**settings, "lr_decay_patience": 0}, callback=record)
    assert set(rates) == {0.05}
    with pytest.raises(ConfigError, match="lr_decay_patience: 10 never decays the learning rate"):
        run_trial("sasrec", synthetic, {**QUICK, "lr_decay_patience": 10})  # the default patience is 10
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match=r"lr_decay_factor: must be in \(0, 1\]"):
            split_settings("sasrec", {"lr_decay_factor": bad})


def test_every_report_carries_the_best_epochs_model_statistics_and_so_does_a_resumed_one(synthetic):
    """ELASTIC's expert usage is counted on each epoch's validation pass; the reports carry both that epoch's and
    the best epoch's (which a sweep's row records), and a resumed state written before the best epoch's were
    recorded gets them back from its best weights."""
    from study.train.state import TrainingState

    settings = {**QUICK, "max_epochs": 3, "prefixes_per_user": 2, "hidden_size": 16, "inner_size": 16,
                "num_layers": 1, "num_experts": 16, "top_k": 2, "lr": 0.01}
    reports, states = [], []
    row = run_trial("elastic", synthetic, settings,  # a snapshot shares the live tensors: copied at once
                    callback=lambda report: (reports.append(report), states.append(copy.deepcopy(report.snapshot()))))
    assert [r.best_epoch for r in reports] == [1, 1, 3]  # epoch 2 is not the best: its report carries epoch 1's
    for report in reports:
        assert report.extra["expert_selections"] == len(synthetic.valid.targets) * 2
        assert report.best_extra == reports[report.best_epoch - 1].extra
    assert row["extra"] == reports[-1].best_extra

    older = TrainingState(**{**vars(states[0]), "best_extra": None})  # the best weights hold the usage counts
    resumed = []
    run_trial("elastic", synthetic, settings, resume_from=older, callback=resumed.append)
    assert [r.best_extra for r in resumed] == [r.best_extra for r in reports[1:]]


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "study.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def cli_env(data_cache, monkeypatch):
    import os

    return {**os.environ, "SEQREC_DATA": str(data_cache), "OMP_NUM_THREADS": "1"}


def test_cli_trains_and_prints_one_json_line(cli_env):
    done = _cli("--model", "sasrec", "--dataset", "synthetic",
                "--set", "max_epochs=1", "--set", "max_len=20", "--set", "measure_efficiency=false", "--no-progress",
                env=cli_env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    assert row["model"] == "sasrec" and row["dataset"] == "synthetic" and row["config"]["max_len"] == 20
    assert row["epochs_run"] == 1 and 0 <= row["test_ndcg@10"] <= 1


@pytest.mark.parametrize("args, message", [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--dataset", "nope"], "nope"),
    (["--set", "hidden_sise=32"], "hidden_sise: unknown key for model sasrec"),
    (["--set", "lr=fast"], "lr: expected float, got 'fast'"),
    (["--set", "max_len=1"], "max_len: must be >= 2"),
    (["--set", "num_heads=3"], "num_heads: must divide hidden_size=64"),
    (["--set", "objective=cloze"], "cannot train with 'cloze'"),
    (["--set", "max_epochs"], "expected key=value"),
    (["--set", "selection_metric=ndcg@50"], "selection_metric: must be one of"),
])
def test_cli_bad_input_is_one_clear_line_with_exit_code_2(args, message, data_cache, capsys):
    """The command's main() in this process (the test above runs it as a user does): a fresh interpreter per bad
    input would cost seconds of imports each."""
    from study.train.cli import main

    assert main(["--dataset", "synthetic", *args, "--no-progress"]) == 2
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], stderr


def _register_nan_model(monkeypatch: pytest.MonkeyPatch) -> str:
    """SASRec whose evaluation outputs turn NaN once it has taken ``NAN_AFTER_STEPS`` training steps, while every
    training loss stays finite: the case of weights that diverge at an epoch's last step. Registered for the
    calling test only, so that the registry other tests see (every model checked) stays the zoo."""
    from models import registry
    from models.sasrec import SASRec

    name = "test-nan-after-steps"

    class NaNAfterSteps(SASRec):
        NAN_AFTER_STEPS = 4

        def __init__(self, config):
            super().__init__(config)
            self.training_forwards = 0

        def forward(self, items):
            if self.training:
                self.training_forwards += 1
            return super().forward(items)

        def last_hidden(self, items):
            hidden = super().last_hidden(items)
            return hidden * float("nan") if self.training_forwards >= self.NAN_AFTER_STEPS else hidden

    monkeypatch.setattr(NaNAfterSteps, "name", name)
    monkeypatch.setitem(registry._MODELS, name, NaNAfterSteps)
    return name


def test_a_model_that_turns_nan_fails_the_trial_and_is_never_selected(synthetic, monkeypatch):
    name = _register_nan_model(monkeypatch)
    reports = []
    # 1,000 users at batch 512: 2 steps per epoch, so epoch 1 validates finite outputs and epoch 2 (step 4 on) NaN ones
    settings = {**QUICK, "batch_size": 512, "max_epochs": 3, "window_step": 0}  # one window per user
    with pytest.raises(NonFiniteScores, match=r"validation after epoch 2: .*non-finite score"):
        run_trial(name, synthetic, settings, callback=reports.append)
    assert [r.epoch for r in reports] == [1]  # the NaN epoch reached no callback (Tune, ASHA, the searcher)
    assert 0.0 <= reports[0].valid["ndcg@10"] < 1.0


def test_cli_says_the_cost_then_ctrl_c_keeps_the_finished_epochs(cli_env):
    """A person watching: a cost line before epoch 1, a step-level bar, and Ctrl-C after an epoch prints that
    epoch's result (marked interrupted), exit code 130, no traceback."""
    import signal
    import threading
    import time

    process = subprocess.Popen(
        [sys.executable, "-m", "study.train", "--model", "sasrec", "--dataset", "synthetic",
         "--set", "max_epochs=200", "--set", "max_len=20",
         "--set", "hidden_size=16", "--set", "num_heads=1", "--set", "measure_efficiency=false",
         "--set", "patience=0", "--set", "window_step=0"],  # one window per user: the count below
        cwd=REPO, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # as from a terminal: a test run started in the background (`cmd &` in a script) ignores SIGINT, and a
        # child inherits that, so its Ctrl-C would never arrive
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(iter(lambda: process.stderr.read(1), "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while "epoch=1" not in "".join(errors) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    process.wait(timeout=300)  # not communicate(): it would read stderr too, racing the reader thread
    out = process.stdout.read()
    reader.join(timeout=30)
    stderr = "".join(errors)
    assert process.returncode == 130, stderr[-2000:]
    from study.data import prepare

    prepared = prepare("synthetic", max_len=20, progress=False)  # the generator's defaults, as the CLI prepared them
    users, batch = json.loads((prepared / "meta.json").read_text())["num_users"], TrainConfig().batch_size
    assert f"cost estimate: {users:,} windows/epoch in {-(-users // batch)} steps" in stderr
    assert "s/step" in stderr or "step/s" in stderr  # the bar counts steps
    assert "Traceback" not in stderr and "interrupted during epoch" in stderr
    row = json.loads(out.strip().splitlines()[-1])
    assert row["status"] == "interrupted" and 1 <= row["epochs_run"] < 200 and 0 <= row["test_ndcg@10"] <= 1


def test_an_epoch_cost_scales_its_counts_not_its_step_time():
    """A streaming study estimates its epoch from a sample of the windows, scaled to every user."""
    from study.train.cost import EpochCost

    sample = EpochCost(windows=100, steps=2, tokens=5000, real_tokens=3000, computed_tokens=4000, step_s=0.5,
                       max_len=50, median_length=30.0)
    whole = sample.scaled(10.0)
    assert (whole.windows, whole.steps, whole.tokens, whole.real_tokens, whole.computed_tokens) == \
        (1000, 20, 50000, 30000, 40000)
    assert whole.step_s == 0.5 and whole.epoch_s == 10.0 and whole.padding == sample.padding
