"""Every campaign's study files validate, as ``python -m study.sweep FILE --dry-run`` validates them.

A campaign's studies are data that only the platform runs (``experiments/<question>/studies/*.yaml``). Each is read
with :func:`study.spec.study_file.load_study`, the function the dry run calls: every section, key, type and search
combination is checked, without Ray and without data. A recipe that cannot download needs a local copy, and
validation only checks that the copy exists, so an empty stand-in file takes its place.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from study.data import get_recipe
from study.spec.study_file import load_study
from study.spec.yaml_io import StudyConfigError, read_yaml

REPO = Path(__file__).resolve().parents[1]
STUDY_FILES = sorted((REPO / "experiments").glob("*/studies/*.yaml"))


def stand_in_source(path: Path, tmp_path: Path) -> list[str]:
    """``--set dataset.source=<empty file>`` for a recipe that cannot download and names no source."""
    data, _ = read_yaml(path)
    dataset = data.get("dataset") or {}
    name = dataset if isinstance(dataset, str) else dataset.get("name", "ml-100k")
    if get_recipe(name).download is None and not (isinstance(dataset, dict) and dataset.get("source")):
        stand_in = tmp_path / "local-copy.txt"
        stand_in.write_text("")
        return [f"dataset.source={stand_in}"]
    return []


def validate(path: Path, tmp_path: Path):
    return load_study(path, stand_in_source(path, tmp_path), check_machine=False)


@pytest.fixture(autouse=True)
def private_cache(data_cache: Path) -> Path:
    return data_cache


def test_the_scan_finds_every_campaigns_study_files() -> None:
    found = {path.relative_to(REPO / "experiments").as_posix() for path in STUDY_FILES}
    assert {"reproduction/studies/sasrec.yaml", "validation-grid/studies/bert4rec-mask-lr.yaml",
            "validation-grid/studies/budget-bert4rec.yaml"} <= found, sorted(found)


@pytest.mark.parametrize("path", STUDY_FILES, ids=lambda p: p.relative_to(REPO / "experiments").as_posix())
def test_every_study_file_validates(path: Path, tmp_path: Path) -> None:
    study = validate(path, tmp_path)
    assert study.adaptation == "", f"{path.name}: the budget was adapted: {study.adaptation}"


@pytest.mark.parametrize("path", sorted((REPO / "experiments" / "validation-grid" / "studies").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_a_validation_grid_is_a_grid_over_seeds_picked_on_validation(path: Path, tmp_path: Path) -> None:
    study = validate(path, tmp_path)
    assert study.sampler == "grid" and study.scheduler is None
    assert study.objectives == {"valid_ndcg@10": "max"}
    assert "seed" in study.search and {param.kind for param in study.search.values()} == {"grid"}


def test_a_broken_study_file_fails(tmp_path: Path) -> None:
    text = (REPO / "experiments" / "validation-grid" / "studies" / "sasrec-lr.yaml").read_text()
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace("  patience: 10\n", "  patience: 10\n  no_such_key: 1\n"))
    with pytest.raises(StudyConfigError, match="no_such_key"):
        validate(broken, tmp_path)
