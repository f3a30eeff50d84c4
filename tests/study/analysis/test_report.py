"""End to end: two tiny sweeps (SASRec, GRU4Rec) through the lastfm recipe, on a synthetic S3Rec file (no
``../shared`` needed), two replicate seeds each, one report.

The studies run once per module on one Ray instance (2 CPUs): sweep CLI → replicate CLI → report CLI, then the
outputs are checked against their inputs (fronts by brute force, tests against scipy on the replicate rows).
Bad input is checked on copies of those folders, without Ray.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from study import replicate as replicate_cli
from study import report as report_cli
from study.analysis.runs import config_id

pytestmark = pytest.mark.slow

MODELS = ("sasrec", "gru4rec")
# max_concurrent 1: the second trial of each run reuses the first one's actor (Tune's reuse_actors), which saves the
# fresh process's imports, a fifth of the fixture's CPU time; what is checked does not depend on trials overlapping
STUDY_YAML = """\
name: {name}
model: {model}
dataset: {{name: lastfm, source: {source}}}
protocol: {{objective: auto, eval_mode: full}}
fixed: {{max_len: 20, batch_size: 512, window_step: 0}}
search:
  hidden_size: {{grid: [16, 32]}}
objectives: {{valid_ndcg@10: max, peak_mem_mb: min, infer_ms_p50: min}}
budget: {{num_samples: 2, max_epochs: 1}}
scheduler: none
resources: {{cpu: 1, gpu: 0, max_concurrent: 1}}
storage: {storage}
"""


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory, synthetic_lastfm_file: Path) -> dict[str, Path]:
    """results/<study> of both models, each with a sweep of 2 trials and 2 replicates of its best configuration."""
    import ray

    from study import sweep
    from study.cluster import WORKER_ENV

    root = tmp_path_factory.mktemp("analysis")
    folders = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEQREC_DATA", str(root / "cache"))  # never the user's cache
        ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": WORKER_ENV})
        try:
            for model in MODELS:
                folder = root / "results" / f"lastfm-{model}"
                spec = root / f"{model}.yaml"
                spec.write_text(STUDY_YAML.format(name=f"lastfm-{model}", model=model, storage=folder,
                                                  source=synthetic_lastfm_file))
                assert sweep.main([str(spec), "--quiet"]) == 0
                assert replicate_cli.main([str(folder), "--seeds", "2", "--select", "top:1", "--quiet"]) == 0
                folders[model] = folder
        finally:
            ray.shutdown()
        out = root / "report"
        assert report_cli.main([str(folders["sasrec"]), str(folders["gru4rec"]), "--out", str(out)]) == 0
        folders["report"] = out
        folders["cache"] = root / "cache"
        folders["source"] = synthetic_lastfm_file
        yield folders


def test_replicates_are_linked_to_their_source_trial(studies: dict[str, Path]) -> None:
    for model in MODELS:
        trials = pd.read_parquet(studies[model] / "trials.parquet")
        reps = pd.read_parquet(studies[model] / "replicates.parquet")
        assert len(reps) == 2 and (reps["status"] == "ok").all()
        assert sorted(reps["seed"]) == [1, 2]
        assert set(trials.columns) <= set(reps.columns)  # the same result schema, plus the links
        assert reps["source_trial_id"].nunique() == 1
        source = trials[trials["trial_id"] == reps["source_trial_id"].iloc[0]].iloc[0]
        # top:1 on validation: the source is the sweep's best trial, and the replicate runs its exact settings
        assert source["valid_ndcg@10"] == trials["valid_ndcg@10"].max()
        for _, row in reps.iterrows():
            assert row["config_id"] == config_id(source["config"]) == config_id(row["config"])
            assert json.loads(row["config"])["seed"] == row["seed"]
        assert (reps["stop_reason"] == "max_epochs").all() and (reps["epochs_run"] == 1).all()
        assert (studies[model] / "replicates" / "001" / "plan.json").is_file()


def test_replicating_again_plans_nothing_and_refuses_old_seeds(studies: dict[str, Path], data_cache: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    folder = str(studies["sasrec"])
    assert replicate_cli.main([folder, "--seeds", "2", "--select", "top:1", "--dry-run"]) == 0
    assert "nothing to replicate" in capsys.readouterr().out
    assert replicate_cli.main([folder, "--seeds", "3", "--select", "pareto", "--dry-run"]) == 0
    assert "seeds 3" in capsys.readouterr().out  # seeds 1 and 2 exist for the best configuration: only 3 is new
    assert replicate_cli.main([folder, "--seeds", "2", "--first-seed", "0", "--dry-run"]) == 2
    assert "already ran with seed 0" in capsys.readouterr().err


def test_report_files(studies: dict[str, Path]) -> None:
    out = studies["report"]
    markdown = (out / "report.md").read_text()
    for section in ("## Studies and protocol", "## Dataset", "## Environment", "## Results", "## Significance",
                    "## Pareto fronts", "Hypervolume reference point"):
        assert section in markdown
    assert "SYNTHETIC" not in markdown and "MIXED PROTOCOLS" not in markdown
    users = len(studies["source"].read_text().splitlines())
    assert "| lastfm |" in markdown and f"{users:,}" in markdown  # dataset statistics from the prepared copy
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3 and "<img" in html and 'src="pareto' not in html
    for a, b in (("valid_ndcg_10", "peak_mem_mb"), ("valid_ndcg_10", "infer_ms_p50"), ("peak_mem_mb", "infer_ms_p50")):
        for suffix in ("png", "svg"):
            assert (out / f"pareto_{a}__{b}.{suffix}").stat().st_size > 1000
    assert (out / "hyperparameters_sasrec.png").is_file()
    for stem in ("results", "selected", "configurations", "pareto_front", "pareto_2d", "hypervolume", "significance",
                 "hv_reference", "studies", "datasets", "environment"):
        assert (out / f"{stem}.csv").is_file() and (out / f"{stem}.parquet").is_file()


def test_results_table_uses_the_replicates(studies: dict[str, Path]) -> None:
    out = studies["report"]
    selected = pd.read_parquet(out / "selected.parquet")
    assert sorted(selected["label"]) == ["gru4rec", "sasrec"]
    assert (selected["source"] == "replicate").all() and (selected["n_seeds"] == 2).all()
    results = pd.read_parquet(out / "results.parquet")
    for model in MODELS:
        reps = pd.read_parquet(studies[model] / "replicates.parquet")
        row = results[(results["label"] == model) & (results["metric"] == "test_ndcg@10")].iloc[0]
        assert row["mean"] == pytest.approx(reps["test_ndcg@10"].mean())
        assert row["std"] == pytest.approx(reps["test_ndcg@10"].std(ddof=1))
    table = pd.read_csv(out / "results_formatted.csv", dtype=str)
    for column in ("HR@10", "NDCG@10", "MRR@10", "HR@20", "NDCG@20", "MRR@20"):
        cells = table.loc[table["model"].isin(MODELS), column]
        assert cells.str.contains("±").all()
        assert cells.str.startswith("**").sum() >= 1  # the best mean is bold
    assert table["model"].iloc[-1].startswith("Improv.")


def test_significance_equals_scipy_on_the_replicate_rows(studies: dict[str, Path]) -> None:
    sig = pd.read_parquet(studies["report"] / "significance.parquet")
    assert len(sig) == 6 and set(sig["candidate"]) == {"gru4rec"} and set(sig["reference"]) == {"sasrec"}
    assert (sig["test"] == "paired-t").all() and (sig["n_pairs"] == 2).all()
    reps = {m: pd.read_parquet(studies[m] / "replicates.parquet").set_index("seed").sort_index() for m in MODELS}
    for _, row in sig.iterrows():
        a, b = reps["gru4rec"][row["metric"]], reps["sasrec"][row["metric"]]
        expected = stats.ttest_rel(a, b)
        if np.isnan(expected.pvalue):
            assert np.isnan(row["p"])
        else:
            assert row["p"] == pytest.approx(expected.pvalue)
            assert row["t"] == pytest.approx(expected.statistic)
        assert row["mean_diff"] == pytest.approx((a - b).mean())
    testable = sig["p"].notna()
    m = int(testable.sum())
    assert (sig.loc[testable, "p_holm"] >= sig.loc[testable, "p"] - 1e-12).all()
    assert (sig.loc[testable, "p_holm"] <= np.minimum(1, m * sig.loc[testable, "p"]) + 1e-12).all()


def test_pareto_front_is_the_non_dominated_set(studies: dict[str, Path]) -> None:
    out = studies["report"]
    points = pd.read_parquet(out / "configurations.parquet")
    assert len(points) == 4  # 2 models x 2 hidden sizes
    names = ["valid_ndcg@10", "peak_mem_mb", "infer_ms_p50"]
    signs = np.array([-1.0, 1.0, 1.0])
    values = points[names].to_numpy() * signs
    dominated = [any((v <= p).all() and (v < p).any() for v in values) for p in values]
    assert points["on_front"].tolist() == [not d for d in dominated]
    front = pd.read_parquet(out / "pareto_front.parquet")
    assert sorted(front["config_id"]) == sorted(points.loc[points["on_front"], "config_id"])
    reference = pd.read_parquet(out / "hv_reference.parquet").set_index("objective")["reference"]
    mem = points["peak_mem_mb"]
    assert reference["peak_mem_mb"] == pytest.approx(mem.max() + 0.1 * (mem.max() - mem.min()))
    hv = pd.read_parquet(out / "hypervolume.parquet").set_index("scope")
    assert hv.loc["all models", "hypervolume"] >= hv.loc[list(MODELS), "hypervolume"].max() > 0


def test_report_with_another_reference_and_proposed(studies: dict[str, Path], tmp_path: Path, data_cache: Path) -> None:
    code = report_cli.main([str(studies["sasrec"]), str(studies["gru4rec"]), "--out", str(tmp_path), "--reference",
                            "gru4rec", "--proposed", "sasrec", "--no-plots"])
    assert code == 0
    sig = pd.read_parquet(tmp_path / "significance.parquet")
    assert set(sig["candidate"]) == {"sasrec"} and set(sig["reference"]) == {"gru4rec"}
    assert "Improv. (sasrec vs best other)" in (tmp_path / "report.md").read_text()


def _copy(folder: Path, dest: Path, **changes: object) -> Path:
    """A copy of a results folder with columns of its trials (and replicates) overwritten."""
    shutil.copytree(folder, dest, ignore=shutil.ignore_patterns("tune", "replicates"))
    for name in ("trials.parquet", "replicates.parquet"):
        if (dest / name).is_file() and changes:
            frame = pd.read_parquet(dest / name)
            for column, value in changes.items():
                frame[column] = value
            frame.to_parquet(dest / name, index=False)
    return dest


def _error(args: list[str], capsys: pytest.CaptureFixture) -> str:
    assert report_cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_input_is_one_line_and_exit_2(studies: dict[str, Path], tmp_path: Path, data_cache: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    assert "no such results folder" in _error([str(tmp_path / "missing")], capsys)
    (tmp_path / "empty").mkdir()
    assert "empty folder" in _error([str(tmp_path / "empty")], capsys)
    failed = _copy(studies["sasrec"], tmp_path / "failed", status="failed", error="RuntimeError: out of memory")
    assert "none of its 2 trials succeeded (first error: RuntimeError: out of memory)" in _error([str(failed)], capsys)
    sasrec = str(studies["sasrec"])
    assert "'valid_foo@10' is not in the results" in _error([sasrec, "--objectives", "valid_foo@10:max"], capsys)
    assert "never test metrics" in _error([sasrec, "--objectives", "test_ndcg@10:max,peak_mem_mb:min"], capsys)
    assert "no such model" in _error([sasrec, "--reference", "bert4rec"], capsys)
    sampled = _copy(studies["gru4rec"], tmp_path / "sampled", eval_mode="sampled", num_negatives=100,
                    negative_sampler="uniform")
    err = _error([sasrec, str(sampled)], capsys)
    assert "differ in protocol" in err and "eval_mode: full in lastfm-sasrec; sampled in lastfm-gru4rec" in err
    assert "--allow-mixed-protocols" in err


def test_mixed_protocols_allowed_and_synthetic_data_flagged(studies: dict[str, Path], tmp_path: Path,
                                                            data_cache: Path) -> None:
    sampled = _copy(studies["gru4rec"], tmp_path / "sampled", eval_mode="sampled", num_negatives=100,
                    negative_sampler="uniform", synthetic=True)
    out = tmp_path / "out"
    code = report_cli.main([str(studies["sasrec"]), str(sampled), "--out", str(out), "--allow-mixed-protocols",
                            "--no-plots"])
    assert code == 0
    markdown = (out / "report.md").read_text()
    assert "MIXED PROTOCOLS" in markdown and "SYNTHETIC DATA" in markdown
    assert markdown.index("SYNTHETIC DATA") < markdown.index("## Studies")  # prominent: before any number
    assert 'class="warning"' in (out / "report.html").read_text()


# ---------------------------------------------------------------------------------------------------------------
# Pure parts, on hand-made rows (no Ray)


def _rows(configs: list[tuple[str, int, float]], **extra: object) -> pd.DataFrame:
    """Trial rows: (trial id, seed, valid_ndcg@10) with hidden_size chosen by the id's first letter."""
    rows = []
    for trial_id, seed, ndcg in configs:
        hidden = 16 if trial_id.startswith("a") else 32
        rows.append({"trial_id": trial_id, "status": "ok", "model": "elastic", "seed": seed, "valid_ndcg@10": ndcg,
                     "test_ndcg@10": ndcg / 2, "config": json.dumps({"hidden_size": hidden, "seed": seed}),
                     "config.hidden_size": hidden, **extra})
    return pd.DataFrame(rows)


def test_replicates_stand_for_their_configuration() -> None:
    from study.analysis.runs import StudyResults, assign_labels, collect_runs, name_configs
    from study.analysis.tables import aggregate, choose, extra_table

    trials = _rows([("a0", 0, 0.50), ("b0", 0, 0.40)])
    usage = [json.dumps({"expert_usage_rate": rate, "expert_max_load": 0.1}) for rate in (0.5, 0.7)]
    replicates = _rows([("a1", 1, 0.30), ("a2", 2, 0.34)], source_trial_id="a0").assign(extra=usage)
    study = StudyResults(path=Path("x"), name="s", model="elastic", trials=trials, replicates=replicates,
                         study={"search": {"hidden_size": {"choice": [16, 32]}}}, environment={})
    assign_labels([study])
    runs = collect_runs([study])
    # the sweep trial of the replicated configuration gives way to its replicates; the other keeps its trial
    assert dict(zip(runs["trial_id"], runs["measured"])) == {"a0": False, "b0": True, "a1": True, "a2": True}
    assert runs.loc[runs["trial_id"] == "a1", "config_id"].item() == runs.loc[runs["trial_id"] == "a0",
                                                                                "config_id"].item()
    points = name_configs(aggregate(runs, {"elastic": ["hidden_size"]}), "valid_ndcg@10").set_index("config_id")
    replicated = points[points["source"] == "replicate"].iloc[0]
    assert replicated["valid_ndcg@10"] == pytest.approx(0.32) and replicated["n_seeds"] == 2
    assert replicated["valid_ndcg@10_std"] == pytest.approx(np.std([0.30, 0.34], ddof=1))
    # chosen among replicated configurations, even though the unreplicated one has the higher single run
    chosen = choose(points.reset_index(), "valid_ndcg@10")
    assert chosen["hidden_size"].tolist() == [16]
    stats_table = extra_table({"elastic": runs[runs["measured"] & (runs["source"] == "replicate")]})
    usage_row = stats_table[stats_table["statistic"] == "expert_usage_rate"].iloc[0]
    assert usage_row["mean"] == pytest.approx(0.6) and usage_row["n"] == 2


def test_results_table_marks_bold_significance_and_improvement() -> None:
    from study.analysis.tables import results_table

    chosen = pd.DataFrame([
        {"label": "sasrec", "name": "sasrec-1", "n_seeds": 3, "test_ndcg@10": 0.20, "test_ndcg@10_std": 0.01},
        {"label": "elastic", "name": "elastic-1", "n_seeds": 3, "test_ndcg@10": 0.25, "test_ndcg@10_std": 0.02},
        {"label": "gru4rec", "name": "gru4rec-1", "n_seeds": 1, "test_ndcg@10": 0.10, "test_ndcg@10_std": np.nan},
    ])
    sig = pd.DataFrame([{"candidate": "elastic", "metric": "test_ndcg@10", "significant": True},
                        {"candidate": "gru4rec", "metric": "test_ndcg@10", "significant": pd.NA}])
    table, numbers, notes = results_table(chosen, ["test_ndcg@10"], sig, "sasrec", proposed="elastic")
    cells = dict(zip(table["model"], table["NDCG@10"]))
    assert cells["elastic"] == "**0.2500** ± 0.0200*"
    assert cells["sasrec"] == "0.2000 ± 0.0100" and cells["gru4rec"] == "0.1000"
    assert dict(zip(table["model"], table["n"]))["gru4rec"] == "1†"  # one seed: marked, and the notes say why
    assert cells["Improv. (elastic vs best other)"] == "+25.00%"
    assert numbers["mean"].tolist() == [0.20, 0.25, 0.10] and any("Holm" in note for note in notes)


def test_a_single_seed_is_no_bold_result_and_its_improvement_carries_a_caveat() -> None:
    from study.analysis.tables import UNTESTED_MARK, results_table

    chosen = pd.DataFrame([
        {"label": "sasrec", "name": "sasrec-1", "n_seeds": 3, "test_ndcg@10": 0.20, "test_ndcg@10_std": 0.01},
        {"label": "elastic", "name": "elastic-1", "n_seeds": 1, "test_ndcg@10": 0.4364, "test_ndcg@10_std": np.nan},
    ])
    table, _, notes = results_table(chosen, ["test_ndcg@10"], pd.DataFrame(), "sasrec", proposed=None)
    cells = table.set_index("model")
    assert cells.loc["elastic", "NDCG@10"] == "0.4364"  # the best mean, but one run: not bold
    assert cells.loc["elastic", "n"] == f"1{UNTESTED_MARK}" and cells.loc["sasrec", "n"] == "3"
    assert cells.loc["Improv. (best vs runner-up)", "NDCG@10"] == f"+118.2%{UNTESTED_MARK}"
    assert any(note.startswith(f"{UNTESTED_MARK} n = 1: fewer than 2 seeds, so no spread and no test")
               for note in notes)
    assert "**" not in "".join(table["NDCG@10"])
    # with two seeds on each side the same table is bold and plain
    chosen["n_seeds"] = [3, 2]
    table, _, notes = results_table(chosen, ["test_ndcg@10"], pd.DataFrame(), "sasrec", proposed=None)
    assert table["NDCG@10"].tolist() == ["0.2000 ± 0.0100", "**0.4364**", "+118.2%"]
    assert not any(UNTESTED_MARK in note for note in notes)
