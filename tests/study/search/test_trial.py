"""What a trial does with the record an earlier session left: replay it, raise its failure again, or train again
when its process was lost (the study stopped under it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray
from ray import tune

from study.search.trial import TrialFailed, TrialPlan, replay_recorded


def _plan(record: dict[str, Any] | None) -> TrialPlan:
    return TrialPlan(model="sasrec", base_settings={}, threads=1, measure_efficiency=False, records_dir="unused",
                     shuffle_rows=1, recorded={"t1": record} if record else {})


@pytest.fixture
def reports(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(tune, "get_context", lambda: SimpleNamespace(get_trial_id=lambda: "t1"))
    monkeypatch.setattr(tune, "report", lambda metrics, **kwargs: sent.append(metrics))
    return sent


def test_a_finished_trial_is_replayed(reports: list[dict[str, Any]]) -> None:
    record = {"status": "ok", "error": "", "last_report": {"epoch": 4, "best_valid_ndcg@10": 0.3}}
    assert replay_recorded(_plan(record)) is True
    assert reports == [{"epoch": 4, "best_valid_ndcg@10": 0.3, "replayed": True}]


def test_a_failure_of_its_own_is_raised_again(reports: list[dict[str, Any]]) -> None:
    record = {"status": "failed", "error": "NonFiniteLoss: non-finite training loss at epoch 1", "last_report": {}}
    with pytest.raises(TrialFailed, match="NonFiniteLoss"):
        replay_recorded(_plan(record))


@pytest.mark.parametrize("error", ["ActorDiedError: The actor died unexpectedly before finishing this task.",
                                   "ActorUnavailableError: The actor 3f is unavailable: RpcError: Socket closed"])
def test_a_trial_whose_process_was_lost_trains_again(reports: list[dict[str, Any]], error: str) -> None:
    assert replay_recorded(_plan({"status": "failed", "error": error, "last_report": {}})) is False
    assert replay_recorded(_plan(None)) is False  # and so does a trial with no record
    assert reports == []


def test_a_resumed_trial_reports_the_wall_time_of_its_earlier_runs_too() -> None:
    """Resumed from a checkpoint taken after 500 s of training, a trial reports 500 s more than this run took, so
    that a study stopped and resumed gets its whole training time in its rows and in the report."""
    import time

    from study.search.trial import EpochReporter

    def epoch(number: int) -> SimpleNamespace:
        return SimpleNamespace(epoch_time_s=1.0, throughput=10.0, flat=lambda: {"epoch": number}, extra={},
                               best_extra={}, snapshot=None, best_epoch=number, epoch=number,
                               train_energy_j=float("nan"))

    sent: list[dict[str, Any]] = []
    started = time.time() - 20.0
    checkpoint = SimpleNamespace(epoch_times=[1.0] * 3, throughputs=[10.0] * 3, train_energies=[float("nan")] * 3,
                                 elapsed_s=500.0)
    EpochReporter({"device": "cpu"}, 8, started, sent.append, resumed=checkpoint)(epoch(4))
    EpochReporter({"device": "cpu"}, 8, started, sent.append)(epoch(1))
    resumed, fresh = (report["trial_compute_s"] for report in sent)
    assert 520.0 <= resumed < 530.0 and 20.0 <= fresh < 30.0
    assert not ray.is_initialized()  # a reporter outside a trial does not start Ray (it did, for the rest of the run)


STOPPED_IN_A_CALLBACK = """
import weakref

from study.search.trial import quiet_exit_in_callbacks

quiet_exit_in_callbacks()
quiet_exit_in_callbacks()  # a reused worker installs it again


class Thing:
    pass


def stop(_):  # what Ray's SIGTERM handler does when the signal lands in a callback
    raise SystemExit(1)


def broken(_):
    raise ValueError("a real bug")


first, second = Thing(), Thing()
refs = [weakref.ref(first, stop), weakref.ref(second, broken)]
del first, second
print("still running")
raise SystemExit(3)
"""


def test_an_exit_dropped_in_a_callback_stays_off_the_console_and_other_errors_do_not() -> None:
    done = subprocess.run([sys.executable, "-c", STOPPED_IN_A_CALLBACK], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 3 and done.stdout == "still running\n"  # a SystemExit outside a callback still exits
    assert "SystemExit" not in done.stderr
    assert done.stderr.count("Exception ignored") == 1 and "ValueError: a real bug" in done.stderr
