"""A real tiny study on MovieLens-100K: export its best model, retrain from its config.yaml, recommend from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]


def run(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory: pytest.TempPathFactory, ml100k_shaped_udata: Path) -> tuple[Path, dict[str, str]]:
    """A two-trial study on a generated u.data that the ml-100k recipe accepts (tests/conftest.py): exporting and
    recommending are machinery, no real file is needed, and neither are the whole-history windows (each user's
    newest window trains; config.yaml carries that to the retraining below)."""
    root = tmp_path_factory.mktemp("export")
    env = {**os.environ, "SEQREC_DATA": str(root / "cache"), "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE"}
    study = root / "tiny.yaml"
    study.write_text(textwrap.dedent(f"""
        name: tiny-ml100k
        model: sasrec
        dataset: {{name: ml-100k, source: {ml100k_shaped_udata}}}
        fixed: {{max_len: 20, batch_size: 256, hidden_size: 16, num_layers: 1, num_heads: 1, inner_size: 32,
                measure_efficiency: false, window_step: 0}}
        search: {{lr: {{grid: [0.001, 0.005]}}}}
        sampler: grid
        budget: {{num_samples: 2, max_epochs: 2}}
        scheduler: none
        resources: {{cpu: 1}}
        storage: {root / "results"}
        """).lstrip())
    done = run(["study.sweep", str(study), "--num-cpus", "2", "--quiet"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "results", env


def test_export_best_model_reproduces_its_metrics_and_recommends(tiny_study, tmp_path, monkeypatch,
                                                                 ml100k_shaped_udata) -> None:
    results, env = tiny_study
    monkeypatch.setenv("SEQREC_DATA", env["SEQREC_DATA"])
    from study.data import load_prepared
    from study.export import export_model
    from study.recommend import load_exported, recommend
    from study.train.metrics import evaluate
    from study.train.trainer import TrialData

    trials = pd.read_parquet(results / "trials.parquet")
    best = trials.sort_values("valid_ndcg@10", ascending=False).iloc[0]
    out = export_model(results, tmp_path / "model")
    info = json.loads((out / "model.json").read_text())
    assert info["trial_id"] == best["trial_id"] and info["best_epoch"] == best["best_epoch"]
    assert info["dataset"]["content_hash"] == best["dataset_hash"]
    weights = torch.load(out / "model.pt", weights_only=True)
    assert all(isinstance(value, torch.Tensor) for value in weights.values())

    # the exported weights are the trial's best-validation weights: they score its recorded test metric exactly
    exported = load_exported(out)
    prepared = next((Path(env["SEQREC_DATA"]) / "prepared").glob("ml-100k-*"))
    data = TrialData.from_prepared(prepared, 20)
    test = evaluate(exported.model, data.test, batch_size=256, device=torch.device("cpu"))
    assert test["ndcg@10"] == pytest.approx(best["test_ndcg@10"], abs=1e-6)

    # the item map is the source's: every raw id is an item id of the u.data it was prepared from
    items = pd.read_parquet(out / "items.parquet")
    assert len(items) == info["dataset"]["num_items"] and items["raw_item"].is_unique
    source = pd.read_csv(ml100k_shaped_udata, sep="\t", header=None)
    assert set(items["raw_item"]) <= set(source.iloc[:, 1].astype(str))

    recs = recommend(exported, ["1", "2"], k=5)
    assert list(recs["user"]) == ["1"] * 5 + ["2"] * 5 and list(recs["rank"][:5]) == [1, 2, 3, 4, 5]
    dataset = load_prepared(prepared)
    raw_of = dict(zip(items["item"], items["raw_item"], strict=True))
    for user in ("1", "2"):
        row = list(dataset.raw_users).index(user)
        seen = {raw_of[int(i)] for i in dataset.history(row)}
        assert not seen & set(recs.loc[recs["user"] == user, "item"])  # history masked
    assert np.all(np.diff(recs.loc[recs["user"] == "1", "score"].to_numpy()) <= 0)
    unmasked = recommend(exported, ["1"], k=5, mask_history=False)
    assert unmasked["score"].iloc[0] >= recs["score"].iloc[0]

    # the CLI: every user to a file; a bad user id and a folder mixing datasets are one error line, exit 2
    done = run(["study.recommend", str(out), "--all", "--k", "3", "--output", str(tmp_path / "recs.parquet")], env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(pd.read_parquet(tmp_path / "recs.parquet")) == 3 * dataset.num_users
    done = run(["study.recommend", str(out), "--users", "1,999999"], env)
    assert done.returncode == 2 and done.stderr.startswith("error:") and "999999" in done.stderr
    meta = json.loads((out / "dataset.json").read_text())
    (out / "dataset.json").write_text(json.dumps({**meta, "content_hash": "0" * 64}))
    done = run(["study.recommend", str(out), "--users", "1"], env)
    assert done.returncode == 2 and done.stderr.startswith("error:") and "trained on dataset" in done.stderr
    (out / "dataset.json").write_text(json.dumps(meta))

    # config.yaml trains the same configuration again with study.train --config
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["hidden_size"] == 16 and config["lr"] == best["config.lr"] and "num_items" not in config
    done = run(["study.train", "--model", "sasrec", "--dataset", "ml-100k", "--config", str(out / "config.yaml"),
                "--set", "max_epochs=1", "--no-progress"], env)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["config"]["hidden_size"] == 16 and row["config"]["lr"] == best["config.lr"] and row["epochs_run"] == 1


def test_export_refuses_an_unknown_trial(tiny_study, tmp_path) -> None:
    results, env = tiny_study
    done = run(["study.export", str(results), "--trial", "nope", str(tmp_path / "model")], env)
    assert done.returncode == 2 and done.stderr.startswith("error:") and "no trial nope" in done.stderr


def test_export_cli_names_the_trial_it_exported(tiny_study, tmp_path) -> None:
    results, env = tiny_study
    trials = pd.read_parquet(results / "trials.parquet")
    best = trials.sort_values("valid_ndcg@10", ascending=False).iloc[0]
    done = run(["study.export", str(results), "--best", str(tmp_path / "model")], env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (f"exported trial {best['trial_id']} of study tiny-ml100k (the best on "
                                   f"valid_ndcg@10): valid_ndcg@10 {best['valid_ndcg@10']:.4f} at epoch "
                                   f"{best['best_epoch']}, to {tmp_path / 'model'}")
