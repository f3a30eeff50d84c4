"""The study file's checkpoint: and tracking: sections (validated before Ray starts; no Ray here)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
import yaml

from study.search.tracking import tracking_callbacks
from study.spec.fields import Checkpoints
from study.spec.study_file import load_study
from study.spec.yaml_io import StudyConfigError

BASE = """
    name: sections
    model: sasrec
    dataset: synthetic
    search: {lr: {loguniform: [1.0e-3, 1.0e-2]}}
    """


def study_file(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(textwrap.dedent(BASE).lstrip() + textwrap.dedent(extra).lstrip())
    return path


def test_checkpoint_defaults_resolve_by_where_the_study_runs(tmp_path: Path, data_cache: Path) -> None:
    study = load_study(study_file(tmp_path, ""), check_machine=False)
    assert study.checkpoint == Checkpoints(every="auto", keep=2, max_failures="auto")
    assert study.checkpoint.resolve(on_cluster=False) == (0, 0)
    assert study.checkpoint.resolve(on_cluster=True) == (1, 3)
    assert "checkpoint" not in study.to_dict()  # studies written before the section existed still --resume

    study = load_study(study_file(tmp_path, "checkpoint: {every: 2, keep: 1, max_failures: 1}\n"),
                       check_machine=False)
    assert study.checkpoint.resolve(on_cluster=True) == (2, 1) == study.checkpoint.resolve(on_cluster=False)
    assert yaml.safe_load(study.to_yaml())["checkpoint"] == {"every": 2, "keep": 1, "max_failures": 1}


def test_bad_checkpoint_keys_are_reported_by_name(tmp_path: Path, data_cache: Path) -> None:
    with pytest.raises(StudyConfigError) as caught:
        load_study(study_file(tmp_path, "checkpoint: {every: -1, keep: 0, often: 3}\n"), check_machine=False)
    text = str(caught.value)
    assert "checkpoint.every" in text and "checkpoint.keep" in text and "checkpoint.often" in text


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_tracker_without_its_package_is_refused_before_ray_starts(tracker: str, tmp_path: Path, data_cache: Path,
                                                                    monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Whether or not this machine has the package: the sweep command ends with one error line naming it."""
    import ray

    from study.sweep import main

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == tracker else real_find_spec(name, *args))
    path = study_file(tmp_path, f"tracking: {{{tracker}: {{}}}}\n")
    assert main([str(path), "--num-cpus", "1", "--quiet"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    package = {"mlflow": "mlflow-skinny", "wandb": "wandb"}[tracker]
    assert len(errors) == 1 and f"tracking.{tracker}" in errors[0] and f"pip install {package}" in errors[0], errors
    assert not ray.is_initialized()


def test_no_tracking_section_adds_no_callback(tmp_path: Path, data_cache: Path) -> None:
    study = load_study(study_file(tmp_path, ""), check_machine=False)
    assert tracking_callbacks(study.tracking) == [] and "tracking" not in study.to_dict()


def test_an_mlflow_file_store_is_refused_unless_mlflow_is_told_to_open_it(tmp_path: Path, data_cache: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow 3 (the dev extra's) refuses file stores without MLFLOW_ALLOW_FILE_STORE; say so before Ray starts."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    store = f"file:{tmp_path / 'mlruns'}"
    with pytest.raises(StudyConfigError) as caught:
        load_study(study_file(tmp_path, f"tracking: {{mlflow: {{tracking_uri: '{store}'}}}}\n"), check_machine=False)
    assert "tracking.mlflow.tracking_uri" in str(caught.value) and "MLFLOW_ALLOW_FILE_STORE=true" in str(caught.value)

    sqlite = f"sqlite:///{tmp_path / 'mlflow.db'}"
    study = load_study(study_file(tmp_path, f"tracking: {{mlflow: {{tracking_uri: '{sqlite}'}}}}\n"),
                       check_machine=False)
    assert study.tracking.mlflow == {"tracking_uri": sqlite, "experiment": "sections"}
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    study = load_study(study_file(tmp_path, f"tracking: {{mlflow: {{tracking_uri: '{store}'}}}}\n"),
                       check_machine=False)
    assert study.tracking.mlflow["tracking_uri"] == store
