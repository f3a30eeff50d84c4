"""Training state: a trial stopped after an epoch and resumed in a fresh process ends as an uninterrupted one."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from study.errors import UserError
from study.train.cli import main
from study.train.config import TrainConfig
from study.train.state import (
    STATE_FILE,
    TrainingState,
    continuation,
    identity_changes,
    load_state,
    model_identity,
    save_state,
)
from study.train.trainer import TrialData, run_trial

REPO = Path(__file__).resolve().parents[3]
SETTINGS = {"max_epochs": 3, "batch_size": 256, "measure_efficiency": False, "num_threads": 1, "max_len": 20,
            "hidden_size": 16, "num_layers": 1, "dropout": 0.3, "seed": 5}

RESUME = """
import json, sys
from study.train.state import load_state
from study.train.trainer import TrialData, run_trial
model, prepared, folder, settings = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
row = run_trial(model, TrialData.from_prepared(prepared, 20), settings, resume_from=load_state(folder))
print(json.dumps(row))
"""


class Killed(Exception):
    """Stands for the trial's process dying right after its checkpoint was written."""


def metric_fields(row: dict) -> dict:
    return {k: v for k, v in row.items() if k.startswith(("valid_", "test_")) or k in ("best_epoch", "epochs_run")}


# sasrec trains with dropout (torch's global generator); bert4rec also masks with the TrainStep's generator
@pytest.mark.slow
@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
def test_resumed_trial_equals_uninterrupted_one(model, synthetic_lastfm_prepared, tmp_path):
    data = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=20)
    straight = run_trial(model, data, SETTINGS)

    def stop_after_first_epoch(report) -> None:
        save_state(report.snapshot(), tmp_path)
        raise Killed

    with pytest.raises(Killed):
        run_trial(model, data, SETTINGS, callback=stop_after_first_epoch)
    state = load_state(tmp_path)
    assert state.epoch == 1 and state.best_epoch == 1 and state.best_weights is not None

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run([sys.executable, "-c", RESUME, model, str(synthetic_lastfm_prepared), str(tmp_path),
                           json.dumps(SETTINGS)], capture_output=True, text=True, env=env, timeout=600, check=True)
    resumed = json.loads(done.stdout.strip().splitlines()[-1])
    assert resumed["epochs_run"] == 3
    assert metric_fields(resumed) == metric_fields(straight)


def test_state_file_loads_with_weights_only_and_restores_every_generator(synthetic_lastfm_prepared, tmp_path):
    data = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=20)
    run_trial("sasrec", data, {**SETTINGS, "max_epochs": 2},
              callback=lambda report: save_state(report.snapshot(), tmp_path / str(report.epoch)))
    raw = torch.load(tmp_path / "2" / STATE_FILE, weights_only=True)
    assert set(raw["rng"]) >= {"torch", "python", "numpy_global", "numpy_generator", "step_generator"}
    assert raw["epoch"] == 2 and len(raw["epoch_times"]) == 2
    # the resumed trial skips the finished epochs: resuming after the last one trains nothing and keeps its result
    reports = []
    row = run_trial("sasrec", data, {**SETTINGS, "max_epochs": 2}, resume_from=load_state(tmp_path / "2"),
                    callback=reports.append)
    assert reports == [] and row["epochs_run"] == 2 and row["best_epoch"] == raw["best_epoch"]
    assert row["valid_ndcg@10"] == raw["best_valid"]["ndcg@10"]


def test_a_stopped_trial_continues_from_the_command_line_under_a_higher_epoch_limit(
        synthetic_lastfm_prepared, tmp_path, monkeypatch, capsys):
    """``python -m study.train --resume-from DIR --set max_epochs=N`` continues a trial that its epoch limit
    stopped, with the model, settings and dataset its state records, and ends as a trial given that limit from the
    start. A setting that would change what an epoch computes is refused, as is a folder without a state."""
    data = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=20)
    straight = run_trial("sasrec", data, SETTINGS)
    run_trial("sasrec", data, {**SETTINGS, "max_epochs": 2}, callback=lambda report: save_state(report.snapshot(),
                                                                                                 tmp_path))
    monkeypatch.setenv("SEQREC_DATA", str(synthetic_lastfm_prepared.parents[1]))  # the cache that holds it
    assert main(["--resume-from", str(tmp_path), "--set", "max_epochs=3", "--no-progress"]) == 0
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed["model"] == "sasrec" and resumed["config"]["max_epochs"] == 3 and resumed["epochs_run"] == 3
    assert metric_fields(resumed) == metric_fields(straight)

    assert main(["--resume-from", str(tmp_path), "--set", "max_epochs=3", "--set", "lr=0.01"]) == 2
    assert "--set may change only max_epochs, patience" in capsys.readouterr().err
    assert main(["--resume-from", str(tmp_path), "--model", "gru4rec"]) == 2
    assert "holds a sasrec trial on synthetic" in capsys.readouterr().err
    assert main(["--resume-from", str(tmp_path / "elsewhere")]) == 2
    assert f"holds no {STATE_FILE}" in capsys.readouterr().err


def test_a_state_is_continued_only_by_the_training_that_wrote_it(synthetic_lastfm_prepared, tmp_path):
    """A state written before a setting existed (here ``window_step``, whose default then meant each user's
    newest window and now means windows over the whole history) or under other settings is refused: its continued
    epochs would train another configuration than the earlier ones. When to stop and where to run may differ."""
    data = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=20)
    settings = {**SETTINGS, "max_epochs": 1, "window_step": 0}
    run_trial("bert4rec", data, settings, callback=lambda report: save_state(report.snapshot(), tmp_path))
    state = load_state(tmp_path)
    assert identity_changes(state.identity, state.identity) == []

    assert state.identity["settings"]["trim_padding"] is True  # `auto` on a CPU; a GPU node would not trim
    longer = {**settings, "max_epochs": 2, "patience": 30, "eval_batch_size": 64, "trim_padding": False}
    assert run_trial("bert4rec", data, longer, resume_from=state)["epochs_run"] == 2
    before_compile_modes = copy.deepcopy(state)
    del before_compile_modes.identity["settings"]["compile_mode"]  # how compile launches the step, as device is
    assert identity_changes(before_compile_modes.identity, state.identity) == []

    older = copy.deepcopy(state)
    del older.identity["settings"]["window_step"]
    with pytest.raises(UserError, match="window_step: not recorded -> 2"):  # 0.1 x max_len
        run_trial("bert4rec", data, {**longer, "window_step": None}, resume_from=older)
    with pytest.raises(UserError, match="mask_prob: 0.2 -> 0.4"):
        run_trial("bert4rec", data, {**longer, "mask_prob": 0.4}, resume_from=state)

    elsewhere = copy.deepcopy(state.identity)
    elsewhere["dataset"]["content_hash"] = "0" * 64
    elsewhere["model_config"]["hidden_size"] = 32
    digest = state.identity["dataset"]["content_hash"]
    assert identity_changes(state.identity, elsewhere) == ["hidden_size: 16 -> 32",
                                                           f"dataset content_hash: {digest} -> {'0' * 64}"]


def test_a_key_added_since_a_state_was_written_compares_as_the_run_had_it():
    """A state written before ``adam_beta2`` (trainer) or LISA's ``init`` (model) existed trained with Adam's 0.999
    and the per-matrix init: it continues as such, and is refused only where today's run would differ."""
    from dataclasses import asdict

    import models
    from study.schema import SCHEMA_KEY

    config = models.make_config("lisa", num_items=30).to_dict()
    dataset = {"name": "synthetic", "content_hash": "ab"}
    written = model_identity("lisa", {k: v for k, v in config.items() if k != "init"},
                             {k: v for k, v in asdict(TrainConfig()).items() if k != "adam_beta2"}, dataset)
    old = {k: v for k, v in written.items() if k != SCHEMA_KEY}  # written before schemas were stamped
    as_it_ran = model_identity("lisa", {**config, "init": "per_matrix"}, asdict(TrainConfig()), dataset)
    assert identity_changes(old, as_it_ran) == []
    today = model_identity("lisa", config, asdict(TrainConfig(adam_beta2=0.98)), dataset)
    assert identity_changes(old, today) == ["init: 'per_matrix' -> 'authors'", "adam_beta2: 0.999 -> 0.98"]

    state = TrainingState(epoch=1, model={}, optimizer={}, rng={}, best_valid={}, best_test={}, best_epoch=1,
                          best_weights=None, epochs_without_gain=0, identity=old)
    _, settings, _ = continuation(state, {"max_epochs": 9})
    assert (settings["init"], settings["adam_beta2"], settings["max_epochs"]) == ("per_matrix", 0.999, 9)
