"""A shortened run is never refused (#13), and TPE's random start-up covers every choice value (#20).

Resolution only (no Ray): every shipped sweep study with ``--set budget.max_epochs=1`` or ``=2``, the adaptations
of the schedule, the grid, the trial time budget and the sampler, and the resources reader scaling studies share.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from study.data import get_recipe
from study.spec.fields import Budget, Scheduler, default_startup_trials, read_resources
from study.spec.study_file import load_study
from study.spec.yaml_io import ConfigErrors, StudyConfigError
from study.sweep import main

REPO = Path(__file__).resolve().parents[3]
LASTFM = Path(__file__).resolve().parents[4] / "shared" / "datasets" / "s3rec" / "LastFM.txt"
# Scaling studies (a `models:` list) have no epochs, trials or scheduler: `python -m study.scaling` reads them.
SWEEP_FILES = sorted(p for p in (REPO / "search_spaces").rglob("*.yaml")
                     if "models" not in yaml.safe_load(p.read_text()))


@pytest.fixture(autouse=True)
def private_cache(data_cache: Path) -> Path:
    return data_cache


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def local_source(path: Path, tmp_path: Path) -> list[str]:
    """A stand-in local copy for a recipe that cannot download (validation only checks that it exists)."""
    dataset = yaml.safe_load(path.read_text()).get("dataset") or {}
    name = dataset if isinstance(dataset, str) else dataset.get("name", "ml-100k")
    if get_recipe(name).download is None and not (isinstance(dataset, dict) and dataset.get("source")):
        stand_in = tmp_path / "local-copy.txt"
        stand_in.write_text("")
        return [f"dataset.source={stand_in}"]
    return []


def asha_of(path: Path) -> dict | None:
    """The file's ASHA settings, or None when it runs without a scheduler (ASHA is the default)."""
    raw = yaml.safe_load(path.read_text()).get("scheduler", {})
    if raw in (None, "none", False) or (isinstance(raw, dict) and raw.get("type", "asha") in (None, "none")):
        return None
    return raw if isinstance(raw, dict) else {}


def test_every_sweep_study_is_shipped() -> None:
    names = {p.name for p in SWEEP_FILES}
    assert {"sasrec.yaml", "sasrec-ml1m.yaml", "bert4rec-beauty.yaml"} <= names and len(names) >= 15, names


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: str(p.relative_to(REPO / "search_spaces")))
def test_one_and_two_epochs_resolve_for_every_shipped_study(path: Path, tmp_path: Path) -> None:
    file_scheduler = asha_of(path)
    for epochs in (1, 2):
        study = load_study(path, [f"budget.max_epochs={epochs}", *local_source(path, tmp_path)], check_machine=False)
        assert study.budget.max_epochs == epochs
        if file_scheduler is None:
            assert study.scheduler is None and study.adaptation == ""
        elif epochs == 1:  # one epoch: ASHA could stop nothing
            assert study.scheduler is None
            assert study.adaptation == "ASHA off: budget.max_epochs=1 leaves no epoch at which to stop a trial"
            assert yaml.safe_load(study.to_yaml())["scheduler"] is None  # study.yaml records the effective one
        else:  # two epochs: a rung after the first
            assert study.scheduler.grace_period == 1
            grace = file_scheduler.get("grace_period", 1)
            assert (f"scheduler.grace_period {grace} -> 1" in study.adaptation) == (grace >= 2), study.adaptation
            assert yaml.safe_load(study.to_yaml())["scheduler"]["grace_period"] == 1


def test_the_sweep_prints_one_adaptation_line(capsys: pytest.CaptureFixture) -> None:
    assert main([str(REPO / "search_spaces" / "sasrec.yaml"), "--dry-run", "--set", "budget.max_epochs=2"]) == 0
    out, err = capsys.readouterr()
    notes = [line for line in err.splitlines() if line.startswith("adapted to the budget:")]
    assert notes == ["adapted to the budget: scheduler.grace_period 3 -> 1 to fit budget.max_epochs=2"], err
    assert yaml.safe_load(out)["scheduler"]["grace_period"] == 1
    assert main([str(REPO / "search_spaces" / "sasrec.yaml"), "--dry-run"]) == 0
    assert "adapted" not in capsys.readouterr().err  # the study as shipped fits its budget


@pytest.mark.parametrize(("grace", "factor", "epochs", "samples", "expected"), [
    (3, 2, 10, 6, 3),        # fits: unchanged
    (3, 2, 3, 6, 1),         # a rung at the last epoch stops nothing: 3 // 2
    (20, 2, 8, 6, 4),        # the survivors of the first rung get reduction_factor times its epochs
    (4, 3, 2, 6, 1),
    (2, 2, 1, 6, None),      # one epoch: off
    (1, 2, 5, 1, None),      # one trial: nothing to compare, off
])
def test_scheduler_fits_the_budget(grace: int, factor: int, epochs: int, samples: int, expected: int | None) -> None:
    scheduler = Scheduler(metric="valid_ndcg@10", mode="max", grace_period=grace, reduction_factor=factor)
    fitted, note = scheduler.fit(Budget(num_samples=samples, max_epochs=epochs, time_budget_s=0))
    if expected is None:
        assert fitted is None and note.startswith("ASHA off")
    else:
        assert fitted.grace_period == expected and fitted.grace_period < epochs
        assert (note == "") == (expected == grace)


def test_a_file_contradicting_itself_is_adapted_not_refused(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
        name: contradictory
        model: sasrec
        dataset: {{name: lastfm, source: {LASTFM}}}
        fixed: {{time_budget_s: 600}}
        search:
          lr: {{grid: [0.001, 0.01]}}
        budget: {{num_samples: 5, max_epochs: 2, time_budget_s: 60}}
        scheduler: {{grace_period: 5}}
        """)
    study = load_study(path, check_machine=False)
    assert study.budget.num_samples == 2 and study.scheduler.grace_period == 1
    assert study.settings()["time_budget_s"] == 60
    assert study.adaptation == ("budget.num_samples 5 -> 2, the points of the grid (each runs once; search seed to "
                                "repeat points); scheduler.grace_period 5 -> 1 to fit budget.max_epochs=2; "
                                "fixed.time_budget_s 600 -> 60, the whole study's budget.time_budget_s")
    # what truly cannot run is still an error
    with pytest.raises(StudyConfigError) as caught:
        load_study(path, ["budget.max_epochs=0"], check_machine=False)
    assert any("budget.max_epochs: must be >= 1" in e for e in caught.value.errors), caught.value.errors


SAMPLED = textwrap.dedent(f"""
    name: startup
    model: sasrec
    dataset: {{name: lastfm, source: {LASTFM}}}
    search:
      lr: {{loguniform: [1.0e-4, 1.0e-2]}}
      hidden_size: {{choice: [16, 32, 48, 64, 80, 96, 112]}}
      num_layers: {{choice: [1, 2]}}
    budget: {{num_samples: 12, max_epochs: 2}}
    """)


def test_startup_trials_cover_every_choice_value(tmp_path: Path) -> None:
    study = load_study(write(tmp_path, SAMPLED), check_machine=False)
    # 7 hidden sizes; the budget-scaled floor max(2, min(10, 12 // 3)) = 4 is lower
    assert study.searcher.sampler == "tpe" and study.searcher.n_startup_trials == 7
    assert yaml.safe_load(study.to_yaml())["searcher"] == {"n_startup_trials": 7, "multivariate": True,
                                                            "n_ei_candidates": 24}
    assert study.adaptation == ""  # a default is chosen to fit: nothing to announce
    assert load_study(write(tmp_path, SAMPLED), ["budget.num_samples=5"], check_machine=False
                      ).searcher.n_startup_trials == 5  # never more than the trials
    assert default_startup_trials([2, 3], 60) == 10 and default_startup_trials([], 4) == 2
    assert default_startup_trials([], 1) == 1


def test_startup_trials_can_be_set_and_reach_the_sampler(tmp_path: Path) -> None:
    pytest.importorskip("ray.tune.search.optuna")
    from study.search.searcher import make_sampler

    path = write(tmp_path, SAMPLED + "searcher: {n_startup_trials: 9, n_ei_candidates: 12}\n")
    study = load_study(path, check_machine=False)
    sampler = make_sampler(study)
    assert (sampler._n_startup_trials, sampler._n_ei_candidates, sampler._multivariate) == (9, 12, True)
    reloaded = tmp_path / "resolved.yaml"  # the resolved study.yaml reads back as the same study (replicates do)
    reloaded.write_text(study.to_yaml())
    assert load_study(reloaded, check_machine=False).to_dict() == study.to_dict()
    shortened = load_study(path, ["budget.num_samples=3"], check_machine=False)
    assert shortened.searcher.n_startup_trials == 3
    assert shortened.adaptation == "searcher.n_startup_trials 9 -> 3 to fit budget.num_samples"
    assert make_sampler(shortened)._n_startup_trials == 3
    nsga2 = load_study(path, ["sampler=nsga2", "searcher={population_size: 6}"], check_machine=False)
    assert make_sampler(nsga2)._population_size == 6


def test_searcher_settings_must_belong_to_the_sampler(tmp_path: Path) -> None:
    path = write(tmp_path, SAMPLED + "sampler: random\nsearcher: {n_startup_trials: 3, bogus: 1}\n")
    with pytest.raises(StudyConfigError) as caught:
        load_study(path, check_machine=False)
    assert len(caught.value.errors) == 2 and all("not a setting of the random sampler, which takes no settings" in e
                                                 for e in caught.value.errors), caught.value.errors
    with pytest.raises(StudyConfigError) as caught:
        load_study(path, ["sampler=tpe", "searcher={n_startup_trials: -1}"], check_machine=False)
    assert caught.value.errors == ["--set searcher.n_startup_trials: must be >= 0, got -1"]


def test_one_resources_reader_for_sweeps_and_scaling_cells() -> None:
    errors = ConfigErrors(None, {}, set())
    sweep = read_resources({"resources": {"cpu": 2, "max_concurrent": 3}}, errors, check_machine=False)
    assert sweep.to_dict() == {"cpu": 2.0, "gpu": 0.0, "workers_per_trial": 1, "max_concurrent": 3}
    cell = read_resources({}, errors, check_machine=False, unit="cell", gpu_auto=True, data_parallel=False)
    assert cell.to_dict() == {"cpu": 1.0, "gpu": "auto", "max_concurrent": "auto"} and not errors.items
    read_resources({"resources": {"gpu": "auto", "workers_per_trial": 2}}, errors, check_machine=False)
    read_resources({"resources": {"workers_per_trial": 2, "cpu": 10_000}}, errors, check_machine=True, unit="cell",
                   gpu_auto=True, data_parallel=False)
    assert errors.items[0].startswith("<study>: resources.gpu: expected int or float, got str 'auto'")
    assert errors.items[1].startswith("<study>: resources.workers_per_trial: unknown key; resources takes cpu, gpu, "
                                      "max_concurrent")
    assert "a cell needs 10000 CPUs" in errors.items[2] and "no cell could ever start" in errors.items[2]
