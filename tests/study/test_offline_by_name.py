"""An offline user gives ``--source`` once: afterwards the dataset is used by name, by every command.

``prepare ml-100k --source ZIP`` keeps the archive in the cache; the zip is then deleted and the MovieLens URL
points at a closed port, so any download attempt would fail.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def offline_env(tmp_path: Path, ml100k_shaped_udata: Path) -> tuple[dict[str, str], Path]:
    lines = ml100k_shaped_udata.read_text().splitlines()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:  # GroupLens layout: ml-100k/u.data
        archive.writestr("ml-100k/u.data", "\n".join(lines) + "\n")
    zipped = tmp_path / "ml-100k.zip"
    zipped.write_bytes(buffer.getvalue())
    env = {**os.environ, "SEQREC_DATA": str(tmp_path / "cache"), "SEQREC_MOVIELENS_URL": "http://127.0.0.1:9/closed",
           "no_proxy": "127.0.0.1", "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE"}
    return env, zipped


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_prepare_once_then_train_and_sweep_by_name_offline(offline_env: tuple[dict[str, str], Path],
                                                           tmp_path: Path, ml100k_shaped_udata: Path) -> None:
    from study.data import load_prepared, prepare

    with pytest.MonkeyPatch.context() as patch:  # the statistics the listing should show, prepared apart
        patch.setenv("SEQREC_DATA", str(tmp_path / "expected"))
        expected = load_prepared(prepare("ml-100k", source=ml100k_shaped_udata, progress=False))

    env, zipped = offline_env
    done = run(["study.data", "prepare", "ml-100k", "--source", str(zipped), "--quiet"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    zipped.unlink()  # from now on only the cache holds the data

    listing = run(["study.data", "list"], env, tmp_path)
    assert listing.returncode == 0
    assert f"{expected.num_users:,} users, {expected.num_items:,} items" in listing.stdout
    assert "kept in the cache" in listing.stdout

    # each user's newest window only (window_step 0), here and in the sweep: what is checked is that the commands
    # find the data by name, not what the whole-history windows teach
    done = run(["study.train", "--model", "sasrec", "--dataset", "ml-100k", "--no-progress", "--set", "max_epochs=1",
                "--set", "max_len=30", "--set", "hidden_size=16", "--set", "num_layers=1", "--set", "num_heads=1",
                "--set", "inner_size=32", "--set", "measure_efficiency=false", "--set", "window_step=0"], env,
               tmp_path)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["dataset"] == "ml-100k" and row["epochs_run"] == 1

    done = run(["study.sweep", str(REPO / "search_spaces" / "sasrec.yaml"), "--num-cpus", "2", "--quiet",
                "--set", "budget.num_samples=1", "--set", "budget.max_epochs=1", "--set", "fixed.max_len=30",
                "--set", "fixed.measure_efficiency=false", "--set", "fixed.window_step=0"], env, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    trials = list((tmp_path / "results").glob("*/trials.csv"))
    assert len(trials) == 1 and len(trials[0].read_text().splitlines()) == 2  # header + the one trial
