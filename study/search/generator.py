"""Tune's generator of a study's trials (:class:`StudySamples`) around the searchers of
:mod:`study.search.searcher`, and how a resumed study restores it from whatever a stop left in ``tune/``.

A study killed with SIGKILL can leave Tune's saved generator and searcher files missing or empty: Tune writes
them in a staging folder and copies them to the study folder one after the other, and a kill during the copy
leaves a file of zero bytes. Tune then either fails to resume, or resumes without the generator and, knowing no
experiment and no sample count, ends the study after the trials it restored. The generator therefore also keeps
its state as the study began in the study folder (``search_generator.pkl``, written once, atomically, before
the first trial), and a resume falls back to it and to the newest searcher file that reads.
"""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray import cloudpickle
from ray.tune.search import ConcurrencyLimiter, SearchGenerator

from study.layout import GENERATOR_FILE, RECORDS_DIR
from study.search.records import atomic_write, read_records
from study.search.searcher import FixedPoints, StudySearch, optuna_search
from study.spec.resolved import Study

UNREADABLE = (OSError, EOFError, pickle.UnpicklingError, ValueError)  # a saved file a kill cut short


class StudySamples(SearchGenerator):
    """Tune's generator of a study's trials, which a resumed study may give more samples or a new folder.

    Tune restores the generator's state saved with the experiment, over what this session asked for:

    * the sample count: a study resumed with a larger ``budget.num_samples`` keeps the larger;
    * the experiment's storage, from which every new trial takes its folder: a study resumed after its folder moved
      (another path, machine or working copy) would create its new trials under the old path, where their
      checkpoints cannot be written. The new trials follow :attr:`storage_path` instead, as Tune moves the trials
      it restores itself;
    * the trials at once: a study started on one CPU and resumed on a cluster would still run one trial at a time.
      The concurrency limiter takes :attr:`max_concurrent`, what this session's cluster fits, instead.

    The restored tuner's generator gets all three before the run starts (:mod:`study.search.tuner`).

    Tune saves its trials and this generator's state at different moments (and copies them to the study folder
    one file after the other), so a study killed with SIGKILL may resume a generator newer or older than its
    trials, or none (see the module docstring). :meth:`restore_from_dir` therefore counts again from what this
    session has: the trials Tune resumes and the trials the driver recorded (:func:`restored_trials`). Otherwise
    a generator ahead of the trials ends the study with samples never run, and a concurrency limiter behind them
    never tells Optuna a resumed trial's result.
    """

    def __init__(self, searcher: Any, num_samples: int, storage_path: str | None = None):
        super().__init__(searcher)
        self.num_samples = num_samples
        self.storage_path = storage_path  # the study folder: this session's (set again on a resume)
        self.max_concurrent: int | None = None  # this session's trials at once (set on a resume)

    def add_configurations(self, experiments: Any) -> None:
        super().add_configurations(experiments)
        if self.storage_path:  # the state a resume falls back to when a kill cut Tune's copy of it
            state = cloudpickle.dumps(SearchGenerator.get_state(self))
            atomic_write(Path(self.storage_path) / GENERATOR_FILE, lambda out: out.write(state))

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if self.num_samples > self._total_samples:
            self._total_samples, self._finished = self.num_samples, False
        storage = self._experiment.spec.get("storage") if self._experiment is not None else None
        if self.storage_path and storage is not None and storage.storage_fs_path != self.storage_path:
            moved = copy.copy(storage)
            moved.storage_fs_path = self.storage_path
            self._experiment.spec["storage"] = moved
            self._experiment.storage = moved

    def has_checkpoint(self, dirpath: str) -> bool:
        # a resume always restores the generator, even when a kill cut its files: restore_from_dir falls back.
        # Tune resumes nothing without an experiment state, and Tune's own check would unpickle a cut file.
        return bool(_experiment_states(dirpath))

    def restore_from_dir(self, dirpath: str) -> None:
        found, state = _load_newest(dirpath, self.CKPT_FILE_TMPL, lambda path: cloudpickle.loads(path.read_bytes()))
        if not found:
            state = self._state_at_start()
        wrapper = self.searcher
        while hasattr(wrapper, "searcher"):  # the wrappers' saved states, as Tune's own restore sets them
            saved = state.pop("name:" + type(wrapper).__name__, None)
            if saved is not None:
                wrapper.set_state(saved)
            wrapper = wrapper.searcher
        found, _ = _load_newest(dirpath, wrapper.CKPT_FILE_TMPL, lambda path: wrapper.restore(str(path)))
        reseed = getattr(getattr(wrapper, "_sampler", None), "reseed_rng", None)
        if not found and reseed is not None:  # the sampler as the study began would draw the points already run
            reseed()
        self.set_state(state)
        self._count_again(dirpath)

    def _state_at_start(self) -> dict[str, Any]:
        path = Path(self.storage_path) / GENERATOR_FILE if self.storage_path else None
        try:
            return cloudpickle.loads(path.read_bytes())
        except (*UNREADABLE, AttributeError) as exc:
            raise RuntimeError(f"Tune's saved trial generator is missing or cut short and {path} does not read "
                               f"({exc!r}); cannot resume this study") from exc

    def _count_again(self, dirpath: str) -> None:
        """Count the trials and the concurrency slots from what this session resumes (see the class docstring)."""
        restored = restored_trials(dirpath)
        records = read_records(Path(self.storage_path) / RECORDS_DIR) if self.storage_path else {}
        started = {**{tid: record.get("config") or {} for tid, record in records.items()},
                   **{tid: trial["config"] for tid, trial in restored.items()}}
        # trials Tune runs again (errored ones too: the sweep resumes them), each taking a concurrency slot
        live = {tid for tid, trial in restored.items() if trial["status"] != "TERMINATED"}
        wrapper = self.searcher
        while wrapper is not None:
            if isinstance(wrapper, ConcurrencyLimiter):
                wrapper.live_trials, wrapper.num_unfinished_live_trials = set(live), len(live)
                wrapper.max_concurrent = self.max_concurrent or wrapper.max_concurrent
            elif isinstance(wrapper, FixedPoints):
                wrapper.resume_without(list(started.values()))
            elif isinstance(wrapper, StudySearch):
                wrapper.close_interrupted(live, records)
            wrapper = getattr(wrapper, "searcher", None)
        self._counter = len(started)
        self._finished = self._counter >= self._total_samples


def _experiment_states(dirpath: str) -> list[Path]:
    """Tune's experiment state files in ``dirpath``, oldest first (their names hold the session's start time)."""
    from ray.tune.execution.tune_controller import TuneController

    return sorted(Path(dirpath).glob(TuneController.CKPT_FILE_TMPL.format("*")))


def _load_newest(dirpath: str, pattern: str, load: Callable[[Path], Any]) -> tuple[bool, Any]:
    """``(True, load(file))`` for the newest file matching ``pattern`` (Tune's ``...-{}`` names) that reads, or
    ``(False, None)`` when none does."""
    for path in sorted(Path(dirpath).glob(pattern.format("*")), reverse=True):
        try:
            return True, load(path)
        except UNREADABLE:
            continue
    return False, None


def restored_trials(dirpath: str) -> dict[str, dict[str, Any]]:
    """``{trial_id: {"status", "config"}}`` of the trials in the newest experiment state in ``dirpath``: what Tune
    resumes.

    Tune reads the same file (the newest by name) just before it restores its search algorithm from that folder;
    each trial's saved state is a JSON text holding its id, status and config.
    """
    states = _experiment_states(dirpath)
    if not states:
        raise RuntimeError(f"no Tune experiment state in {dirpath}; cannot resume this study here")
    restored = {}
    for trial_state, _ in json.loads(states[-1].read_text())["trial_data"]:
        trial = json.loads(trial_state)
        restored[trial["trial_id"]] = {"status": trial["status"], "config": trial["config"]}
    return restored


def study_searcher(search: Any) -> StudySearch | None:
    """The :class:`StudySearch` inside Tune's wrappers (generator, concurrency limiter), if any."""
    while search is not None and not isinstance(search, StudySearch):
        search = getattr(search, "searcher", None)
    return search


def make_searcher(study: Study, storage_url: str, max_concurrent: int, out: Path) -> StudySamples:
    """Optuna over the study's search space, persisted in SQLite; the sampler follows ``study.searcher``.

    At most ``max_concurrent`` trials at once, ``budget.num_samples`` in all (see :class:`StudySamples`), for the
    study in the folder ``out``.
    """
    search = optuna_search(study, storage_url)
    return StudySamples(ConcurrencyLimiter(search, max_concurrent=max_concurrent), study.budget.num_samples,
                        storage_path=str(out))


def fixed_points_search(points: list[dict[str, Any]], max_concurrent: int, out: Path | None = None) -> StudySamples:
    """The search algorithm of a fixed-points run: :class:`FixedPoints`, at most ``max_concurrent`` at once
    (as many as the sweep runs); pass it as ``TuneConfig(search_alg=...)`` with ``num_samples=len(points)``.
    ``out`` is the run's folder, where the generator keeps its state as the run began."""
    limited = ConcurrencyLimiter(FixedPoints(points), max_concurrent=max(1, int(max_concurrent)))
    return StudySamples(limited, len(points), storage_path=str(out) if out is not None else None)
