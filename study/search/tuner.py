"""The Ray Tune side of a study run (:mod:`study.search.runner`): the trainable, a new Tuner or one restored from
``tune/`` and pointed at this session, and the console reporter both use.

Ray is imported inside the functions, as everywhere in the sweep, but for the Tune callbacks' base class, which
:mod:`study.search.recorder` imports too.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ray.tune import Callback

from study.layout import CHECKPOINT_PREFIX, TUNE_DIR
from study.search.budget import StudyClock, StudyEstimate, fit_line
from study.search.console import StatusReporter
from study.search.data_parallel import data_parallel_trial
from study.search.generator import StudySamples, fixed_points_search, make_searcher, study_searcher
from study.search.recorder import SweepRecorder
from study.search.searcher import make_scheduler, points_space
from study.search.tracking import tracking_callbacks
from study.search.trial import TrialPlan, sweep_trial, tune_key
from study.spec.resolved import Study
from study.storage import Mirror
from study.train.trainer import TrialData


class CheckpointLedger(Callback):
    """Keeps a trial's list of kept checkpoints true to the folders on disk, just before Tune adds a new one.

    Tune deletes a trial's oldest checkpoints past ``checkpoint.keep`` by the paths in that list, which a resumed
    study restores from ``tune/``. Two kinds of entry in it are wrong after a Ctrl-C or a kill:

    * a folder the trial deleted after the study's state was last saved: deleting it again fails, and Tune logs a
      traceback and skips the rest of that checkpoint's bookkeeping;
    * the folder the new checkpoint was just written to: the saved checkpoint index can lag the saved list by one,
      so a restored trial writes its next checkpoint under the name of the one it restored from. Dropping the old
      entry would then delete the new checkpoint; with ``keep: 1`` it is the only one, and the next resume finds
      no checkpoint.

    Both are dropped from the list before the new checkpoint is registered. Ray has no public accessor for the
    list, so a Ray that renames it fails here loudly rather than deleting checkpoints.
    """

    def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any, **info: Any) -> None:
        forget_stale_checkpoints(trial.run_metadata.checkpoint_manager, checkpoint)


def forget_stale_checkpoints(manager: Any, new: Any) -> None:
    """Drop from Tune's checkpoint ``manager`` every entry at ``new``'s path or at a path that no longer exists."""
    from pyarrow.fs import FileType

    def exists(checkpoint: Any) -> bool:
        return checkpoint.filesystem.get_file_info(checkpoint.path).type != FileType.NotFound

    manager._checkpoint_results = [result for result in manager._checkpoint_results
                                   if result.checkpoint.path != new.path and exists(result.checkpoint)]


def remove_unkept_checkpoints(results: Iterable[Any]) -> int:
    """Delete every checkpoint folder of a trial that Tune does not keep; returns how many went.

    When a run ends under its trials (the study's time budget, a scheduler's stop), a trial may have written a
    checkpoint that the driver never registered. Tune does not restore from it, does not count it against
    ``checkpoint.keep`` and never deletes it: the trial's folder holds one checkpoint more than the study keeps,
    until a resume writes over it. ``results`` are the ended run's (``tuner.fit()``'s result grid), whose kept
    checkpoints are the registered ones; nothing writes to a trial's folder once the fit has returned.
    """
    from pyarrow.fs import FileSelector, FileType

    removed = 0
    for result in results:
        kept = {checkpoint.path for checkpoint, _ in result.best_checkpoints or []}
        filesystem = result.filesystem
        for entry in filesystem.get_file_info(FileSelector(result.path, allow_not_found=True)):
            if (entry.type == FileType.Directory and entry.base_name.startswith(CHECKPOINT_PREFIX)
                    and entry.path not in kept):
                filesystem.delete_dir(entry.path)
                removed += 1
    return removed


def console_reporter(study: Study, estimate: StudyEstimate | None, concurrency: int) -> Any:
    """Short console lines (:mod:`study.search.console`): a trial's line when it ends, a status line every 30 s.

    Tune takes a ProgressReporter only with its classic console output; its newer one ignores the reporter (with
    a warning) and prints every metric of every trial in boxed tables, so the classic one is chosen here.
    """
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # read by Tune when the run starts
    objectives = {tune_key(metric): (metric, mode) for metric, mode in study.objectives.items()}
    return StatusReporter(objectives, list(study.search), expected_epoch_s=estimate.epoch_s if estimate else None,
                          budget_line=functools.partial(fit_line, study, concurrency=concurrency))


def make_trainable(study: Study, plan: TrialPlan, base_data: TrialData, train_ds: Any) -> Any:
    """The Tune trainable: the trial function with the plan and data bound (the data goes through the object store
    once), and the resources each trial reserves."""
    from ray import tune

    trial_function = data_parallel_trial if plan.workers > 1 else sweep_trial
    trainable = tune.with_parameters(trial_function, plan=plan, data=base_data, train_ds=train_ds)
    if plan.workers > 1:
        # The Tune trial only drives the TorchTrainer, whose workers reserve the CPUs/GPUs themselves; Tune
        # refuses an empty request, so the driver asks for one byte of memory (no CPU a worker would miss).
        return tune.with_resources(trainable, tune.PlacementGroupFactory([{"CPU": 0, "memory": 1}]))
    return tune.with_resources(trainable, {"cpu": study.resources.cpu, "gpu": study.resources.gpu})


def make_tuner(study: Study, out: Path, mirror: Mirror, trainable: Any, storage_url: str, clock: StudyClock, *,
               row_context: dict[str, Any], base_settings: dict[str, Any], points: list[dict[str, Any]] | None,
               quiet: bool, estimate: StudyEstimate | None, concurrency: int, max_failures: int) -> Any:
    """The Tuner of a new study: Optuna and ASHA for a search, or the fixed points each run to its full budget;
    the study's recorder, trackers, checkpoints, retries and console."""
    from ray import tune
    from ray.tune.schedulers import FIFOScheduler

    recorder = SweepRecorder(str(out), row_context, mirror, clock)
    if points is None:
        # the study's time budget is the clock's (study.search.budget), not Tune's, which drops the trials it stops
        search = dict(search_alg=make_searcher(study, storage_url, concurrency, out), scheduler=make_scheduler(study),
                      num_samples=study.budget.num_samples)
    else:  # fixed points: as many at once as the sweep runs, each to its full budget (no ASHA, no time budget)
        search = dict(search_alg=fixed_points_search(points, concurrency, out),
                      scheduler=FIFOScheduler(), num_samples=len(points))
    return tune.Tuner(
        trainable,
        param_space=None if points is None else points_space(points),
        tune_config=tune.TuneConfig(**search, reuse_actors=True),
        run_config=tune.RunConfig(name=TUNE_DIR, storage_path=str(out), stop=clock,
                                  callbacks=[recorder, CheckpointLedger(),
                                             *tracking_callbacks(study.tracking, base_settings)],
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=study.checkpoint.keep),
                                  failure_config=tune.FailureConfig(max_failures=max_failures),
                                  progress_reporter=console_reporter(study, estimate, concurrency),
                                  verbose=0 if quiet else 1),
    )


def restore_tuner(study: Study, out: Path, mirror: Mirror, trainable: Any, storage_url: str, clock: StudyClock,
                  quiet: bool, estimate: StudyEstimate | None, concurrency: int) -> Any:
    """The Tuner of a resumed study, restored from ``tune/`` and pointed at this session (:func:`_relocate`)."""
    from ray import tune

    # errored trials start again too: one whose record holds its failure replays it at once (replay_recorded),
    # one whose process was lost (the study stopped under it) trains again, from its last checkpoint if any
    tuner = tune.Tuner.restore(str(out / TUNE_DIR), trainable=trainable, resume_unfinished=True,
                               resume_errored=True, restart_errored=False)
    _relocate(tuner, out, mirror, storage_url, clock, study, quiet, estimate, concurrency)
    return tuner


def _relocate(tuner: Any, out: Path, mirror: Mirror, storage_url: str, clock: StudyClock, study: Study,
              quiet: bool, estimate: StudyEstimate | None, concurrency: int) -> None:
    """Point the restored recorder and searcher at this session's study folder, clock, budget and concurrency.

    ``Tuner.restore`` unpickles them with the paths of the session that started the study, which may have run in
    another folder or on another machine, and with that session's budget: a resume may give the study more time
    or samples. Ray keeps the restored configs on its internal tuner (no public accessor), so a Ray that moved
    them fails here loudly rather than writing to the old paths.
    """
    internal = tuner._local_tuner
    run_config = internal.get_run_config()
    recorders = [c for c in run_config.callbacks or [] if isinstance(c, SweepRecorder)]
    if not recorders:
        raise RuntimeError("the restored Tune run has no SweepRecorder; cannot resume this study here")
    for recorder in recorders:
        recorder.out_dir, recorder.mirror, recorder.clock = str(out), mirror, clock
    if not any(isinstance(c, CheckpointLedger) for c in run_config.callbacks):  # a study begun without one
        run_config.callbacks.append(CheckpointLedger())
    run_config.stop = clock
    # the console of a resumed study is this session's too: Tune's classic output with the study's short lines
    run_config.progress_reporter = console_reporter(study, estimate, concurrency)
    run_config.verbose = 0 if quiet else 1
    search = internal._tune_config.search_alg
    if isinstance(search, StudySamples):
        search.storage_path, search.max_concurrent = str(out), concurrency
        if study_searcher(search) is not None:  # a search; fixed points keep their count
            search.num_samples = study.budget.num_samples
    searcher = study_searcher(search)
    if searcher is not None:  # fixed points (replicates) have no searcher to move
        searcher.relocate(storage_url)
