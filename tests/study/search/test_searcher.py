"""The driver's Optuna searcher across an interrupted session, without Ray trials: a grid study resumed after a
stop runs every point exactly once, a trial trained again after losing its process reaches Optuna, and Tune's
generator resumes what its trials left whichever of the two Tune saved last, or when a kill cut its saved files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from ray.tune.experiment import Experiment, Trial
from ray.tune.search import ConcurrencyLimiter

from study.layout import GENERATOR_FILE, RECORDS_DIR
from study.search.generator import StudySamples
from study.search.records import write_record
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
    resumed.close_interrupted(resumed={"a", "b"}, records={})
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
    resumed.close_interrupted(resumed={"a"}, records={})
    resumed.on_trial_complete("a", error=True)  # its record replays the failure
    assert [t.state for t in resumed._ot_study.get_trials()] == [TrialState.FAIL]


def _generator(storage_url: str, out: Path) -> StudySamples:
    generator = StudySamples(ConcurrencyLimiter(_grid_searcher(storage_url), max_concurrent=1), len(SEEDS))
    generator.storage_path = str(out)  # the resumed session's study folder (study.search.tuner sets it)
    return generator


def _save_tune_trials(folder: Path, trials: dict[str, tuple[str, int]]) -> None:
    """Tune's experiment state as Tune writes it: each trial's own JSON state (``{id: (status, seed)}``)."""
    states = []
    for trial_id, (status, seed) in trials.items():
        trial = Trial("sweep_trial", config={"seed": seed}, trial_id=trial_id, stub=True)
        trial.set_status(status)
        states.append(trial.get_json_state())
    (folder / "experiment_state-2000-01-01_00-00-00.json").write_text(json.dumps({"trial_data": states}))


def _record(out: Path, trial_id: str, seed: int, value: float) -> None:
    write_record(out / RECORDS_DIR, {"trial_id": trial_id, "status": "ok", "error": "", "config": {"seed": seed},
                                     "last_report": {METRIC: value}})


def _run(generator: StudySamples, trial_id: str, value: float) -> int:
    seed = generator.searcher.suggest(trial_id)["seed"]
    generator._counter += 1  # what Tune's create_trial_if_possible counts for each trial it creates
    generator.on_trial_complete(trial_id, {METRIC: value})
    return seed


def _run_the_rest_after_b(resumed: StudySamples, seeds: dict[str, int]) -> None:
    """After a resume of a study in which "a" finished and "b" ran: Tune trains "b" again and the generator gives
    the rest; every point runs once and every result reaches Optuna."""
    resumed.on_trial_complete("b", {METRIC: 0.5})
    for trial_id in "cde":
        seeds[trial_id] = _run(resumed, trial_id, 0.125)
    assert sorted(seeds.values()) == SEEDS and resumed.is_finished()
    study = resumed.searcher.searcher._ot_study
    values = {t.user_attrs["tune_trial_id"]: (t.state, t.value) for t in study.get_trials()}
    assert values == {"a": (TrialState.COMPLETE, 0.25), "b": (TrialState.COMPLETE, 0.5),
                      **{t: (TrialState.COMPLETE, 0.125) for t in "cde"}}


def test_a_generator_saved_before_its_trials_tells_optuna_the_resumed_trial(tmp_path: Path) -> None:
    """The kill came after Tune saved its trials but before it saved the generator (its files are written one
    after the other): the generator's concurrency slot is still held by the finished trial, so the resumed trial's
    result never reached Optuna."""
    storage_url, out, saved = f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path / "out", tmp_path / "tune"
    saved.mkdir()
    first = _generator(storage_url, out)
    seeds = {"a": first.searcher.suggest("a")["seed"]}
    first._counter = 1
    first.save_to_dir(str(saved), session_str="first")  # the generator as saved: "a" running
    first.on_trial_complete("a", {METRIC: 0.25})
    _record(out, "a", seeds["a"], 0.25)
    seeds["b"] = first.searcher.suggest("b")["seed"]
    _save_tune_trials(saved, {"a": (Trial.TERMINATED, seeds["a"]), "b": (Trial.RUNNING, seeds["b"])})

    resumed = _generator(storage_url, out)
    resumed.restore_from_dir(str(saved))
    limiter = resumed.searcher
    assert (limiter.live_trials, resumed._counter, resumed.is_finished()) == ({"b"}, 2, False)
    _run_the_rest_after_b(resumed, seeds)


def test_a_study_resumed_where_more_trials_fit_runs_that_many_at_once(tmp_path: Path) -> None:
    """Started on one CPU (one trial at a time), resumed on three: the saved limiter's one must not hold."""
    storage_url, out, saved = f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path / "out", tmp_path / "tune"
    saved.mkdir()
    first = _generator(storage_url, out)
    seeds = {"a": first.searcher.suggest("a")["seed"]}
    first._counter = 1
    assert first.searcher.suggest("x") is None  # one at a time while "a" runs
    first.save_to_dir(str(saved), session_str="first")
    _save_tune_trials(saved, {"a": (Trial.RUNNING, seeds["a"])})

    resumed = _generator(storage_url, out)
    resumed.max_concurrent = 3  # what study.search.tuner sets from this session's cluster
    resumed.restore_from_dir(str(saved))
    limiter = resumed.searcher
    assert (limiter.max_concurrent, limiter.live_trials) == (3, {"a"})
    seeds.update({trial_id: limiter.suggest(trial_id)["seed"] for trial_id in "bc"})  # beside "a": three at once
    assert limiter.suggest("d") is None
    assert len(set(seeds.values())) == 3

    unchanged = _generator(storage_url, out)  # a resume that does not say keeps what the study saved
    unchanged.restore_from_dir(str(saved))
    assert unchanged.searcher.max_concurrent == 1


def test_a_generator_saved_after_its_trials_runs_the_samples_tune_never_kept(tmp_path: Path) -> None:
    """The kill came after the generator was saved with three trials but before Tune saved more than the first:
    counted from the generator, the study ended with samples never run. "b" finished and was recorded, and
    Optuna never heard of it; "c" had just started."""
    storage_url, out, saved = f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path / "out", tmp_path / "tune"
    saved.mkdir()
    first = _generator(storage_url, out)
    seeds = {"a": _run(first, "a", 0.25)}
    _record(out, "a", seeds["a"], 0.25)
    _save_tune_trials(saved, {"a": (Trial.TERMINATED, seeds["a"])})
    seeds["b"] = first.searcher.suggest("b")["seed"]
    first._counter += 1
    _record(out, "b", seeds["b"], 0.5)  # recorded by the driver; the kill came before Optuna was told
    first.searcher.live_trials.discard("b")
    first.searcher.suggest("c")
    first._counter += 1
    first.save_to_dir(str(saved), session_str="first")

    resumed = _generator(storage_url, out)
    resumed.restore_from_dir(str(saved))
    assert (resumed.searcher.live_trials, resumed._counter, resumed.is_finished()) == (set(), 2, False)
    for trial_id in "def":
        seeds[trial_id] = _run(resumed, trial_id, 0.125)
    assert sorted(seeds.values()) == SEEDS and resumed.is_finished()
    study = resumed.searcher.searcher._ot_study
    states = {t.user_attrs["tune_trial_id"]: (t.state, t.value, t.user_attrs.get("interrupted")) for t in
              study.get_trials()}
    assert states == {"a": (TrialState.COMPLETE, 0.25, None), "b": (TrialState.COMPLETE, 0.5, None),
                      "c": (TrialState.FAIL, None, True), **{t: (TrialState.COMPLETE, 0.125, None) for t in "def"}}


def _started_generator(storage_url: str, out: Path) -> StudySamples:
    """A generator as Tune starts a study with it: ``add_configurations`` keeps its state as the study began."""
    out.mkdir(parents=True, exist_ok=True)
    generator = _generator(storage_url, out)
    generator.add_configurations(Experiment("grid", run=lambda config: None, num_samples=len(SEEDS),
                                            storage_path=str(out)))
    return generator


@pytest.mark.parametrize("damage", ["empty", "missing"])
def test_a_generator_whose_saved_files_a_kill_cut_resumes_from_the_study_folder(tmp_path: Path, damage: str) -> None:
    """Tune copies its generator and searcher files into the study folder one after the other, and a kill in the
    copy leaves them empty, or not there yet. Tune then refused to resume ("Ran out of input"), or resumed without
    a generator and ended the study after the trials it restored. The resume must still run every point once."""
    storage_url, out, saved = f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path / "out", tmp_path / "tune"
    saved.mkdir()
    first = _started_generator(storage_url, out)
    seeds = {"a": _run(first, "a", 0.25)}
    _record(out, "a", seeds["a"], 0.25)
    seeds["b"] = first.searcher.suggest("b")["seed"]
    first._counter += 1
    first.save_to_dir(str(saved), session_str="first")
    _save_tune_trials(saved, {"a": (Trial.TERMINATED, seeds["a"]), "b": (Trial.RUNNING, seeds["b"])})
    searcher_files = sorted(saved.glob("search*"))
    assert len(searcher_files) == 2  # the generator's state and the Optuna searcher's
    for path in searcher_files:
        path.write_bytes(b"") if damage == "empty" else path.unlink()

    resumed = _generator(storage_url, out)
    assert resumed.has_checkpoint(str(saved))  # else Tune would not restore it at all
    resumed.restore_from_dir(str(saved))
    assert (resumed.searcher.live_trials, resumed._counter, resumed.total_samples) == ({"b"}, 2, len(SEEDS))
    assert resumed._experiment is not None and not resumed.is_finished()
    _run_the_rest_after_b(resumed, seeds)


def test_a_generator_with_no_state_to_fall_back_on_refuses_to_resume(tmp_path: Path) -> None:
    storage_url, out, saved = f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path / "out", tmp_path / "tune"
    saved.mkdir()
    first = _started_generator(storage_url, out)
    seeds = {"a": _run(first, "a", 0.25)}
    _save_tune_trials(saved, {"a": (Trial.TERMINATED, seeds["a"])})
    (out / GENERATOR_FILE).unlink()  # a study begun before the generator kept its start state, cut by a kill
    with pytest.raises(RuntimeError, match=f"{GENERATOR_FILE}.*cannot resume this study"):
        _generator(storage_url, out).restore_from_dir(str(saved))
