"""The sweep's result helpers: atomic files, why a trial stopped, the Pareto front, and batch column shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from study.search.recorder import stop_reason
from study.search.records import atomic_write, atomic_write_text
from study.search.trial import as_windows, keep_trainable, tune_key


def test_atomic_write_replaces_whole_files_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "trials.csv"
    atomic_write_text(target, "a,b\n1,2\n")
    assert target.read_text() == "a,b\n1,2\n"

    def crash(out) -> None:
        out.write(b"half a fi")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, crash)
    assert target.read_text() == "a,b\n1,2\n"  # the old complete file survives
    assert [p.name for p in tmp_path.iterdir()] == ["trials.csv"]  # and no temporary file is left


@pytest.mark.parametrize(("last", "settings", "flags", "reason"), [
    ({"epoch": 10, "best_epoch": 4}, {"max_epochs": 10, "patience": 3}, (False, False), "max_epochs"),
    ({"epoch": 7, "best_epoch": 4}, {"max_epochs": 10, "patience": 3}, (False, False), "patience"),
    ({"epoch": 3, "best_epoch": 3}, {"max_epochs": 10, "patience": 3}, (True, False), "stopped"),
    ({"epoch": 3, "best_epoch": 3}, {"max_epochs": 10, "patience": 3}, (False, True), "study_time_budget"),
    ({"epoch": 3, "best_epoch": 3}, {"max_epochs": 10, "time_budget_s": 60}, (False, False), "trial_time_budget"),
])
def test_stop_reason(last: dict, settings: dict, flags: tuple, reason: str) -> None:
    scheduler_stop, study_budget_over = flags
    assert stop_reason("ok", last, settings, scheduler_stop=scheduler_stop,
                       study_budget_over=study_budget_over) == reason
    assert stop_reason("failed", last, settings, scheduler_stop=False, study_budget_over=False) == "error"


def test_batch_columns_become_two_dimensional_windows() -> None:
    rows = [np.array([0, 0, 3, 4], dtype=np.int32), np.array([0, 0, 0, 5], dtype=np.int32),
            np.array([1, 2, 3, 0], dtype=np.int32), np.array([6, 7, 8, 9], dtype=np.int32)]
    column = np.empty(len(rows), dtype=object)  # how Ray hands a fixed_size_list column to numpy
    column[:] = rows
    stacked = as_windows(column)
    assert stacked.shape == (4, 4) and stacked.dtype == np.int32
    assert as_windows(stacked) is stacked
    # only windows with an input item and a target survive, as in study.train.trainer.user_batches
    kept = keep_trainable({"user": np.arange(4), "train": column})
    assert kept["train"].tolist() == [[0, 0, 3, 4], [6, 7, 8, 9]]
    assert kept["user"].tolist() == [0, 3]  # each window keeps its user id


def test_objectives_read_validation_at_the_best_epoch() -> None:
    assert tune_key("valid_ndcg@10") == "best_valid_ndcg@10"
    assert tune_key("peak_mem_mb") == "peak_mem_mb"
    assert tune_key("epoch_time_s") == "median_epoch_time_s"


def test_a_resumed_sweep_keeps_the_epochs_a_running_trial_reported_before_the_kill(tmp_path: Path) -> None:
    """The driver appends each epoch of a running trial to trials/<id>.history.jsonl; a recorder restored after a
    kill -9 starts from those lines, and an epoch run again past the checkpoint replaces its line."""
    from types import SimpleNamespace

    from study.search.recorder import SweepRecorder

    trial = SimpleNamespace(trial_id="abc_00000")
    context = {"study_time_budget_s": 0}

    def report(recorder: SweepRecorder, epoch: int, ndcg: float) -> None:
        recorder.on_trial_result(0, [], trial, {"epoch": epoch, "valid_ndcg@10": ndcg, "train_loss": 1.0 / epoch,
                                                "training_iteration": epoch, "replayed": False})

    killed = SweepRecorder(str(tmp_path), context)
    killed.setup()
    for epoch, ndcg in [(1, 0.01), (2, 0.02), (3, 0.03)]:
        report(killed, epoch, ndcg)
    killed.close()  # its thread would have died with the killed driver
    partial = tmp_path / "trials" / "abc_00000.history.jsonl"
    with partial.open("a") as out:
        out.write('{"epoch": 4, "valid_nd')  # the kill cut the last line

    resumed = SweepRecorder(str(tmp_path), context)  # as Tuner.restore gives it: a fresh setup
    resumed.setup()
    assert [row["epoch"] for row in resumed.history["abc_00000"]] == [1, 2, 3]
    report(resumed, 3, 0.035)  # the checkpoint was epoch 2: epoch 3 runs again
    report(resumed, 4, 0.04)
    history = resumed.history["abc_00000"]
    assert [(row["epoch"], row["valid_ndcg@10"]) for row in history] == [(1, 0.01), (2, 0.02), (3, 0.035),
                                                                          (4, 0.04)]
    assert "training_iteration" not in history[0]  # Tune's bookkeeping is not an epoch column
    resumed.on_experiment_end([])
