"""The study's time budget and the one-sweep-per-folder lock, end to end through the CLI.

One sweep of two concurrent trials runs until its time budget ends under them. While it runs, a second sweep under
the same name is refused; afterwards the stopped trials are results, a resume without more time says so in one
line, and a resume with more time continues both trials from their checkpoints, losing and repeating no epoch.
Subprocesses with their own embedded Ray, as a researcher runs them; a finished study's resumes run the command in
this process.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest

from study.layout import CLOCK_FILE

REPO = Path(__file__).resolve().parents[3]
# window_step 0: the newest window of each user only, an eighth of a whole-history epoch; what these tests check
# does not depend on the windows
TINY_MODEL = ("{max_len: 20, batch_size: 128, hidden_size: 16, num_layers: 1, num_heads: 1, inner_size: 32, "
              "window_step: 0")

pytestmark = pytest.mark.slow


def _history_epochs(record: dict) -> list[int]:
    return [int(row["epoch"]) for row in record["history"]]


def _checkpoints_per_trial(out: Path) -> list[int]:
    """How many checkpoint folders each trial of the study keeps in ``tune/``."""
    return [len(list(trial.glob("checkpoint_*"))) for trial in (out / "tune").iterdir() if trial.is_dir()]


def _check_stopped_trials_are_results(out: Path, stdout: str) -> dict[str, dict]:
    """The records, tables, summary and Optuna study of a sweep whose budget stopped its two trials; returns the
    stopped trials' records by trial id."""
    records = {p.stem: json.loads(p.read_text()) for p in (out / "trials").glob("*.json")}
    stopped = {tid: r for tid, r in records.items() if r["stop_reason"] == "study_time_budget"}
    assert len(stopped) == 2, {tid: r["stop_reason"] for tid, r in records.items()}
    for record in stopped.values():
        epochs = _history_epochs(record)
        assert record["status"] == "ok" and epochs == list(range(1, len(epochs) + 1)) and epochs
        assert record["last_report"]["best_valid_ndcg@10"] == max(r["valid_ndcg@10"] for r in record["history"])
    trials = pd.read_parquet(out / "trials.parquet")
    assert set(trials["trial_id"]) == set(records)
    best = trials.sort_values("valid_ndcg@10", ascending=False).iloc[0]
    assert "best by valid_ndcg@10 (max):" in stdout
    summary_rows = stdout.split("best by valid_ndcg@10 (max):", 1)[1].splitlines()
    assert summary_rows[2].split()[0] == best["trial_id"]  # the summary's best is the records' best
    assert "2 stopped by the study's time budget" in stdout
    # its last words say how to continue the trials it stopped (those stopped before their first epoch, which have
    # no record, too)
    last_words = " ".join(stdout.split())
    assert re.search(r"to continue it, give it more: --resume --set budget\.time_budget_s=\d+$", last_words)
    optuna_db = f"sqlite:///{out / 'optuna.db'}"
    told = {t.user_attrs.get("tune_trial_id"): t for t in optuna.load_study(study_name="budget-resume",
                                                                             storage=optuna_db).trials}
    for trial_id, record in stopped.items():  # Optuna has their values, not a FAIL
        assert told[trial_id].state == optuna.trial.TrialState.COMPLETE
        assert told[trial_id].values == [record["last_report"]["best_valid_ndcg@10"]]
    return stopped


def _check_resumed_trials_went_on(out: Path, stopped: dict[str, dict]) -> None:
    """Every trial the budget stopped went on after a resume with more time, losing and repeating no epoch."""
    final = {p.stem: json.loads(p.read_text()) for p in (out / "trials").glob("*.json")}
    assert set(stopped) <= set(final)  # (the third sample starts only if a slot frees up before the new budget ends)
    for trial_id, before in stopped.items():
        epochs = _history_epochs(final[trial_id])
        assert epochs == list(range(1, len(epochs) + 1)), "an epoch lost or repeated"
        assert len(epochs) > len(_history_epochs(before)), "the resumed trial went on from where it stopped"
        # the epochs before the stop keep their metrics (an epoch after the last checkpoint may run again, with
        # the same metrics and its own timings)
        kept = [{k: v for k, v in row.items() if k.startswith(("valid_", "best_")) or k in ("epoch", "train_loss")}
                for row in final[trial_id]["history"][:len(before["history"])]]
        assert kept == [{k: v for k, v in row.items() if k in kept[0]} for row in before["history"]]
    history = pd.read_parquet(out / "history.parquet")
    assert not history.duplicated(["trial_id", "epoch"]).any()
    assert max(_checkpoints_per_trial(out)) == 1


def test_a_time_budget_keeps_the_trials_it_stops_and_a_resume_with_more_time_continues_them(
        tmp_path: Path, synthetic_lastfm_file: Path) -> None:
    out = tmp_path / "out"
    study = tmp_path / "budget.yaml"
    study.write_text(textwrap.dedent(f"""
        name: budget-resume
        model: sasrec
        dataset: {{name: lastfm, source: {synthetic_lastfm_file}}}
        fixed: {TINY_MODEL}, measure_efficiency: false, patience: 1000}}
        search:
          lr: {{loguniform: [1.0e-3, 1.0e-2]}}
        budget: {{num_samples: 3, max_epochs: 1000, time_budget_s: 30}}
        scheduler: none
        resources: {{cpu: 1, max_concurrent: 2}}
        checkpoint: {{every: 1, keep: 1}}
        storage: {out}
        """).lstrip())
    env = {**os.environ, "SEQREC_DATA": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "study.sweep", str(study), "--num-cpus", "2"]
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and first.poll() is None and not (out / "sweep.lock").exists():
            time.sleep(0.2)
        # a second sweep under the same name while the first runs: one line naming the holder, exit 2
        second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.strip().splitlines() == [second.stderr.strip()]
        assert f"process {first.pid} on" in second.stderr and "in use by another sweep" in second.stderr
        stdout, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr[-3000:]
    assert not (out / "sweep.lock").exists()
    # keep: 1, also where the budget stopped a trial after it wrote a checkpoint the driver never registered
    assert max(_checkpoints_per_trial(out)) == 1

    stopped = _check_stopped_trials_are_results(out, stdout)

    # the budget is spent: a resume says so in one line and how to give more time
    again = subprocess.run(command + ["--resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "spent its time budget" in again.stderr, again.stderr[-2000:]
    assert "--set budget.time_budget_s=" in again.stderr

    # the budget covers the whole study, so a resume gets what the new budget leaves after the first session's
    # spent time; leave it a fixed 40 s, whatever that session overran by: restoring two trials (their actors, the
    # data, the checkpoints) takes most of that on a slow machine, and each must still train an epoch after it
    more_time = math.ceil(json.loads((out / CLOCK_FILE).read_text())["spent_s"]) + 40
    resumed = subprocess.run(command + ["--resume", "--set", f"budget.time_budget_s={more_time}"], cwd=REPO,
                             env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "╭" not in resumed.stdout and "AIR_VERBOSITY" not in resumed.stderr  # no Tune tables on a resume
    _check_resumed_trials_went_on(out, stopped)


def test_a_finished_study_resumes_only_with_more_samples(tmp_path: Path, synthetic_lastfm_file: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """The command's own main() four times on one Ray started here: what a resume refuses or replays is the
    driver's logic, and each session in a fresh process with its own Ray (the test above) would add a Ray start and
    the imports three times over."""
    import ray

    from study import sweep
    from study.cluster import start_ray

    out = tmp_path / "out"
    study = tmp_path / "samples.yaml"
    study.write_text(textwrap.dedent(f"""
        name: more-samples
        model: sasrec
        dataset: {{name: lastfm, source: {synthetic_lastfm_file}}}
        fixed: {TINY_MODEL}, measure_efficiency: false}}
        search:
          lr: {{loguniform: [1.0e-3, 1.0e-2]}}
        budget: {{num_samples: 1, max_epochs: 1}}
        scheduler: none
        storage: {out}
        """).lstrip())
    monkeypatch.setenv("SEQREC_DATA", str(tmp_path / "cache"))
    command = [str(study), "--quiet"]

    def run(*extra: str) -> tuple[int, str, str]:
        code = sweep.main(command + list(extra))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    start_ray("local", num_cpus=2, quiet=True)
    try:
        code, _, err = run()
        assert code == 0, err[-3000:]
        code, stdout, err = run("--resume")
        assert code == 0 and "has run all its budget.num_samples=1 trials" in stdout, err
        assert "1 trials: 1 ok" in stdout  # replayed, not trained again
        code, _, err = run("--resume", "--set", "budget.max_epochs=2")
        # one line naming the setting the command changed, with the study's value and the one given
        assert code == 2 and "differs from this study in: budget.max_epochs: 1 -> 2. --resume" in err, err
        code, _, err = run("--resume", "--set", "budget.num_samples=2")
        assert code == 0, err[-3000:]
    finally:
        ray.shutdown()
    trials = pd.read_parquet(out / "trials.parquet")
    assert len(trials) == 2 and (trials["status"] == "ok").all()
    assert "num_samples: 2" in (out / "study.yaml").read_text()
