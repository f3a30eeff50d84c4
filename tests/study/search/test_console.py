"""What a researcher sees: short status lines, a clean stderr on a normal run, every output in the summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from study.search.console import WIDTH, StatusReporter, abbreviations

REPO = Path(__file__).resolve().parents[3]


def test_long_keys_get_unique_initials_and_short_keys_stay():
    keys = ["lr", "hidden_size", "num_layers", "dropout", "num_heads", "num_hashes", "attention_backend"]
    short = abbreviations(keys)
    assert short == {"lr": "lr", "hidden_size": "hs", "num_layers": "nl", "dropout": "dropout",
                     "num_heads": "num_heads", "num_hashes": "num_hashes", "attention_backend": "ab"}


def test_reporter_prints_a_legend_a_line_per_finished_trial_and_a_status_line():
    lines: list[str] = []
    reporter = StatusReporter({"best_valid_ndcg@10": ("valid_ndcg@10", "max")}, ["lr", "hidden_size"],
                              every_s=3600, print_fn=lines.append)
    reporter.setup(total_samples=3)

    def trial(trial_id: str, status: str, ndcg: float | None) -> SimpleNamespace:
        result = {} if ndcg is None else {"epoch": 2, "best_valid_ndcg@10": ndcg}
        return SimpleNamespace(trial_id=trial_id, status=status, last_result=result,
                               config={"lr": 0.00123456, "hidden_size": 64, "x" * 200: 1})

    running = [trial("a", "RUNNING", 0.1), trial("b", "PENDING", None), trial("c", "PENDING", None)]
    reporter.report(running, False)
    assert lines == ["keys: hs=hidden_size", lines[1]] and lines[1].startswith("[0:00:0")  # first report: status
    finished = [trial("a", "TERMINATED", 0.1), trial("b", "ERROR", None), trial("c", "TERMINATED", 0.3)]
    reporter.report(finished, True)
    assert lines[2] == "trial a done    epochs 2  valid_ndcg@10 0.1 | lr=0.001235 hs=64"
    assert lines[3] == "trial b failed | lr=0.001235 hs=64"
    assert lines[5].endswith("trials 3/3: 0 running, 0 pending, 2 done, 1 failed | best valid_ndcg@10 0.3 (c)")
    reporter.report(finished, True)
    assert len(lines) == 7  # finished trials are announced once; the final status is repeated only when done
    replicate = SimpleNamespace(trial_id="r", status="TERMINATED", last_result={}, config={"lr": 0.5, "seed": 3})
    assert reporter.trial_line(replicate) == "trial r done   | lr=0.5 seed=3"


def _run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=timeout)


def _check_console(done: subprocess.CompletedProcess, folder: Path) -> None:
    """Exit 0, nothing on stderr (no note, warning or traceback), stdout fits WIDTH columns.

    A line naming a file under ``folder`` counts that folder as ``/tmp/x``: the study's path is the user's, and
    pytest's temp folders are deeper under xdist than a results folder usually is."""
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]
    wide = [line for line in done.stdout.splitlines() if len(line.replace(str(folder), "/tmp/x")) > WIDTH]
    assert wide == [], wide


@pytest.mark.slow
def test_sweep_and_replicate_consoles_are_clean_and_narrow(write_tiny_sweep, data_cache, tmp_path):
    out = tmp_path / "results"
    study = write_tiny_sweep(tmp_path / "tiny.yaml", name="console", storage=out, samples=2, max_concurrent=1)
    done = _run(["study.sweep", str(study), "--num-cpus", "2"])
    # every note of a normal run (its first line, what a short budget adapted, the cost of the largest config) is
    # on stdout: stderr stays empty
    _check_console(done, tmp_path)
    assert done.stdout.startswith("study.sweep: validating ")
    assert "adapted to the budget: " in done.stdout and "cost estimate: " in done.stdout
    stdout = done.stdout.splitlines()
    assert sum(line.startswith("trial ") and " done " in line for line in stdout) == 2
    files = stdout[stdout.index(f"files in {out}:") + 1:]
    assert {"  trials.parquet", "  optuna.db", "  trials/", "  tune/"} <= set(files)

    done = _run(["study.replicate", str(out), "--seeds", "1", "--select", "top:1", "--first-seed", "7",
                 "--num-cpus", "2"])
    _check_console(done, tmp_path)
    assert " ".join(done.stdout.split()).startswith("study.replicate: selecting configurations of ")  # (wrapped)
    assert "1 replicate(s) ok, 0 failed" in done.stdout and "Configuration for experiment" not in done.stdout


def test_tunes_failure_and_ctrl_c_messages_are_kept_off_the_console(capsys) -> None:
    """Tune handles SIGINT itself and returns from fit() normally; the runner must still know (to exit 130 with its
    own --resume line) and must not pass on Tune's 'Tuner.restore' advice. A failed trial's traceback stays in its
    error.txt: the sweep's records and summary name the failure."""
    import logging

    from study.search.runner import TuneMessages

    tune_log = logging.getLogger("ray.tune.tune")
    controller_log = logging.getLogger("ray.tune.execution.tune_controller")
    state_log = logging.getLogger("ray.tune.execution.experiment_state")
    handler = logging.StreamHandler()
    for log in (tune_log, controller_log, state_log):
        log.addHandler(handler)
    try:
        with TuneMessages() as messages:
            tune_log.warning("Trial finished reporting")
            state_log.warning("Experiment state snapshotting has been triggered multiple times in the last 5.0 s")
            controller_log.error("Trial task failed for trial sweep_trial_abc", exc_info=ValueError("nan"))
            tune_log.error("Trials did not complete: %s", ["sweep_trial_abc"])
            assert not messages.interrupted
            tune_log.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run. ...")
            tune_log.warning("Experiment has been interrupted, but the most recent state was saved.\nResume: x")
        tune_log.warning("Stop signal received after the sweep")  # the filter is gone with the block
    finally:
        for log in (tune_log, controller_log, state_log):
            log.removeHandler(handler)
    assert messages.interrupted
    err = capsys.readouterr().err
    assert "Trial finished reporting" in err and "Stop signal received after the sweep" in err
    assert "failed" not in err and "did not complete" not in err and "ending Ray Tune run" not in err
    assert "snapshotting" not in err
