"""The driver's SweepRecorder without Ray trials: records at once, tables rewritten off Tune's loop and complete at
the experiment's end, each trial's row built once, and a recorder that still pickles (Tune stores it)."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

import models
from study.schema import SCHEMA, SCHEMA_KEY
from study.search import recorder as recorder_module
from study.search.recorder import SweepRecorder, TableWriter
from study.search.records import read_records


def _recorder(tmp_path: Path) -> SweepRecorder:
    context = {"study": "s", "model": "sasrec", "model_defaults": models.model_class("sasrec").config_class().to_dict(),
               "dataset_meta": {"name": "synthetic"}, "base_settings": {"max_epochs": 2, "patience": 0},
               "study_time_budget_s": 0}
    return SweepRecorder(str(tmp_path), context)


def _finish(recorder: SweepRecorder, trial_id: str, started: float) -> None:
    trial = SimpleNamespace(trial_id=trial_id, config={"lr": 0.01})
    for epoch in (1, 2):
        recorder.on_trial_result(epoch, [], trial, {"epoch": epoch, "best_epoch": epoch, "train_loss": 1.0 / epoch,
                                                    "best_valid_ndcg@10": 0.1 * epoch, "trial_started_at": started,
                                                    "trial_compute_s": 1.0, "done": False})
    recorder.on_trial_complete(2, [], trial)


def test_records_at_once_tables_complete_at_the_end_and_each_row_built_once(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    build_row = recorder_module.build_row
    monkeypatch.setattr(recorder_module, "build_row", lambda context, record: built.append(record["trial_id"])
                        or build_row(context, record))
    recorder = _recorder(tmp_path)
    before = set(threading.enumerate())
    recorder.setup()
    started = {thread for thread in set(threading.enumerate()) - before if thread.name == "sweep-tables"}
    assert len(started) == 1  # the table writer's own thread
    for number in range(3):
        _finish(recorder, f"t{number}", started=100.0 + number)
        assert set(read_records(tmp_path / "trials")) == {f"t{n}" for n in range(number + 1)}  # durable already
    pickle.loads(pickle.dumps(recorder))  # Tune pickles its callbacks; the writer thread must not be in the way
    recorder.on_experiment_end(trials=[])
    trials = pd.read_parquet(tmp_path / "trials.parquet")
    assert trials["trial_id"].tolist() == ["t0", "t1", "t2"]
    assert trials["valid_ndcg@10"].tolist() == pytest.approx([0.2, 0.2, 0.2])
    assert len(pd.read_parquet(tmp_path / "history.parquet")) == 6
    assert pd.read_csv(tmp_path / "trials.csv")["trial_id"].tolist() == ["t0", "t1", "t2"]
    assert sorted(built) == ["t0", "t1", "t2"]  # not once per rewrite: that made a long sweep quadratic
    assert not any(thread.is_alive() for thread in started)  # ended with the experiment, not left running


def test_a_record_that_fails_at_the_budgets_end_still_ends_the_table_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The time budget records the trials it stopped in on_experiment_end; if that write fails (a full disk), the
    error reaches Tune and the table thread still ends, so a driver that goes on (a notebook, a test) keeps none."""
    recorder = _recorder(tmp_path)
    recorder.clock = SimpleNamespace(spent=True)
    before = set(threading.enumerate())
    recorder.setup()
    started = [thread for thread in set(threading.enumerate()) - before if thread.name == "sweep-tables"]
    trial = SimpleNamespace(trial_id="t0", config={"lr": 0.01})
    recorder.on_trial_result(1, [], trial, {"epoch": 1, "best_epoch": 1, "train_loss": 1.0,
                                            "best_valid_ndcg@10": 0.1, "done": False})

    def disk_full(records_dir: Path, record: dict) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(recorder_module, "write_record", disk_full)
    with pytest.raises(OSError, match="disk full"):
        recorder.on_experiment_end(trials=[trial])
    assert started and not any(thread.is_alive() for thread in started)


def test_a_resumed_recorder_keeps_the_earlier_records_in_its_tables(tmp_path: Path) -> None:
    first = _recorder(tmp_path)
    first.setup()
    _finish(first, "t0", started=100.0)
    first.on_experiment_end(trials=[])
    second = pickle.loads(pickle.dumps(first))  # what Tuner.restore does
    second.setup()
    _finish(second, "t1", started=101.0)
    second.on_experiment_end(trials=[])
    assert pd.read_parquet(tmp_path / "trials.parquet")["trial_id"].tolist() == ["t0", "t1"]


def test_a_failed_rewrite_is_raised_on_the_loops_thread() -> None:
    def fail() -> None:
        raise OSError("disk full")

    writer = TableWriter(fail)
    writer.request()
    with pytest.raises(OSError, match="disk full"):
        writer.close()


def test_a_trial_that_lost_its_process_is_recorded_again_and_a_replayed_failure_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    errors = {"lost": "ActorDiedError: The actor died unexpectedly before finishing this task.",
              "nan": "NonFiniteLoss: non-finite training loss at epoch 1"}
    first = _recorder(tmp_path)
    first.setup()
    for trial_id in errors:
        trial = SimpleNamespace(trial_id=trial_id, config={"lr": 0.01})
        first.on_trial_result(1, [], trial, {"epoch": 1, "best_epoch": 1, "train_loss": 1.0,
                                             "best_valid_ndcg@10": 0.1, "done": False})
        monkeypatch.setattr(recorder_module, "_error_message", lambda trial: errors[trial.trial_id])
        first.on_trial_error(1, [], trial)
    first.on_experiment_end(trials=[])
    records = read_records(tmp_path / "trials")
    assert [recorder_module.lost_process(records[t]) for t in errors] == [True, False]

    second = pickle.loads(pickle.dumps(first))  # --resume: the lost trial trains again, the other replays
    second.setup()
    assert [row["epoch"] for row in second.history["lost"]] == [1]  # kept, as a killed trial's epochs are
    trial = SimpleNamespace(trial_id="lost", config={"lr": 0.01})
    for epoch in (2, 3):  # as from a checkpoint at epoch 1
        second.on_trial_result(epoch, [], trial, {"epoch": epoch, "best_epoch": epoch, "train_loss": 1.0 / epoch,
                                                  "best_valid_ndcg@10": 0.1 * epoch, "done": False})
    second.on_trial_complete(3, [], trial)
    monkeypatch.setattr(recorder_module, "_error_message", lambda trial: "TrialFailed: " + errors["nan"])
    second.on_trial_error(1, [], SimpleNamespace(trial_id="nan", config={"lr": 0.01}))
    second.on_experiment_end(trials=[])
    resumed = read_records(tmp_path / "trials")
    assert (resumed["lost"]["status"], [row["epoch"] for row in resumed["lost"]["history"]]) == ("ok", [1, 2, 3])
    assert resumed["nan"] == records["nan"]
    trials = pd.read_parquet(tmp_path / "trials.parquet").set_index("trial_id")
    assert trials.loc["lost", "status"] == "ok" and trials.loc["nan", "error"] == errors["nan"]


def test_a_failure_after_a_trials_result_leaves_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A study killed with SIGKILL can have saved its experiment while a trial was running; the trial then finished
    and was recorded, and on --resume Tune fails to restore it from a checkpoint that no longer exists."""
    first = _recorder(tmp_path)
    first.setup()
    _finish(first, "t0", started=100.0)
    first.on_experiment_end(trials=[])
    written = (tmp_path / "trials" / "t0.json").read_bytes()
    second = pickle.loads(pickle.dumps(first))
    second.setup()
    monkeypatch.setattr(recorder_module, "_error_message", lambda trial: "ValueError: Could not recover from "
                        "checkpoint as it does not exist on storage anymore.")
    second.on_trial_error(0, [], SimpleNamespace(trial_id="t0", config={"lr": 0.01}))
    second.on_experiment_end(trials=[])
    assert (tmp_path / "trials" / "t0.json").read_bytes() == written
    assert pd.read_parquet(tmp_path / "trials.parquet")["status"].tolist() == ["ok"]


@pytest.mark.parametrize(("device", "trimmed"), [("cpu", True), ("cuda:0", False), (None, None)])
def test_a_row_records_the_trimming_that_ran_on_its_device(device: str | None, trimmed: bool | None) -> None:
    """`trim_padding` left to the trainer (auto) is recorded as the trainer resolved it for the trial's device; a
    trial that never reported keeps what was asked for."""
    context = {"study": "s", "model": "sasrec", "model_defaults": {}, "dataset_meta": {"name": "synthetic"},
               "base_settings": {"max_epochs": 2}}
    last = {"epoch": 1, "best_valid_ndcg@10": 0.1, **({"device": device} if device else {})}
    row = recorder_module.build_row(context, {"trial_id": "t0", SCHEMA_KEY: SCHEMA, "status": "completed", "config": {},
                                              "last_report": last})
    assert row["config.trim_padding"] is trimmed


@pytest.mark.parametrize(("model", "objective", "settings", "windows"), [
    ("bert4rec", "cloze", {}, (5, "all")), ("bert4rec", "cloze", {"max_len": 200}, (20, "all")),
    ("bert4rec", "cloze", {"window_step": 0}, (0, "all")), ("sasrec", "causal", {}, (10, "new")),
    ("gru4rec", "causal", {}, (10, "new")), ("hstu", "causal", {}, (10, "new")),
    ("lisa", "bce", {}, (10, "new")), ("linrec", "causal", {"causal": True}, (0, "all")),
    ("sasrec", "last", {}, (0, "all")), ("bert4rec", None, {}, (None, None))])
def test_a_row_records_the_windows_that_ran(model: str, objective: str | None, settings: dict,
                                            windows: tuple) -> None:
    """Windows left to the trainer are recorded as it resolved them for the objective and max_len (0.1 x max_len
    under cloze, max_len / 5 with new targets under causal, none under last); a trial that never reported its
    objective keeps what was asked for."""
    context = {"study": "s", "model": model, "model_defaults": {}, "dataset_meta": {"name": "synthetic"},
               "base_settings": {"max_epochs": 2, **settings}}
    last = {"epoch": 1, "best_valid_ndcg@10": 0.1, **({"objective": objective} if objective else {})}
    row = recorder_module.build_row(context, {"trial_id": "t0", SCHEMA_KEY: SCHEMA, "status": "completed", "config": {},
                                              "last_report": last})
    assert (row["config.window_step"], row["config.window_targets"]) == windows


def test_a_row_spreads_the_best_epochs_model_statistics_as_columns() -> None:
    """ELASTIC's expert usage (the best epoch's, which the last report carries) becomes ``extra.<key>`` columns
    beside the ``extra`` JSON; a model without statistics gets none."""
    context = {"study": "s", "model": "elastic", "model_defaults": {}, "dataset_meta": {"name": "synthetic"},
               "base_settings": {"max_epochs": 2}}
    usage = {"expert_usage_rate": 0.25, "expert_load_entropy_norm": 0.5, "expert_max_load": 0.125}
    last = {"epoch": 2, "best_valid_ndcg@10": 0.1, "extra_json": json.dumps(usage)}
    row = recorder_module.build_row(context, {"trial_id": "t0", "status": "completed", "config": {},
                                              "last_report": last})
    assert json.loads(row["extra"]) == usage
    assert {key: row[key] for key in row if key.startswith("extra.")} == {f"extra.{k}": v for k, v in usage.items()}
    bare = recorder_module.build_row(context, {"trial_id": "t1", "status": "completed", "config": {},
                                               "last_report": {"epoch": 1, "extra_json": "{}"}})
    assert not [key for key in bare if key.startswith("extra.")]


def test_a_trial_the_budget_stopped_then_a_kill_interrupted_keeps_every_epoch(tmp_path: Path) -> None:
    """The budget records a trial at epoch 2; a resume with more time continues it and is killed at epoch 4. The
    record holds epochs 1-2 and trials/<id>.history.jsonl only the epochs the continuation reported, so the next
    resume must join them: history.parquet once started at epoch 3 for such a trial."""
    trial = SimpleNamespace(trial_id="t0", config={"lr": 0.01})

    def report(recorder: SweepRecorder, epochs: range) -> None:
        for epoch in epochs:
            recorder.on_trial_result(epoch, [], trial, {"epoch": epoch, "best_epoch": epoch, "train_loss": 1.0,
                                                        "best_valid_ndcg@10": 0.1 * epoch, "done": False})

    stopped = _recorder(tmp_path)
    stopped.context["base_settings"] = {"max_epochs": 100, "patience": 0}
    stopped.clock = SimpleNamespace(spent=True)
    stopped.setup()
    report(stopped, range(1, 3))
    stopped.on_experiment_end(trials=[trial])
    assert read_records(tmp_path / "trials")["t0"]["stop_reason"] == "study_time_budget"

    continued = pickle.loads(pickle.dumps(stopped))
    continued.clock = SimpleNamespace(spent=False)
    continued.setup()
    report(continued, range(3, 5))
    continued.close()  # then SIGKILL: no record of the continuation, only its partial history

    resumed = pickle.loads(pickle.dumps(stopped))
    resumed.clock = SimpleNamespace(spent=False)
    resumed.setup()
    assert [row["epoch"] for row in resumed.history["t0"]] == [1, 2, 3, 4]
    report(resumed, range(4, 7))  # from the checkpoint of epoch 3
    resumed.on_trial_complete(6, [], trial)
    resumed.on_experiment_end(trials=[])
    assert [row["epoch"] for row in read_records(tmp_path / "trials")["t0"]["history"]] == [1, 2, 3, 4, 5, 6]
    assert pd.read_parquet(tmp_path / "history.parquet")["epoch"].tolist() == [1, 2, 3, 4, 5, 6]
