"""``python -m study.report`` on folders that hold no report yet: refused before the analysis loads, and a study
whose trials are still running says which trials run and how far they got; console tables fit 120 columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from study import report as report_cli
from study.analysis.console import text_table
from study.layout import PARTIAL_HISTORY_SUFFIX

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "ray", "numpy", "pandas", "matplotlib", "seaborn", "scipy")


def _python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter that imports this checkout (not another one installed in editable mode)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_folder_that_is_no_study_is_refused_before_the_analysis_loads(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a study")
    for folder, what in (("empty", "empty folder"), ("other", "no trials.parquet here"),
                         ("missing", "no such results folder")):
        code = ("import json, sys, time; start = time.perf_counter(); from study import report; "
                f"code = report.main([{str(tmp_path / folder)!r}]); "
                f"print(json.dumps({{'code': code, 'loaded': [m for m in {HEAVY!r} if m in sys.modules], "
                "'seconds': time.perf_counter() - start}))")
        done = _python(code)
        outcome = json.loads(done.stdout)
        print(f"{folder}: refused in {outcome['seconds']:.2f} s")  # informative only: timings vary with the load
        assert outcome["code"] == 2 and outcome["loaded"] == [], done.stdout + done.stderr
        assert done.stderr.strip() == f"error: {tmp_path / folder}: {what}" + (
            "" if folder == "missing" else "; not a study's results folder (run python -m study.sweep first)")


def test_the_command_line_exits_2_with_one_error_line(tmp_path: Path) -> None:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "study.report", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    print(f"python -m study.report on an empty folder: {time.perf_counter() - start:.2f} s")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"error: {tmp_path}: empty folder; not a study's results folder "
                                        "(run python -m study.sweep first)"]


def _running_study(folder: Path, epochs: dict[str, int]) -> Path:
    """A sweep's folder while its trials run: study.yaml and each trial's epoch lines, no record, no table."""
    records = folder / "trials"
    records.mkdir(parents=True)
    (folder / "study.yaml").write_text("name: running\nmodel: sasrec\n")
    for trial_id, last in epochs.items():
        lines = [json.dumps({"epoch": e, "best_epoch": max(1, e - 1), "best_valid_ndcg@10": 0.01 * e,
                             "wall_time_s": 600.0 * e}) for e in range(1, last + 1)]
        (records / f"{trial_id}{PARTIAL_HISTORY_SUFFIX}").write_text("\n".join(lines) + "\n")
    return folder


def test_a_study_none_of_whose_trials_finished_says_which_run(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    folder = _running_study(tmp_path / "running", {"abc_00000": 12, "abc_00001": 3})
    assert report_cli.main([str(folder)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"error: {folder}: still running: none of its 2 trial(s) has finished")
    assert "abc_00000 at epoch 12, abc_00001 at epoch 3" in err[-1]
    assert "no trials.parquet here" not in "\n".join(err)
    table = err[:-1]
    assert table[1].split() == ["trial", "epoch", "best", "epoch", "best", "validation", "time", "(h:mm)"]
    assert table[2].split() == ["abc_00000", "12", "11", "valid_ndcg@10", "0.1200", "2:00"]
    assert table[3].split() == ["abc_00001", "3", "2", "valid_ndcg@10", "0.0300", "0:30"]
    assert all(len(line) <= 120 for line in err[:-1])


def test_a_study_whose_records_precede_its_table_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = _running_study(tmp_path / "running", {"abc_00001": 3})
    (folder / "trials" / "abc_00000.json").write_text(json.dumps({"trial_id": "abc_00000", "status": "ok"}))
    assert report_cli.main([str(folder)]) == 2
    assert "1 trial(s) finished but trials.parquet is not written yet" in capsys.readouterr().err


def test_text_tables_fit_120_columns_cutting_names_then_leaving_columns_off() -> None:
    rows = [{"model": "bert4rec@repro-ml100k-bert4rec-last-item-samples-" + "x" * 40, "n": "5",
             **{f"metric {i}": "0.0412 ± 0.0012*" for i in range(8)}} for _ in range(3)]
    lines = text_table(rows, shrink="model")
    assert all(len(line) <= 120 for line in lines)
    name = lines[1].split()[0]
    assert name == "bert4re…xxxxxxxx" and len(name) == 16  # cut to MIN_SHRUNK in its middle: start and end stay
    assert lines[-1].startswith("  (left off to fit 120 columns: metric ")
    kept = lines[0].split("metric")
    assert len(kept) - 1 + lines[-1].count("metric") == 8  # every metric is either shown or named as left off
    narrow = text_table([{"model": "sasrec", "n": "5", "NDCG@10": "0.0525 ± 0.0027"}])
    assert [line.split() for line in narrow] == [["model", "n", "NDCG@10"], ["sasrec", "5", "0.0525", "±", "0.0027"]]
    assert len(narrow[0]) == len(narrow[1])  # numbers right-aligned under their headers
