"""The study's clock, its estimate against the time budget, and the folder lock, without Ray."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from study.errors import UserError
from study.search import budget
from study.search.budget import StudyClock, budget_grows, continue_note, fit_line, over_budget_line, spent_before
from study.search.console import StatusReporter
from study.search.lock import study_lock


def test_the_clock_counts_earlier_sessions_and_stops_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "clock.json").write_text(json.dumps({"spent_s": 95.0}))
    now = [1000.0]
    monkeypatch.setattr(budget.time, "time", lambda: now[0])
    signals: list[int] = []
    monkeypatch.setattr(budget.os, "kill", lambda pid, sig: signals.append(sig))
    clock = StudyClock(tmp_path, 100)
    assert clock.stop_all() is False and not clock.spent  # 95 s of 100 spent before this session
    now[0] += 4.0
    assert clock.stop_all() is False and not clock.spent
    now[0] += 2.0
    assert clock.stop_all() is False and clock.spent  # the signal, not Tune's stop-all, ends the study
    assert len(signals) == 1
    now[0] += 50.0
    assert clock.stop_all() is False and len(signals) == 1  # once
    assert spent_before(tmp_path) == pytest.approx(101.0)  # frozen when the budget ran out, not at shutdown
    assert "spent its time budget (101 s of budget.time_budget_s=100)" in over_budget_line("s", tmp_path, 100)
    assert over_budget_line("s", tmp_path, 200) is None and over_budget_line("s", tmp_path, 0) is None
    # the console's last words after that session: the same advice, wrapped to the console's width
    note = continue_note("a-study-with-a-long-name-" * 3, tmp_path, 100)
    assert len(note.splitlines()) == 2 and all(len(line) <= 120 for line in note.splitlines())
    assert " ".join(note.split()).endswith("to continue it, give it more: --resume --set budget.time_budget_s=200")
    assert continue_note("s", tmp_path, 200) is None


def test_a_clock_restored_from_tunes_state_is_this_sessions_clock(tmp_path: Path) -> None:
    old = StudyClock(tmp_path, 10)
    saved = pickle.dumps(old)
    current = StudyClock(tmp_path, 500).start_session()
    assert pickle.loads(saved) is current


def test_no_budget_never_stops(tmp_path: Path) -> None:
    clock = StudyClock(tmp_path, 0)
    assert clock.stop_all() is False and not clock.spent


def test_a_resume_may_give_more_time_or_samples_only() -> None:
    stored = {"num_samples": 8, "max_epochs": 10, "time_budget_s": 900}
    assert budget_grows(stored, {**stored, "time_budget_s": 1800})
    assert budget_grows(stored, {**stored, "time_budget_s": 0})  # no budget is the most time
    assert budget_grows(stored, {**stored, "num_samples": 12})
    assert not budget_grows(stored, {**stored, "time_budget_s": 600})
    assert not budget_grows(stored, {**stored, "num_samples": 4})
    assert not budget_grows(stored, {**stored, "max_epochs": 20})
    assert not budget_grows({**stored, "time_budget_s": 0}, stored)


def _study(samples: int, epochs: int, budget_s: float, grace: int | None) -> SimpleNamespace:
    return SimpleNamespace(budget=SimpleNamespace(num_samples=samples, max_epochs=epochs, time_budget_s=budget_s),
                           scheduler=SimpleNamespace(grace_period=grace) if grace else None)


def test_the_budget_line_says_whether_the_study_fits_and_what_would() -> None:
    assert fit_line(_study(8, 10, 0, 3), 20.0, 2) is None
    assert fit_line(_study(8, 10, 900, 3), 20.0, 2).endswith("~4 min to ~13 min (2 trials at once): it fits")
    # 4 waves of 2 trials, 3 to 10 epochs of 26.6 s: 5.3 to 17.7 min against 15 min
    line = " ".join(fit_line(_study(8, 10, 900, 3), 26.6, 2).split())  # unwrapped
    assert "it may not fit if ASHA stops few trials" in line and "budget.num_samples=6 would fit" in line
    assert "budget.time_budget_s=1277" in line and "shorter max_len" in line
    line = fit_line(_study(8, 10, 900, None), 100.0, 2)  # no scheduler: every trial runs 10 epochs
    assert "it will not fit" in line and all(len(part) <= 120 for part in line.splitlines())


def _trial(trial_id: str, status: str, result: dict) -> SimpleNamespace:
    return SimpleNamespace(trial_id=trial_id, status=status, last_result=result, config={})


def test_a_running_sweep_shows_each_trials_progress_and_says_once_when_epochs_run_slow() -> None:
    lines: list[str] = []
    reporter = StatusReporter({"best_valid_ndcg@10": ("valid_ndcg@10", "max")}, ["lr"], every_s=3600,
                              print_fn=lines.append, expected_epoch_s=10.0, progress_s=0.0,
                              budget_line=lambda epoch_s: f"{epoch_s:.0f} s an epoch")
    reporter.setup(total_samples=2)
    trials = [_trial("a", "RUNNING", {"epoch": 3, "best_valid_ndcg@10": 0.04, "median_epoch_time_s": 12.0}),
              _trial("b", "RUNNING", {})]
    reporter.report(trials, False)
    assert len(lines) == 1 and lines[0].startswith("[0:00:00] trials 0/2: 2 running")  # at the start: status only
    reporter.report(trials, False)
    assert lines[2:] == ["  a epoch 3  best valid_ndcg@10 0.04", "  b no epoch yet"]
    trials[1].last_result = {"epoch": 1, "best_valid_ndcg@10": 0.02, "median_epoch_time_s": 40.0}
    lines.clear()
    reporter.report(trials, False)
    assert lines[-2:] == ["epochs run 2.6x slower than estimated (26.0 s measured vs ~10.0 s): a busy machine",
                          "at the measured speed, 26 s an epoch"]
    lines.clear()
    reporter.report(trials, False)
    assert not any("slower" in line for line in lines)


def test_the_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path: Path, capsys) -> None:
    out = tmp_path / "study"
    with study_lock(out, "s"):
        holder = json.loads((out / "sweep.lock").read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(UserError, match=f"in use by another sweep of study 's' \\(process {os.getpid()} on"):
            with study_lock(out, "s"):
                pass
        assert (out / "sweep.lock").exists()  # the refused sweep leaves the holder's lock alone
    assert not (out / "sweep.lock").exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / "sweep.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout),
                                                "started_at": time.time() - 60}))
    with study_lock(out, "s"):
        assert json.loads((out / "sweep.lock").read_text())["pid"] == os.getpid()
    assert "is no longer running" in capsys.readouterr().out
    (out / "sweep.lock").write_text(json.dumps({"host": "another-host", "pid": 1, "started_at": 0}))
    with pytest.raises(UserError, match="process 1 on another-host"):
        with study_lock(out, "s"):
            pass
