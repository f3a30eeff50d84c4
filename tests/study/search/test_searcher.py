"""The driver's Optuna searcher across an interrupted session, without Ray trials: a grid study resumed after a
stop runs every point exactly once, and a trial trained again after losing its process reaches Optuna."""

from __future__ import annotations

from pathlib import Path

from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from study.search.searcher import INTERRUPTED_NOTE, StudyGridSampler, StudySearch

SEEDS = [1, 2, 3, 4, 5]
METRIC = "best_valid_ndcg@10"


def _grid_searcher(storage_url: str) -> StudySearch:
    return StudySearch(space={"seed": CategoricalDistribution(SEEDS)}, metric=METRIC, mode="max",
                       sampler=StudyGridSampler({"seed": SEEDS}, seed=0), storage_url=storage_url, study_name="grid")


def test_a_resumed_grid_runs_every_point_once_and_reruns_reach_optuna(tmp_path: Path) -> None:
    storage_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = _grid_searcher(storage_url)
    seeds = {trial_id: first.suggest(trial_id)["seed"] for trial_id in ("a", "b")}
    # the study is stopped: both running trials lose their process (Tune reports them as errors) ...
    first.on_trial_complete("a", error=True)
    first.on_trial_complete("b", error=True)
    first.save(str(tmp_path / "searcher.pkl"))  # ... Tune saves its state with these two trials ...
    first.suggest("orphan-1")  # ... and starts two more before the driver dies; no saved state knows them
    first.suggest("orphan-2")

    resumed = _grid_searcher(storage_url)
    resumed.restore(str(tmp_path / "searcher.pkl"))
    study = resumed._ot_study
    orphans = [t for t in study.get_trials() if t.user_attrs.get("tune_trial_id", "").startswith("orphan")]
    assert [(t.state, t.user_attrs["note"], t.user_attrs["interrupted"]) for t in orphans] == \
        [(TrialState.FAIL, INTERRUPTED_NOTE, True)] * 2
    # Tune trains the two lost trials again with their own configs, and asks for the three it never started
    resumed.on_trial_complete("a", {METRIC: 0.25})
    resumed.on_trial_complete("b", {METRIC: 0.5})
    for trial_id in ("c", "d", "e"):
        seeds[trial_id] = resumed.suggest(trial_id)["seed"]
        resumed.on_trial_complete(trial_id, {METRIC: 0.125})
    assert sorted(seeds.values()) == SEEDS  # every point once: none lost to the orphans, none run twice

    by_tune_id: dict[str, list[tuple[TrialState, float | None]]] = {}
    for trial in study.get_trials():
        by_tune_id.setdefault(trial.user_attrs["tune_trial_id"], []).append((trial.state, trial.value))
    # a told trial is final in Optuna, so a lost trial keeps its FAIL and its real outcome is a trial of its own
    assert by_tune_id["a"] == [(TrialState.FAIL, None), (TrialState.COMPLETE, 0.25)]
    assert by_tune_id["b"] == [(TrialState.FAIL, None), (TrialState.COMPLETE, 0.5)]
    assert [by_tune_id[t] for t in "cde"] == [[(TrialState.COMPLETE, 0.125)]] * 3
    assert not study.get_trials(states=(TrialState.RUNNING,))


def test_a_replayed_failure_stays_one_failed_trial(tmp_path: Path) -> None:
    storage_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = _grid_searcher(storage_url)
    first.suggest("a")
    first.on_trial_complete("a", error=True)
    first.save(str(tmp_path / "searcher.pkl"))
    resumed = _grid_searcher(storage_url)
    resumed.restore(str(tmp_path / "searcher.pkl"))
    resumed.on_trial_complete("a", error=True)  # its record replays the failure
    assert [t.state for t in resumed._ot_study.get_trials()] == [TrialState.FAIL]
