"""The driver's search: Optuna's sampler inside Tune's ``OptunaSearch``, the grid, fixed points, and ASHA.

Optuna (TPE, multi-objective TPE/NSGA-II, random or grid) suggests each trial's searched keys; the study lives in
SQLite (``optuna.db``) so optuna-dashboard can open it and ``--resume`` continues it. The sampler's settings
(TPE's random start-up trials, NSGA-II's generation size) are resolved with the study
(:class:`study.spec.fields.Searcher`), so the resolved ``study.yaml`` records exactly what the sampler got.
"""

from __future__ import annotations

import copy
import json
import math
import pickle
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from study.search.records import STATUS_OK, STUDY_TIME_BUDGET, lost_process
from study.search.trial import tune_key
from study.spec.resolved import Study


class StudySearch(OptunaSearch):
    """OptunaSearch that labels Optuna trials with their Tune trial id and tells every outcome explicitly.

    Ray's version tells a trial that failed after reporting as COMPLETE with its last values; here a failed
    trial is always FAIL, a trial with a non-finite objective FAIL, and one that reported nothing (stopped
    before its first epoch) PRUNED.

    Its pickled forms (Tune's ``tuner.pkl`` and searcher checkpoints) hold the Optuna database's URL, not a live
    connection, so that a study resumes wherever its folder is now (moved, pulled from a URI onto another
    machine, a new working copy on a Ray Client head node): :meth:`relocate` points it at this session's database.
    """

    def __init__(self, *args: Any, storage_url: str, **kwargs: Any):
        super().__init__(*args, storage=optuna.storages.RDBStorage(storage_url), **kwargs)
        self._storage_url = storage_url

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Optuna's storage reconnects when unpickled, to a path that may no longer exist: keep ids, not objects
        state.update(_storage=None, _ot_study=None,
                     _ot_trials={tid: trial._trial_id for tid, trial in self._ot_trials.items()})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        database = Path(self._storage_url.removeprefix("sqlite:///"))
        if database.is_file():  # where it was: usable at once (a resume in place, or a copy of the searcher)
            self.relocate(self._storage_url)

    def save(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "wb") as out:
            pickle.dump(self.__getstate__(), out)

    def restore(self, checkpoint_path: str) -> None:
        import pickle

        here = self._storage_url  # set by relocate() before Tune restores the saved state
        with open(checkpoint_path, "rb") as saved:
            self.__dict__.update(pickle.load(saved))
        self.relocate(here)

    def close_interrupted(self, resumed: set[str], records: dict[str, dict[str, Any]]) -> None:
        """Match Optuna's RUNNING trials to what a resumed session will run
        (:meth:`study.search.generator.StudySamples.restore_from_dir`).

        Tune saves its trials and this searcher at different moments, so after a kill either may be the newer:

        * a trial Tune resumes (``resumed``) reports to its Optuna trial, even one begun after this searcher's
          state was saved (found again by its ``tune_trial_id``);
        * a trial Tune lost but the driver recorded gets the outcome of its record;
        * any other was suggested just before the stop and no Tune trial will ever report it: it fails, marked
          ``interrupted``. Left RUNNING it would count as a taken grid point (:class:`StudyGridSampler`) and the
          grid would run another point twice.
        """
        storage = self._ot_study._storage
        for trial in self._ot_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            tune_id = trial.user_attrs.get("tune_trial_id")
            if tune_id in resumed:
                self._ot_trials[tune_id] = optuna.trial.Trial(self._ot_study, trial._trial_id)
                continue
            self._ot_trials.pop(tune_id, None)
            if tune_id in records and tell_from_record(self._ot_study, trial, records[tune_id], self._metrics()):
                continue
            storage.set_trial_user_attr(trial._trial_id, "note", INTERRUPTED_NOTE)
            storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            self._ot_study.tell(trial.number, state=TrialState.FAIL)

    def _metrics(self) -> list[str]:
        return self._metric if isinstance(self._metric, list) else [self._metric]

    def relocate(self, storage_url: str) -> None:
        """Use the Optuna database at ``storage_url`` (the study's and its trials' ids are kept in the file)."""
        storage = optuna.storages.RDBStorage(storage_url)
        study = optuna.load_study(study_name=self._study_name, storage=storage, sampler=self._sampler,
                                  pruner=optuna.pruners.NopPruner())
        trials = {tid: getattr(trial, "_trial_id", trial) for tid, trial in self._ot_trials.items()}
        self._storage_url, self._storage, self._ot_study = storage_url, storage, study
        self._ot_trials = {tid: optuna.trial.Trial(study, trial_id) for tid, trial_id in trials.items()}

    def suggest(self, trial_id: str) -> dict | None:
        params = super().suggest(trial_id)
        if trial_id in self._ot_trials:
            self._ot_trials[trial_id].set_user_attr("tune_trial_id", trial_id)
        return params

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if result.get("replayed") or self._finished_in_storage(trial_id):
            return
        with warnings.catch_warnings():
            # a trial rerun after an interruption reports its epochs again; Optuna keeps the first values
            warnings.filterwarnings("ignore", message=".*is already reported")
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self._ot_trials:
            return
        state, values = self._outcome(result, error)
        if self._finished_in_storage(trial_id):
            # told in an earlier session: replayed now, or trained again because its process was lost; then Optuna
            # holds a FAIL for it (a told trial is final) and gets the real outcome as a trial of its own
            # (or, stopped by the study's time budget, a COMPLETE with its values so far, and the final ones too)
            stored = self._ot_study._storage.get_trial(self._ot_trials[trial_id]._trial_id)
            budget_stopped = bool(stored.user_attrs.get(STUDY_TIME_BUDGET))
            if (stored.state == TrialState.FAIL or budget_stopped) and state == TrialState.COMPLETE:
                note = ("continued after the study's time budget stopped it" if budget_stopped
                        else "trained again after an interrupted session")
                self._ot_study.add_trial(optuna.trial.create_trial(
                    params=stored.params, distributions=stored.distributions,
                    values=values, state=state, user_attrs={"tune_trial_id": trial_id, "note": note}))
            self._completed_trials.add(trial_id)
            return
        try:
            self._ot_study.tell(self._ot_trials[trial_id], values, state=state)
        except RuntimeError as exc:
            # the grid sampler calls study.stop() after the last point, which only works inside optimize()
            if "Study.stop" not in str(exc):
                raise
        self._completed_trials.add(trial_id)

    def _outcome(self, result: dict | None, error: bool) -> tuple[TrialState, list[float] | None]:
        """The Optuna state and objective values of a Tune trial that ended (see the class docstring)."""
        values = [result.get(m) for m in self._metrics()] if result and not error else None
        if values is not None and not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            state, values = TrialState.FAIL, None
        elif error:
            state = TrialState.FAIL
        elif values is None:
            state = TrialState.PRUNED
        else:
            state = TrialState.COMPLETE
        return state, values

    def _finished_in_storage(self, trial_id: str) -> bool:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            return False
        return self._ot_study._storage.get_trial(ot_trial._trial_id).state.is_finished()


INTERRUPTED_NOTE = "orphaned by an interrupted session"
BUDGET_NOTE = "stopped by the study's time budget: values of its best epoch so far"
RECORDED_NOTE = "told from the driver's record: Optuna did not hear the trial end before the session stopped"


class StudyGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid, where a point whose trial an interrupted session left behind is still to be run.

    Optuna counts every finished trial's point as visited, and once none is left hands out running points again.
    A trial failed by :meth:`StudySearch.close_interrupted` never ran, so its point stays open: a resumed grid runs
    every point once (the trials Tune resumes keep theirs).
    """

    def _get_unvisited_grid_ids(self, study: optuna.Study) -> list[int]:
        visited, running = set(), set()
        for trial in study._storage.get_all_trials(study._study_id, deepcopy=False):
            if "grid_id" not in trial.system_attrs or not self._same_search_space(trial.system_attrs["search_space"]):
                continue
            if trial.state == TrialState.RUNNING:
                running.add(trial.system_attrs["grid_id"])
            elif trial.state.is_finished() and not trial.user_attrs.get("interrupted"):
                visited.add(trial.system_attrs["grid_id"])
        grid = set(range(self._n_min_trials))
        return sorted(grid - visited - running) or sorted(grid - visited)


def make_sampler(study: Study) -> Any:
    """The Optuna sampler ``study.searcher`` describes, seeded by ``seeds.sampler``."""
    searcher, seed = study.searcher, study.seeds["sampler"]
    if searcher.sampler == "grid":
        return StudyGridSampler({n: p.values for n, p in study.search.items()}, seed=seed)
    if searcher.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if searcher.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=searcher.population_size)
    # TPE (multi-objective when several objectives); the random start-up covers every choice value
    return optuna.samplers.TPESampler(seed=seed, multivariate=searcher.multivariate,
                                      n_startup_trials=searcher.n_startup_trials,
                                      n_ei_candidates=searcher.n_ei_candidates)


def optuna_search(study: Study, storage_url: str) -> StudySearch:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space = {}
    for name, param in study.search.items():
        if param.kind in ("choice", "grid"):
            space[name] = CategoricalDistribution(param.values)
        elif param.kind == "int":
            space[name] = IntDistribution(param.low, param.high, step=param.step or 1, log=param.log)
        else:
            space[name] = FloatDistribution(param.low, param.high, step=param.step, log=param.kind == "loguniform")
    sampler = make_sampler(study)
    metrics = [tune_key(m) for m in study.objectives]
    modes = list(study.objectives.values())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if len(metrics) == 1:
        return StudySearch(space=space, metric=metrics[0], mode=modes[0], sampler=sampler, storage_url=storage_url,
                           study_name=study.name)
    return StudySearch(space=space, metric=metrics, mode=modes, sampler=sampler, storage_url=storage_url,
                       study_name=study.name)


def make_scheduler(study: Study) -> Any:
    """ASHA on the study's validation metric over ``budget.max_epochs`` epochs, or FIFO when the study has none."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    scheduler = study.scheduler
    if scheduler is None:
        return FIFOScheduler()
    return ASHAScheduler(time_attr="epoch", metric=tune_key(scheduler.metric), mode=scheduler.mode,
                         max_t=study.budget.max_epochs, grace_period=scheduler.grace_period,
                         reduction_factor=scheduler.reduction_factor)


def close_orphans(storage_url: str, study_name: str, records: dict[str, dict[str, Any]],
                  objectives: list[str]) -> dict[str, int]:
    """Close the Optuna trials a session left RUNNING; map Tune trial ids to Optuna numbers.

    A RUNNING trial with a record gets its outcome (:func:`tell_from_record`); any other was interrupted and is FAIL.
    """
    study = optuna.load_study(study_name=study_name, storage=storage_url)
    metrics = [tune_key(objective) for objective in objectives]
    numbers = {}
    for trial in study.get_trials(deepcopy=False):
        tune_id = trial.user_attrs.get("tune_trial_id")
        if trial.state == TrialState.RUNNING and not tell_from_record(study, trial, records.get(tune_id), metrics):
            study._storage.set_trial_user_attr(trial._trial_id, "note", INTERRUPTED_NOTE)
            study.tell(trial.number, state=TrialState.FAIL)
        if tune_id:
            numbers[tune_id] = trial.number
    return numbers


def tell_from_record(study: optuna.Study, trial: optuna.trial.FrozenTrial, record: dict[str, Any] | None,
                     metrics: list[str]) -> bool:
    """Tell Optuna the outcome the driver recorded for a trial it never heard end; False when there is none.

    A trial the study's time budget stopped is a result: Optuna gets the objectives of its record (the best epoch
    so far), marked ``study_time_budget`` so that a resume which trains it on adds its final values as a trial of
    their own. A finished trial gets its values; a trial that failed on its own is FAIL. A trial whose process was
    lost has no outcome.
    """
    if record is None or lost_process(record):
        return False
    report = record.get("last_report") or {}
    values = [report.get(metric) for metric in metrics]
    finite = all(_finite(v) for v in values)
    if record.get("stop_reason") == STUDY_TIME_BUDGET and finite:
        study._storage.set_trial_user_attr(trial._trial_id, "note", BUDGET_NOTE)
        study._storage.set_trial_user_attr(trial._trial_id, STUDY_TIME_BUDGET, True)
        study.tell(trial.number, values, state=TrialState.COMPLETE)
    elif record["status"] == STATUS_OK and finite:
        study._storage.set_trial_user_attr(trial._trial_id, "note", RECORDED_NOTE)
        study.tell(trial.number, values, state=TrialState.COMPLETE)
    elif record.get("stop_reason") == STUDY_TIME_BUDGET:
        return False
    else:
        study._storage.set_trial_user_attr(trial._trial_id, "note", RECORDED_NOTE)
        study.tell(trial.number, state=TrialState.FAIL)
    return True


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class FixedPoints(Searcher):
    """Tune's trials for given configs, one per point in order: what :mod:`study.replicate` runs.

    Tune names a trial after what created it. A searcher's trials (the sweep's Optuna search) come through
    ``SearchGenerator``, which gives each ``Trial.generate_id()``'s 8 hex digits; ``BasicVariantGenerator``'s
    ``points_to_evaluate`` get a per-run prefix and a counter instead (``39e5d_00000``). Serving the points from a
    :class:`~ray.tune.search.Searcher` gives every command the same kind of trial id, through Tune's public API.
    Its state (the points, those not handed out yet) is saved with Tune's experiment; on a resume the points are
    matched again to the trials the batch has (:meth:`study.search.generator.StudySamples.restore_from_dir`), so
    each point starts once.
    """

    def __init__(self, points: list[dict[str, Any]]) -> None:
        super().__init__()
        self._points = [copy.deepcopy(dict(point)) for point in points]
        self._pending = list(range(len(self._points)))  # indices of the points no trial has taken yet, in order

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any],
                              **spec: Any) -> bool:
        # every point sets every key, so the run's param_space (points_space) has nothing left to resolve
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str:
        if not self._pending:
            return Searcher.FINISHED
        return copy.deepcopy(self._points[self._pending.pop(0)])

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        pass  # nothing to learn: the points are fixed

    def resume_without(self, configs: list[dict[str, Any]]) -> None:
        """Leave pending only the points that none of ``configs`` (the trials a resumed batch has) ran, each
        config taking one point."""
        taken = Counter(_point_key(config, self._points[0]) for config in configs) if self._points else Counter()
        self._pending = []
        for index, point in enumerate(self._points):
            key = _point_key(point, point)
            if taken[key]:
                taken[key] -= 1
            else:
                self._pending.append(index)

    def get_state(self) -> dict[str, Any]:
        return {"points": copy.deepcopy(self._points), "pending": list(self._pending)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._points = state["points"]
        # a batch saved before points were tracked one by one kept how many it had handed out, in order
        given = int(state.get("given", 0))
        self._pending = list(state.get("pending", range(given, len(self._points))))

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as out:
            pickle.dump(self.get_state(), out)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as saved:
            self.set_state(pickle.load(saved))


def _point_key(config: dict[str, Any], point: dict[str, Any]) -> str:
    """A fixed point's values in ``config``, as comparable text (a trial's config holds every key of its point)."""
    return json.dumps({key: config.get(key) for key in point}, sort_keys=True, default=str)


def points_space(points: list[dict[str, Any]]) -> dict[str, Any]:
    """A param_space holding every value the fixed points use: Tune only presets keys its space declares.

    Every point must set every key, or Tune would draw the missing one from this space at random.
    """
    from ray import tune

    keys = set(points[0]) if points else set()
    if any(set(p) != keys for p in points):
        raise ValueError("every fixed point must set the same keys")
    return {key: tune.choice(list({json.dumps(p[key], sort_keys=True): p[key] for p in points}.values()))
            for key in sorted(keys)}

