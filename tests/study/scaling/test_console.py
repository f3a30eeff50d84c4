"""A normal scaling run prints its first line and nothing else on stderr, and a summary that fits 120 columns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]


def test_scaling_console_is_clean_and_narrow(data_cache, tmp_path):
    study = {"name": "console",
             "dataset": {"name": "synthetic", "options": {"users": 300, "items": 500, "length": 40, "seed": 0}},
             "models": [{"model": "gru4rec"}], "lengths": [16, 32], "batch_sizes": [4], "modes": ["train"],
             "measure": {"warmup": 1, "repeats": 1, "timeout_s": 240, "memory_limit_mb": 2048},
             "fit": {"min_length": 16}, "storage": str(tmp_path / "results")}
    path = tmp_path / "scaling.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run([sys.executable, "-m", "study.scaling", str(path), "--num-cpus", "2"], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""  # a normal run's notes are on stdout
    assert " ".join(done.stdout.split()).startswith(f"study.scaling: validating {path}, then preparing its batches "
                                                    "and starting Ray")  # (wrapped to 120 columns)
    assert "2 cells (2 ok)" in done.stdout
    # the study's folder counts as /tmp/x: its length is the user's, and xdist's temp folders are deeper
    assert max(len(line.replace(str(tmp_path), "/tmp/x")) for line in done.stdout.splitlines()) <= 120
