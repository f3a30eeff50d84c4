"""The scalability study: growth fits, claims, validation, real long sequences, and small runs on Ray.

The Ray tests share one 2-CPU Ray started by this module and shut down at its end (other modules start their
own). Each cell spawns a fresh process that imports torch, so the runs are kept to a handful of tiny cells.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import models
from study.data import load_prepared
from study.scaling import analysis, cells, command, schedule
from study.spec.scaling_file import load_scaling_study, resolve
from study.spec.yaml_io import StudyConfigError

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    # address="local": always a private instance, never a cluster someone started with `ray start` on this machine
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def write_study(tmp_path: Path, data: dict, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tiny_study(source: Path, storage: Path, **changes) -> dict:
    """A two-model study on ``source``, a file in LastFM's format (the tests pass the synthetic one)."""
    study = {
        "name": "tiny",
        "dataset": {"name": "lastfm", "source": str(source)},
        "models": [{"label": "sasrec-math", "model": "sasrec", "config": {"attention_backend": "math"},
                    "expected_growth": "quadratic"},
                   {"model": "linrec", "config": {"hidden_size": 64, "num_heads": 2}, "expected_growth": "linear"}],
        "lengths": [16, 32, 64],
        "batch_sizes": [16],
        "measure": {"warmup": 1, "repeats": 1, "timeout_s": 240, "memory_limit_mb": 2048},
        "fit": {"min_length": 16},
        "claims": [
            {"paper": "P", "text": "less training memory", "model": "linrec", "reference": "sasrec-math",
             "mode": "train", "metric": "memory", "length": 64, "max_ratio": 100.0},
            {"paper": "P", "text": "far longer sequences", "model": "linrec", "reference": "sasrec-math",
             "mode": "inference", "metric": "time", "length": 16384, "min_factor": 57},
        ],
        "storage": str(storage),
    }
    study.update(changes)
    return study


# ---------------------------------------------------------------------------------------------------------------
# Pure analysis


def test_fit_growth_recovers_known_power_laws():
    lengths = np.array([64, 128, 256, 512, 1024, 2048, 4096])
    linear = analysis.fit_growth(lengths, 3.0 * lengths)
    quadratic = analysis.fit_growth(lengths, 0.5 * lengths**2)
    assert linear.exponent == pytest.approx(1.0, abs=1e-9) and linear.r2 == pytest.approx(1.0, abs=1e-12)
    assert quadratic.exponent == pytest.approx(2.0, abs=1e-9) and quadratic.r2 == pytest.approx(1.0, abs=1e-12)
    assert linear.points == quadratic.points == 7
    # a constant plus N² bends the line: lower slope at small N, and R² < 1 says the fit is not a power law
    mixed = analysis.fit_growth(lengths, 1e6 + lengths**2)
    assert 0.0 < mixed.exponent < 2.0 and mixed.r2 < 0.999
    # missing and non-positive points (a failed cell, a zero memory delta) are left out, not fitted as log(0)
    holes = analysis.fit_growth([64, 128, 256, 512], [float("nan"), 0.0, 256.0**2, 512.0**2])
    assert holes.points == 2 and holes.exponent == pytest.approx(2.0)
    assert math.isnan(analysis.fit_growth([64], [1.0]).exponent)


def _frame(rows: list[tuple]) -> pd.DataFrame:
    columns = ["label", "mode", "batch", "length", "status", "error", "peak_mem_mb", "time_ms_median"]
    return pd.DataFrame(rows, columns=columns)


def test_claims_hold_are_contradicted_or_not_tested_with_the_numbers():
    study = resolve({
        "name": "claims", "dataset": "synthetic", "lengths": [512, 1024], "batch_sizes": [8],
        "models": [{"label": "sasrec-math", "model": "sasrec", "config": {"attention_backend": "math"}},
                   {"model": "elastic"}],
        "claims": [
            {"paper": "ELASTIC", "text": "90% less memory", "model": "elastic", "reference": "sasrec-math",
             "mode": "train", "metric": "memory", "length": 1024, "max_ratio": 0.10},
            {"paper": "ELASTIC", "text": "2.7x faster", "model": "elastic", "reference": "sasrec-math",
             "mode": "inference", "metric": "time", "length": 1024, "min_factor": 2.7},
            {"paper": "LISA", "text": "78x less memory", "model": "elastic", "reference": "sasrec-math",
             "mode": "inference", "metric": "memory", "length": 16384, "min_factor": 78},
            {"paper": "X", "text": "cheap training", "model": "elastic", "reference": "sasrec-math",
             "mode": "train", "metric": "time", "length": 1024, "min_factor": 1.0},
        ]}, check_machine=False)
    frame = _frame([
        ("sasrec-math", "train", "8", 512, "ok", "", 250.0, 40.0),
        ("sasrec-math", "train", "8", 1024, "oom", "DefaultCPUAllocator: can't allocate memory", None, None),
        ("elastic", "train", "8", 512, "ok", "", 20.0, 10.0),
        ("elastic", "train", "8", 1024, "ok", "", 40.0, 20.0),
        ("sasrec-math", "inference", "8", 512, "ok", "", 100.0, 30.0),
        ("sasrec-math", "inference", "8", 1024, "ok", "", 400.0, 100.0),
        ("elastic", "inference", "8", 512, "ok", "", 10.0, 15.0),
        ("elastic", "inference", "8", 1024, "ok", "", 20.0, 50.0),
    ])
    results = {r.claim.text: r for r in analysis.check_claims(frame, study)}
    assert results["90% less memory"].verdict == "not tested"
    assert "sasrec-math oom" in results["90% less memory"].line
    assert results["2.7x faster"].verdict == "contradicted"  # 100 ms / 50 ms = 2.0x
    assert "**contradicted**: ELASTIC: 2.7x faster" in results["2.7x faster"].line
    assert "2.00×" in results["2.7x faster"].line and "100" in results["2.7x faster"].line
    untested = results["78x less memory"]
    assert untested.verdict == "not tested" and "not in this grid" in untested.line
    assert "N = 1024" in untested.line and "20.00×" in untested.line  # the ratio where both ran, for orientation
    assert results["cheap training"].verdict == "not tested"  # the reference has no time at 1024

    frame.loc[frame["status"] == "oom", ["status", "error", "peak_mem_mb", "time_ms_median"]] = ["ok", "", 800.0, 90.0]
    results = {r.claim.text: r for r in analysis.check_claims(frame, study)}
    assert results["90% less memory"].verdict == "holds" and "0.050×" in results["90% less memory"].line
    summary = analysis.summarise(frame, study).set_index(["label", "mode"])
    assert summary.loc[("elastic", "train"), "memory_vs_reference"] == pytest.approx(0.05)
    assert summary.loc[("elastic", "inference"), "speedup_vs_reference"] == pytest.approx(2.0)
    assert summary.loc[("sasrec-math", "train"), "memory_exponent"] == pytest.approx(math.log2(800 / 250))


# ---------------------------------------------------------------------------------------------------------------
# Validation: every error at once, before Ray, exit code 2


def test_bad_cells_are_all_reported_before_ray_starts(tmp_path, capsys):
    import ray

    path = write_study(tmp_path, {
        "name": "bad",
        "dataset": "synthetic",
        "models": [
            {"label": "sasrec-math", "model": "sasrec", "config": {"attention_backend": "math"}},
            {"model": "sasrek"},
            {"label": "sasrec-flash", "model": "sasrec", "config": {"attention_backend": "flash"}},
            {"model": "elastic", "config": {"num_experts": 10, "max_len": 64}},
        ],
        "lengths": [1, 64],
        "batch_sizes": [8, 0],
        "modes": ["train", "backward"],
        "reference": "sasrec-math",
        "claims": [{"model": "lisa", "reference": "sasrec-math", "mode": "train", "metric": "memory",
                    "length": 64, "max_ratio": 0.1}],
        "colour": "red",
    })
    assert command.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert all(line.startswith(f"error: {path}:") for line in err), err
    text = "\n".join(err)
    for expected in (
        "colour: unknown section",
        "models[1].model: unknown model 'sasrek'",
        "models[2].config.attention_backend: must be one of ('sdpa', 'math'), got 'flash'",
        "models[3].config.num_experts: must be a perfect square",
        "models[3].config.max_len: set by the study",
        "lengths[0]: cell (sasrec-math, N=1): max_len: must be >= 2, got 1",
        "batch_sizes[1]: must be >= 1, got 0",
        "modes[1]: unknown mode 'backward'",
        "claims[0].model: 'lisa' is not a model label",
    ):
        assert expected in text, f"{expected!r} missing from:\n{text}"
    assert not ray.is_initialized()


def test_lists_numbers_and_sections_keep_their_rules():
    """Distinct list items, integers written as integers, numbers also as strings, errors named where they are."""
    with pytest.raises(StudyConfigError) as caught:
        resolve({"name": "rules", "dataset": "synthetic", "lengths": [16, "32", 16, 64], "batch_sizes": [8],
                 "modes": ["train", "train"], "models": [{"model": "gru4rec", "train": {"lr": 1e-3, "epochs": 3}}],
                 "measure": {"timeout_s": "1e2", "memory_limit_mb": -1, "colour": 1}, "fit": {"min_length": 16, "x": 1},
                 "train": {"patience": 2}, "claims": [{"model": "gru4rec", "reference": "gru4rec", "mode": "train",
                                                       "metric": "speed", "length": 64, "max_ratio": "1e-1"}]},
                check_machine=False)
    errors = "\n".join(caught.value.errors)
    for expected in ("lengths[1]: expected an integer, got str '32'", "lengths[2]: 16 is listed twice",
                     "modes[1]: train is listed twice", "models[0].train.epochs: unknown key; train takes",
                     "measure.memory_limit_mb: must be > 0, got -1", "measure.colour: unknown key; measure takes",
                     "fit.x: unknown key; fit takes", "train.patience: unknown key; train takes",
                     "claims[0].metric: must be one of memory, time, got 'speed'"):
        assert expected in errors, f"{expected!r} missing from:\n{errors}"
    # "1e2" and "1e-1" are numbers PyYAML leaves as strings (no dot): accepted
    assert "measure.timeout_s" not in errors and "claims[0].max_ratio" not in errors


def test_python_m_study_scaling_validates_without_starting_ray(tmp_path):
    import subprocess
    import sys

    path = write_study(tmp_path, {"name": "dry", "dataset": "synthetic", "models": ["gru4rec"], "lengths": [16, 32],
                                  "batch_sizes": [4]})
    result = subprocess.run([sys.executable, "-m", "study.scaling", str(path), "--dry-run", "--set", "modes=[train]"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "# valid: 2 cells (1 models × 2 lengths × 1 batch setting(s) × 1 mode(s))" in result.stderr
    assert yaml.safe_load(result.stdout)["modes"] == ["train"]
    result = subprocess.run([sys.executable, "-m", "study.scaling", str(path), "--dry-run",
                             "--set", "lengths=[16, x, 32]"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 2, result.stderr
    assert result.stderr == "error: --set lengths[1]: expected an integer, got str 'x'\n"


def test_malformed_yaml_names_its_line(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nmodels:\n  - {model: sasrec\nlengths: [16]\n")
    assert command.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:") and "malformed YAML" in err and "Traceback" not in err


def test_batches_that_the_dataset_cannot_fill_are_errors():
    study = resolve({"name": "big", "dataset": "synthetic", "models": ["gru4rec"], "lengths": [16, 32],
                             "batch_sizes": [8, 5000], "num_items": 10}, check_machine=False)
    with pytest.raises(StudyConfigError) as caught:
        cells.check_data(study, num_users=943, dataset_items=1682)
    assert any("batch_sizes[1]" in e and "5000" in e and "943" in e for e in caught.value.errors)
    assert any("num_items" in e and "1682" in e for e in caught.value.errors)


def test_shipped_grids_are_valid_and_the_default_covers_the_zoo():
    default = load_scaling_study(REPO / "search_spaces" / "scaling.yaml", check_machine=False)
    # every registered model is in the default grid: a model added to the zoo must be added here too
    assert {e.model for e in default.models} == set(models.available())
    labels = {e.label for e in default.models}
    assert {"sasrec-math", "sasrec-sdpa"} <= labels and default.reference == "sasrec-math"
    assert default.compare_length == 1024 and len(default.cells()) <= 100
    for path in sorted((REPO / "search_spaces" / "paper").glob("scaling-*.yaml")):
        study = load_scaling_study(path, check_machine=False)
        assert study.claims and max(study.lengths) >= 1024, path


# ---------------------------------------------------------------------------------------------------------------
# Real sequences


def test_long_sequences_hold_only_real_item_ids(synthetic_lastfm_prepared):
    data = load_prepared(synthetic_lastfm_prepared)
    real_items = set(np.unique(data.history_indices).tolist())
    lengths = np.diff(data.history_indptr)
    batch = cells.real_batch(data.history_indptr, data.history_indices, 2000, 16, seed=3, dataset_name="synthetic")
    assert batch.windows.shape == (16, 2001) and batch.windows.dtype == np.int64
    assert set(np.unique(batch.windows).tolist()) <= real_items and 0 not in real_items  # no padding anywhere
    assert batch.tiled_rows == int((lengths[batch.users] < 2001).sum()) == 16  # the longest history is 200
    assert "tiled" in batch.description and "synthetic" in batch.description
    for row, user in zip(batch.windows, batch.users):
        history = data.history(user)
        assert row[-1] == history[-1]  # the row still ends with the user's newest item
        assert np.array_equal(row[-len(history):], history)
    short = cells.real_batch(data.history_indptr, data.history_indices, 16, 16, seed=3)
    long_enough = [(row, user) for row, user in zip(short.windows, short.users) if lengths[user] >= 17]
    assert long_enough and short.tiled_rows == 16 - len(long_enough)
    for row, user in long_enough:
        assert np.array_equal(row, data.history(user)[-17:])  # long enough histories are real windows, untouched
    again = cells.real_batch(data.history_indptr, data.history_indices, 2000, 16, seed=3)
    assert np.array_equal(again.windows, batch.windows)


def test_energy_gets_a_table_only_where_it_was_measured():
    from study.scaling.outputs import energy_lines

    frame = pd.DataFrame({"label": ["sasrec"] * 3, "mode": ["train"] * 3, "batch": ["16"] * 3,
                          "length": [16, 64, 256], "status": ["ok", "ok", "oom"],
                          "energy_j_per_run": [0.0123, 0.5, float("nan")], "energy_method": ["rapl"] * 3})
    lines = energy_lines(frame)
    assert "## Energy" in lines and "(rapl)" in "\n".join(lines)
    assert "| sasrec | train | 16 | 0.0123 J | 0.5 J |" in lines  # the OOM cell has no column
    assert energy_lines(frame.assign(energy_j_per_run=float("nan"), energy_method="unavailable")) == []


# ---------------------------------------------------------------------------------------------------------------
# On Ray


@pytest.mark.slow
def test_tiny_study_end_to_end(ray_cluster, synthetic_lastfm_file, data_cache, tmp_path, capsys):
    out = tmp_path / "results"
    path = write_study(tmp_path, tiny_study(synthetic_lastfm_file, out))
    assert command.main([str(path), "--no-progress", "--quiet"]) == 0
    assert "12 cells (12 ok)" in capsys.readouterr().out
    for name in ("cells.parquet", "cells.csv", "summary.csv", "scaling.md", "environment.json", "study.yaml",
                 "memory.png", "memory.svg", "time.png", "time.svg", "memory_ratio.png", "time_ratio.svg"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    frame = pd.read_parquet(out / "cells.parquet")
    assert len(frame) == 12 and (frame["status"] == "ok").all(), frame[["label", "mode", "length", "error"]]
    assert len(pd.read_csv(out / "cells.csv")) == 12
    assert (frame["time_ms_median"] > 0).all() and (frame["time_ms_p95"] >= frame["time_ms_median"]).all()
    assert (frame["peak_mem_mb"] >= 0).all() and (frame["params"] > 0).all() and (frame["runs"] == 1).all()
    assert frame["mem_method"].str.contains("fresh process VmHWM").all() and frame["niceness"].notna().all()
    items = {item for line in synthetic_lastfm_file.read_text().splitlines() for item in line.split()[1:]}
    assert set(frame["objective"]) == {"last"} and (frame["num_items"] == len(items)).all()
    math_train = frame[(frame["label"] == "sasrec-math") & (frame["mode"] == "train")].set_index("length")
    assert math_train.loc[64, "peak_mem_mb"] > math_train.loc[16, "peak_mem_mb"] + 1.0  # the N×N scores
    assert math_train.loc[64, "params"] > math_train.loc[16, "params"]  # the position table grows with N
    # the file's median history is 38 items: at N = 64 most rows are tiled, and the row says so
    assert frame.set_index("length").loc[64, "tiled_rows"].min() > 0
    assert frame["sequences"].str.contains("lastfm").all()
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 4 and summary["memory_exponent"].notna().all()
    markdown = (out / "scaling.md").read_text()
    assert "| sasrec-math | train | 16 |" in markdown and "| linrec | inference | 16 |" in markdown
    assert "**holds**: P: less training memory" in markdown
    assert "**not tested**: P: far longer sequences" in markdown and "not in this grid" in markdown
    # energy where this machine has a counter (RAPL for CPU cells); else no number, no figure and no table
    from study.train.energy import method_of, open_counter

    method = method_of(open_counter("cpu"))
    assert (frame["energy_method"] == method).all()
    measured = method != "unavailable"
    assert (frame["energy_j_per_run"] > 0).all() if measured else frame["energy_j_per_run"].isna().all()
    assert (out / "energy.png").is_file() == measured and ("## Energy" in markdown) == measured
    env = json.loads((out / "environment.json").read_text())
    assert env["hardware"]["cpus_usable"] >= 1 and env["packages"]["torch"]
    # an earlier study is not overwritten by accident
    assert command.main([str(path), "--no-progress", "--quiet"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_failing_cells_are_data_points_and_stop_their_series(ray_cluster, synthetic_lastfm_prepared, tmp_path):
    """An OOM (memory limit), a timeout and a model error are recorded; larger N after OOM/timeout are skipped."""
    study = resolve({
        "name": "faults", "dataset": "synthetic", "lengths": [32, 2048, 4096], "batch_sizes": [16],
        "modes": ["train"],
        "models": [{"label": "sasrec-math", "model": "sasrec", "config": {"attention_backend": "math"}},
                   {"model": "gru4rec"}, {"model": "linrec"}],
        "measure": {"repeats": 1, "memory_limit_mb": 64, "timeout_s": 240},
        "storage": str(tmp_path)}, check_machine=False)
    data = load_prepared(synthetic_lastfm_prepared)
    windows = {(n, 16): cells.real_batch(data.history_indptr, data.history_indices, n, 16, seed=0).windows
               for n in study.lengths}
    specs = cells.cell_specs(study, study.cells(), num_items=data.num_items, device="cpu", threads=1)
    by_label = {}
    for spec in specs:
        by_label.setdefault(spec["label"], []).append(spec)
    # sasrec-math: N=32 fits in 64 MB, the 2048² score matrices (16 × 2 heads × 16 MB) do not
    # gru4rec: a timeout far shorter than the process start-up
    for spec in by_label["gru4rec"]:
        spec["timeout_s"] = 0.5
    # linrec: a failure that is neither OOM nor timeout (the worker cannot build this model)
    for spec in by_label["linrec"][:1]:
        spec["model"] = "no-such-model"
    specs = by_label["sasrec-math"] + by_label["gru4rec"] + by_label["linrec"][:1]
    outcomes = schedule.execute(specs, windows, cpu=1, gpu=0, max_concurrent=2)
    status = {(s["label"], s["length"]): o for s, o in zip(specs, outcomes)}
    assert status[("sasrec-math", 32)]["status"] == "ok" and status[("sasrec-math", 32)]["peak_mem_mb"] > 0
    oom = status[("sasrec-math", 2048)]
    assert oom["status"] == "oom" and "allocate" in oom["error"], oom
    assert status[("sasrec-math", 4096)]["status"] == "skipped" and "oom" in status[("sasrec-math", 4096)]["error"]
    assert status[("gru4rec", 32)]["status"] == "timeout"
    assert {status[("gru4rec", n)]["status"] for n in (2048, 4096)} == {"skipped"}
    failed = status[("linrec", 32)]
    assert failed["status"] == "failed" and "no-such-model" in failed["error"], failed


def test_a_study_with_a_uri_is_mirrored_there_and_not_overwritten_by_accident(ray_cluster, synthetic_lastfm_file,
                                                                              data_cache, tmp_path, capsys,
                                                                              monkeypatch, s3_bucket):
    import pyarrow.fs as pafs

    monkeypatch.chdir(tmp_path)
    uri = f"{s3_bucket}/scaling/tiny"
    study = tiny_study(synthetic_lastfm_file, uri, lengths=[16, 32],
                       models=tiny_study(synthetic_lastfm_file, uri)["models"][1:], claims=[])
    path = write_study(tmp_path, study)
    assert command.main([str(path), "--no-progress", "--quiet"]) == 0
    assert f"mirrored to {uri}" in capsys.readouterr().out
    local = tmp_path / "results" / "tiny"  # the working copy of a URI study
    fs, root = pafs.FileSystem.from_uri(uri)
    for name in ("cells.parquet", "cells.csv", "summary.csv", "scaling.md", "study.yaml", "cells.jsonl"):
        assert fs.open_input_stream(f"{root}/{name}").read() == (local / name).read_bytes(), name
    shutil.rmtree(local)
    assert command.main([str(path), "--no-progress", "--quiet"]) == 2
    assert f"{uri} already holds a scaling study; pass --overwrite" in capsys.readouterr().err
