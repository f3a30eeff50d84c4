"""Trial checkpoints in a real sweep: kill -9 in the middle of a trial, --resume, and the trial goes on from its last
checkpoint (no epoch up to it runs twice) to the result an uninterrupted trial gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
EPOCHS = 6

pytestmark = [pytest.mark.slow]


def reported_epochs(out: Path) -> list[int]:
    """Epochs in the order the one trial reported them to Tune, over every session (Tune appends to result.json)."""
    files = list((out / "tune").glob("*/result.json"))
    if not files:
        return []
    lines = files[0].read_text().splitlines()
    return [json.loads(line)["epoch"] for line in lines if line.strip()]


def checkpoint_folders(out: Path) -> list[Path]:
    return sorted((out / "tune").glob("*/checkpoint_*"))


def test_a_killed_trial_resumes_from_its_last_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         kill_session, synthetic_lastfm_file: Path) -> None:
    source = synthetic_lastfm_file  # a LastFM-format file (tests/conftest.py): checkpoints are machinery
    out = tmp_path / "out"
    study = tmp_path / "ckpt.yaml"
    study.write_text(textwrap.dedent(f"""
        name: ckpt-resume
        model: sasrec
        dataset: {{name: lastfm, source: {source}}}
        fixed: {{max_len: 20, batch_size: 128, hidden_size: 16, num_layers: 1, num_heads: 1, inner_size: 32,
                measure_efficiency: false, patience: 0, window_step: 0}}
        search: {{lr: {{choice: [0.003]}}}}
        sampler: random
        budget: {{num_samples: 1, max_epochs: {EPOCHS}}}
        scheduler: none
        checkpoint: {{every: 1, keep: 2}}
        resources: {{cpu: 1, max_concurrent: 1}}
        storage: {out}
        """).lstrip())
    env = {**os.environ, "SEQREC_DATA": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "study.sweep", str(study), "--num-cpus", "2", "--quiet"]
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and first.poll() is None and len(reported_epochs(out)) < 2:
            time.sleep(0.1)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert len(reported_epochs(out)) >= 2, "the trial reported no two epochs in time"
    finally:
        kill_session(first.pid)
        first.wait(timeout=60)
        log.close()
    before = reported_epochs(out)
    assert before[-1] < EPOCHS, "the trial finished before it could be killed"
    kept = checkpoint_folders(out)
    assert 1 <= len(kept) <= 2  # keep: 2

    resumed = subprocess.run(command + ["--resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = reported_epochs(out)[len(before):]
    # the resumed trial starts right after a checkpoint written before the kill (at best the last one): nothing up
    # to that checkpoint is trained again, and it runs to the end
    assert after and after[0] > 1, (before, after)
    assert after == list(range(after[0], EPOCHS + 1))
    assert after[0] - 1 >= before[-1] - 1
    trials = pd.read_parquet(out / "trials.parquet")
    assert len(trials) == 1 and trials["status"].iloc[0] == "ok"
    assert trials["epochs_run"].iloc[0] == EPOCHS
    # the study's history keeps the epochs before the kill, and none twice
    assert pd.read_parquet(out / "history.parquet")["epoch"].tolist() == list(range(1, EPOCHS + 1))

    # the same trial run straight through gives the same metrics (same seed, same batches, restored generators)
    straight = subprocess.run([sys.executable, "-m", "study.train", "--model", "sasrec", "--dataset", "lastfm",
                               "--source", str(source), "--no-progress",
                               *[f"--set={key}={value}" for key, value in {
                                   "max_len": 20, "batch_size": 128, "hidden_size": 16, "num_layers": 1,
                                   "num_heads": 1, "inner_size": 32, "measure_efficiency": "false", "lr": 0.003,
                                   "patience": 0, "max_epochs": EPOCHS, "num_threads": 1, "window_step": 0}.items()]],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert straight.returncode == 0, straight.stderr[-3000:]
    row = json.loads(straight.stdout.strip().splitlines()[-1])
    for key in ("valid_ndcg@10", "test_ndcg@10", "best_epoch"):
        assert trials[key].iloc[0] == row[key], key

    # the trial kept its best model; without that folder (a cluster run) its last checkpoint gives the same weights
    from study.export import export_model

    trial_id = trials["trial_id"].iloc[0]
    kept_info = json.loads((out / "models" / trial_id / "model.json").read_text())
    assert kept_info["best_epoch"] == trials["best_epoch"].iloc[0]
    kept_weights = torch.load(out / "models" / trial_id / "model.pt", weights_only=True)
    shutil.rmtree(out / "models")
    monkeypatch.setenv("SEQREC_DATA", env["SEQREC_DATA"])
    exported = export_model(out, tmp_path / "export")
    assert json.loads((exported / "model.json").read_text())["best_epoch"] == kept_info["best_epoch"]
    from_checkpoint = torch.load(exported / "model.pt", weights_only=True)
    assert all(torch.equal(kept_weights[name], from_checkpoint[name]) for name in kept_weights)
