"""Running a validated :class:`~study.spec.sweep.Study` on Ray Tune with Optuna, ASHA and Ray Data.

Data flow (driver → trials → driver):

1. the dataset is prepared once on the driver (``study.data.prepare``) for the longest ``max_len`` any trial may
   use; the evaluation arrays (:class:`~study.train.trainer.TrialData`)
   and the training windows (read by the driver into
   a materialized Ray Dataset) go to every trial through the object store (``tune.with_parameters``), so a trial
   on another node never needs the driver's disk nor runs a dataset recipe;
2. Optuna (TPE, multi-objective TPE/NSGA-II, random or grid) suggests each trial's searched keys; the study lives
   in SQLite (``optuna.db``) so optuna-dashboard can open it and ``--resume`` continues it;
3. each trial measures its efficiency figures once, before its first epoch (they depend on the configuration,
   not on the trained weights), then trains with :func:`study.train.trainer.run_trial`, iterating its batches from Ray
   Data, and reports every epoch: the epoch's validation metrics, the best-validation ones so far, the test
   metrics of that best epoch, and the efficiency figures. ASHA therefore prunes on validation every epoch,
   and a trial it stops early still carries every objective (``peak_mem_mb: min`` included) to Optuna;
4. the driver's :class:`SweepRecorder` writes a durable record the moment a trial ends, and rebuilds the tables
   (:mod:`study.search.recorder`).

Selection uses validation only: a ``valid_…`` objective is read at the trial's best-validation epoch
(``best_valid_…`` in the reports); ``test_…`` figures are recorded, never optimised.

With ``resources.workers_per_trial > 1`` a trial runs data-parallel: it launches a Ray Train ``TorchTrainer``
whose workers each read their own shard of the training windows and average gradients before every optimizer
step (see :func:`_data_parallel_trial`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from optuna.trial import TrialState
from ray.tune import Callback
from ray.tune.search.optuna import OptunaSearch

import models
from study.analysis.runs import ENVIRONMENT_FILE, OPTUNA_FILE, RECORDS_DIR, STUDY_FILE, TUNE_DIR, table_paths
from study.cluster import WORKER_ENV, check_fits, is_client, node_identity, start_ray
from study.errors import UserError
from study.search.recorder import (
    STATUS_FAILED,
    STATUS_OK,
    atomic_write_text,
    build_row,
    history_row,
    read_records,
    stop_reason,
    summary,
    write_record,
    write_tables,
)
from study.spec.sweep import Study
from study.storage import Mirror
from study.train.results import json_safe
from study.train.trainer import TrialData

__all__ = ["WORKER_ENV", "run_study"]  # WORKER_ENV lives in study.cluster; kept importable from here


def tune_key(objective: str) -> str:
    """The reported metric an objective reads: validation at the best epoch, efficiency as measured."""
    if objective.startswith("valid_"):
        return "best_" + objective
    if objective == "epoch_time_s":
        return "median_epoch_time_s"  # the per-epoch `epoch_time_s` stays in history
    return objective


# ---------------------------------------------------------------------------------------------------------------
# Inside a trial


@dataclass
class TrialPlan:
    """What every trial shares, besides the data: the model, the settings that are not searched, the threads."""

    model: str
    base_settings: dict[str, Any]
    threads: int
    measure_efficiency: bool
    records_dir: str
    shuffle_rows: int
    # Trials recorded by an earlier session, {trial_id: record}: read by the driver, because a trial may run on a
    # node that cannot see the driver's records folder.
    recorded: dict[str, dict[str, Any]] | None = None
    workers: int = 1
    cpu: float = 1.0
    gpu: float = 0.0


def crop_trial_data(base: TrialData, max_len: int) -> TrialData:
    """Cut the shared windows (prepared for the longest max_len) to this trial's; copies, so arrays are writable."""
    def crop(split: Any) -> Any:
        return type(split)(inputs=np.array(split.inputs[:, -max_len:]), targets=split.targets,
                           history_items=split.history_items, history_starts=split.history_starts,
                           history_lengths=split.history_lengths)

    return TrialData(meta=base.meta, train=np.array(base.train[:, -(max_len + 1):]), valid=crop(base.valid),
                     test=crop(base.test), item_popularity=base.item_popularity)


def as_windows(column: Any) -> np.ndarray:
    """A batch's ``train`` column as a 2-D int array.

    Ray 2.60 hands a fixed_size_list<int32> column to numpy as a 1-D object array of 1-D arrays (a tensor
    column, e.g. after ``map_batches``, comes back 2-D already), so stack when needed.
    """
    array = np.asarray(column)
    if array.dtype == object:
        array = np.stack(list(array))
    return array


def keep_trainable(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    """Drop user windows with no (input, target) pair, as the in-memory shuffle does.

    Windows are left-padded, so "some input and a target" is columns -2 and -1 being real items, whatever
    max_len a trial later crops to.
    """
    windows = as_windows(batch["train"])
    return {"train": windows[(windows[:, -2] > 0) & (windows[:, -1] > 0)]}


def ray_data_batches(iterable: Any, batch_size: int, seed: int, max_len: int,
                     shuffle_rows: int) -> Callable[[int], Iterable[np.ndarray]]:
    """``train_batches(epoch)`` for run_trial: shuffled user windows from a Ray Dataset or a shard iterator.

    The local shuffle buffer holds the whole (small) training set, so each epoch is a full shuffle seeded by the
    trial seed and the epoch, done in the trial's process: no Ray tasks, so nothing competes for the CPUs trials
    hold.
    """
    def epoch_batches(epoch: int) -> Iterable[np.ndarray]:
        for batch in iterable.iter_batches(batch_size=batch_size, batch_format="numpy", prefetch_batches=1,
                                           local_shuffle_buffer_size=max(shuffle_rows, batch_size),
                                           local_shuffle_seed=seed * 1_000_003 + epoch):
            yield as_windows(batch["train"])[:, -(max_len + 1):]

    return epoch_batches


def _preflight(model_name: str, settings: dict[str, Any], data: TrialData, measure: bool) -> dict[str, Any]:
    """Figures known before training: parameters, peak memory, inference latency, the popularity baseline.

    Measured on the freshly built model: memory and latency depend on the configuration, not on the weights.
    """
    import torch

    from study.train import efficiency
    from study.train.config import split_settings
    from study.train.metrics import popularity_metrics, sample_negatives
    from study.train.objectives import resolve_objective
    from study.train.results import kernel_path
    from study.train.trainer import efficiency_figures, resolve_device, seed_everything

    train_cfg, hparams = split_settings(model_name, settings)
    hparams = {**hparams, "num_items": data.num_items,
               "max_len": hparams.get("max_len", models.model_class(model_name).config_class.max_len)}
    device = resolve_device(train_cfg.device)
    seed_everything(train_cfg.seed)
    model = models.build(model_name, **hparams).to(device)
    objective = resolve_objective(model, train_cfg.objective)
    figures: dict[str, Any] = {"params": efficiency.count_parameters(model), "objective": objective,
                               "device": str(device), "kernel_path": kernel_path(device)}
    if measure:
        figures.update(efficiency_figures(model_name, hparams, train_cfg, data, model, device))
    negatives = None
    if train_cfg.eval_mode == "sampled":  # the same test negatives run_trial draws (seed + 1 for the test split)
        popularity = data.item_popularity if train_cfg.negative_sampler == "popularity" else None
        negatives = sample_negatives(data.test, data.num_items, train_cfg.num_negatives, popularity,
                                     seed=train_cfg.seed + 1)
    figures["pop_ndcg@10"] = popularity_metrics(data.test, data.item_popularity, negatives=negatives)["ndcg@10"]
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return figures


class EpochReporter:
    """Turns each :class:`~study.train.trainer.EpochReport` into one flat Tune report (history + objectives)."""

    def __init__(self, figures: dict[str, Any], batch_size: int, started: float,
                 report: Callable[[dict[str, Any]], None]):
        self.figures, self.batch_size, self.started, self.report = figures, batch_size, started, report
        self.epoch_times: list[float] = []
        self.throughputs: list[float] = []
        self.node = node_identity()

    def __call__(self, epoch_report: Any) -> None:
        from study.train.results import kernel_path

        self.epoch_times.append(epoch_report.epoch_time_s)
        if math.isfinite(epoch_report.throughput):
            self.throughputs.append(epoch_report.throughput)
        throughput = statistics.median(self.throughputs) if self.throughputs else float("nan")
        metrics = {
            **epoch_report.flat(),
            **self.figures,
            "kernel_path": kernel_path(_device(self.figures)),  # known only once the model has run
            "median_epoch_time_s": statistics.median(self.epoch_times),
            "train_throughput": throughput,
            # one optimizer step = batch_size sequences (the last batch of an epoch may be smaller)
            "step_time_ms": 1000.0 * self.batch_size / throughput if throughput > 0 else float("nan"),
            "extra_json": json.dumps(json_safe(epoch_report.extra)),
            "trial_started_at": self.started,
            "process_started_at": _process_started_at(),
            "trial_compute_s": time.time() - self.started,
            "pid": os.getpid(),
            # where the trial ran (Tune's own `node_ip` is bookkeeping, dropped from records)
            "trial_node_id": self.node["node_id"],
            "trial_node_ip": self.node["node_ip"],
        }
        self.report(metrics)


def _process_started_at() -> float | None:
    """When this (actor) process was created: splits a trial's cold start into scheduling and imports."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # psutil comes with ray[default]; without it the benchmark just shows less detail
        return None


def _device(figures: dict[str, Any]) -> Any:
    import torch

    return torch.device(figures.get("device", "cpu"))


def _trial_settings(plan: TrialPlan, config: dict[str, Any]) -> dict[str, Any]:
    settings = {**plan.base_settings, **config}
    settings.setdefault("num_threads", plan.threads)
    # Efficiency is measured once before the first epoch (see _preflight), not again at the end.
    settings["measure_efficiency"] = False
    return settings


class TrialFailed(RuntimeError):
    """A trial that failed before (its record says so); raised again on resume so it stays failed."""


def sweep_trial(config: dict[str, Any], *, plan: TrialPlan, data: TrialData, train_ds: Any) -> None:
    """The Tune function trainable: one configuration, reported every epoch."""
    from ray import tune

    started = time.time()
    trial_id = tune.get_context().get_trial_id()
    record = (plan.recorded or {}).get(trial_id)
    if record is not None:
        # The driver recorded this trial's end before a crash that Tune's own state missed: replay it, don't retrain.
        if record["status"] != STATUS_OK:
            raise TrialFailed(record.get("error") or "failed before the study was interrupted")
        tune.report({**record["last_report"], "replayed": True})
        return
    if plan.workers > 1:
        _data_parallel_trial(config, plan, data, train_ds, started)
        return

    import torch

    from study.train.config import split_settings
    from study.train.trainer import run_trial

    _quiet_ray_data()
    settings = _trial_settings(plan, config)
    train_cfg, hparams = split_settings(plan.model, settings)
    torch.set_num_threads(train_cfg.num_threads)
    max_len = hparams.get("max_len", models.model_class(plan.model).config_class.max_len)
    trial_data = crop_trial_data(data, max_len)
    figures = _preflight(plan.model, settings, trial_data, plan.measure_efficiency)
    reporter = EpochReporter(figures, train_cfg.batch_size, started, tune.report)
    batches = ray_data_batches(train_ds, train_cfg.batch_size, train_cfg.seed, max_len, plan.shuffle_rows)
    run_trial(plan.model, trial_data, settings, callback=reporter, train_batches=batches)


# ---------------------------------------------------------------------------------------------------------------
# Data-parallel trials: a Ray Train TorchTrainer under the Tune trial


def _data_parallel_trial(config: dict[str, Any], plan: TrialPlan, data: TrialData, train_ds: Any,
                         started: float) -> None:
    """Run one configuration on ``plan.workers`` Ray Train workers, each reading its own shard.

    The trainer needs no DDP wrapper: every worker builds the same model from the same seed, and a global
    optimizer pre-step hook averages all gradients across workers before each step, so the replicas stay equal.
    ``streaming_split(equal=True)`` gives each worker the same number of windows, hence the same number of steps
    (the sweep refuses the ``last`` objective here, whose prefix expansion would break that). Every worker
    evaluates the full validation set (identical results); rank 0's reports go to Tune.
    """
    from ray.train import DataConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune import get_context
    from ray.tune.integration.ray_train import TuneReportCallback

    context = get_context()
    trainer = TorchTrainer(
        _data_parallel_worker,
        train_loop_config={"config": config, "plan": plan, "data": data, "started": started},
        scaling_config=ScalingConfig(num_workers=plan.workers, use_gpu=plan.gpu > 0,
                                     resources_per_worker={"CPU": plan.cpu, **({"GPU": plan.gpu} if plan.gpu else {})}),
        datasets={"train": train_ds},
        dataset_config=DataConfig(datasets_to_split=["train"]),
        # Train's own run state stays on the trial's node (the study's folder may be on another machine): the
        # metrics reach the study through Tune
        run_config=RunConfig(name=context.get_trial_id(), storage_path=os.path.join(tempfile.gettempdir(),
                                                                                     "seqrec-study-train"),
                             callbacks=[TuneReportCallback()]),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error


def _data_parallel_worker(loop_config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from study.train.config import split_settings
    from study.train.trainer import run_trial

    config, plan, data, started = (loop_config[k] for k in ("config", "plan", "data", "started"))
    _quiet_ray_data()
    logging.getLogger("ray.train").setLevel(logging.WARNING)  # Train logs every report of every worker
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    settings = _trial_settings(plan, config)
    train_cfg, hparams = split_settings(plan.model, settings)
    torch.set_num_threads(train_cfg.num_threads)
    max_len = hparams.get("max_len", models.model_class(plan.model).config_class.max_len)
    trial_data = crop_trial_data(data, max_len)
    # Only rank 0 measures: the figures describe one replica, and the memory probe must not join the all-reduce.
    figures = _preflight(plan.model, settings, trial_data, plan.measure_efficiency and rank == 0)
    figures["workers"] = world

    def average_gradients(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p)
                 for group in optimizer.param_groups for p in group["params"]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for group in optimizer.param_groups:
            for p in group["params"]:
                n = p.numel()
                p.grad = flat[offset:offset + n].view_as(p).clone()
                offset += n

    def report(metrics: dict[str, Any]) -> None:
        ray.train.report(metrics)  # every rank reports (Train requires it); the Tune callback forwards rank 0's

    reporter = EpochReporter(figures, train_cfg.batch_size, started, report)
    shard = ray.train.get_dataset_shard("train")
    batches = ray_data_batches(shard, train_cfg.batch_size, train_cfg.seed, max_len, plan.shuffle_rows // world + 1)
    handle = register_optimizer_step_pre_hook(average_gradients)
    try:
        run_trial(plan.model, trial_data, settings, callback=reporter, train_batches=batches)
    finally:
        handle.remove()


# ---------------------------------------------------------------------------------------------------------------
# Driver side: the searcher, the recorder, the run


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
        import optuna

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

    def relocate(self, storage_url: str) -> None:
        """Use the Optuna database at ``storage_url`` (the study's and its trials' ids are kept in the file)."""
        import optuna

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
        if trial_id in self._completed_trials or trial_id not in self._ot_trials:
            return
        if self._finished_in_storage(trial_id):  # told before an interruption; its record is replayed now
            self._completed_trials.add(trial_id)
            return
        ot_trial = self._ot_trials[trial_id]
        metrics = self._metric if isinstance(self._metric, list) else [self._metric]
        values = [result.get(m) for m in metrics] if result and not error else None
        if values is not None and not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            state, values = TrialState.FAIL, None
        elif error:
            state = TrialState.FAIL
        elif values is None:
            state = TrialState.PRUNED
        else:
            state = TrialState.COMPLETE
        if values is not None and not isinstance(self._metric, list):
            values = values[0]
        try:
            self._ot_study.tell(ot_trial, values, state=state)
        except RuntimeError as exc:
            # the grid sampler calls study.stop() after the last point, which only works inside optimize()
            if "Study.stop" not in str(exc):
                raise
        self._completed_trials.add(trial_id)

    def _finished_in_storage(self, trial_id: str) -> bool:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            return False
        return self._ot_study._storage.get_trial(ot_trial._trial_id).state.is_finished()


def make_searcher(study: Study, storage_url: str) -> Any:
    """Optuna over the study's search space, persisted in SQLite; the sampler follows ``study.resolved_sampler``."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space = {}
    for name, param in study.search.items():
        if param.kind in ("choice", "grid"):
            space[name] = CategoricalDistribution(param.values)
        elif param.kind == "int":
            space[name] = IntDistribution(param.low, param.high, step=param.step or 1, log=param.log)
        else:
            space[name] = FloatDistribution(param.low, param.high, step=param.step, log=param.kind == "loguniform")
    seed = study.seeds["sampler"]
    samples = study.budget["num_samples"]
    kind = study.resolved_sampler
    if kind == "grid":
        sampler = optuna.samplers.GridSampler({n: p.values for n, p in study.search.items()}, seed=seed)
    elif kind == "random":
        sampler = optuna.samplers.RandomSampler(seed=seed)
    elif kind == "nsga2":
        # a generation smaller than Optuna's 50 so that small studies evolve at all
        sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, samples // 4)))
    else:
        # TPE (multivariate, multi-objective when several objectives); random start-up scaled to the budget
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                             n_startup_trials=max(2, min(10, samples // 3)))
    metrics = [tune_key(m) for m in study.objectives]
    modes = list(study.objectives.values())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if len(metrics) == 1:
        return StudySearch(space=space, metric=metrics[0], mode=modes[0], sampler=sampler, storage_url=storage_url,
                           study_name=study.name)
    return StudySearch(space=space, metric=metrics, mode=modes, sampler=sampler, storage_url=storage_url,
                       study_name=study.name)


def make_scheduler(study: Study) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if study.scheduler is None:
        return FIFOScheduler()
    return ASHAScheduler(time_attr="epoch", metric=tune_key(study.scheduler["metric"]), mode=study.scheduler["mode"],
                         max_t=study.budget["max_epochs"], grace_period=study.scheduler["grace_period"],
                         reduction_factor=study.scheduler["reduction_factor"])


def _error_message(trial: Any) -> str:
    """The original exception of a failed trial as ``Type: message`` (Ray wraps it in its own errors).

    Read from the trial's local error files: when the driver's callback runs, Tune has written them there but
    not yet synced them to the storage path that ``Trial.get_pickled_error`` reads.
    """
    import ray.cloudpickle

    error = None
    try:
        with open(trial.pickled_error_file, "rb") as handle:
            error = ray.cloudpickle.load(handle)
    except Exception:  # missing or not unpicklable on the driver: fall back to the text trace
        pass
    seen = 0
    while error is not None and getattr(error, "cause", None) is not None and seen < 5:
        error, seen = error.cause, seen + 1
    if error is not None:
        text = str(error).strip().splitlines()
        return f"{type(error).__name__}: {text[-1] if text else ''}"[:2000]
    try:
        trace = Path(trial.error_file).read_text().strip().splitlines()
    except (OSError, TypeError):
        trace = []
    return trace[-1][:2000] if trace else "unknown error (see the trial's error.txt under tune/)"


class SweepRecorder(Callback):
    """Driver-side: keeps each trial's epoch history and writes its record the moment it ends."""

    def __init__(self, out_dir: str, context: dict[str, Any], mirror: Mirror | None = None):
        self.out_dir, self.context, self.mirror = out_dir, context, mirror
        self.history: dict[str, list[dict]] = {}
        self.last: dict[str, dict] = {}
        self.records: dict[str, dict] = {}

    def setup(self, **info: Any) -> None:
        # Also runs after Tuner.restore, which unpickles this callback: start from the records on disk.
        self.history, self.last = {}, {}
        self.records = read_records(Path(self.out_dir) / RECORDS_DIR)
        budget = self.context["study_time_budget_s"]
        self.deadline = time.time() + budget if budget else math.inf

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.last[trial.trial_id] = dict(result)
        if not result.get("replayed"):
            self.history.setdefault(trial.trial_id, []).append(history_row(result))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record(trial, STATUS_OK, "")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record(trial, STATUS_FAILED, _error_message(trial))

    def _record(self, trial: Any, status: str, error: str) -> None:
        last = self.last.pop(trial.trial_id, None) or {}
        if last.get("replayed") or (trial.trial_id in self.records and status == STATUS_FAILED
                                    and self.records[trial.trial_id]["status"] == STATUS_FAILED):
            return  # already recorded before an interruption
        settings = {**self.context["base_settings"], **trial.config}
        report = {k: v for k, v in last.items() if k not in _TUNE_BOOKKEEPING}
        record = {
            "trial_id": trial.trial_id,
            "status": status,
            "error": error,
            "stop_reason": stop_reason(status, report, settings, scheduler_stop=bool(last.get("done")),
                                       study_budget_over=time.time() >= self.deadline - 1.0),
            "config": dict(trial.config),
            "started_at": report.get("trial_started_at"),
            "finished_at": time.time(),
            "last_report": report,
            "history": self.history.pop(trial.trial_id, []),
        }
        out = Path(self.out_dir)
        write_record(out / RECORDS_DIR, record)
        self.records[trial.trial_id] = record
        write_tables(out, self.context, self.records)
        if self.mirror is not None:
            self.mirror.push()  # throttled; the run ends with a full push


_TUNE_BOOKKEEPING = {"done", "training_iteration", "trial_id", "date", "timestamp", "time_this_iter_s",
                     "time_total_s", "hostname", "node_ip", "time_since_restore", "iterations_since_restore",
                     "checkpoint_dir_name", "config", "should_checkpoint"}


# ---------------------------------------------------------------------------------------------------------------
# The run


def _prepare_data(study: Study) -> tuple[Path, TrialData]:
    from study.data import prepare

    dataset = study.dataset
    max_len = max(study.max_len_candidates())
    try:
        path = prepare(dataset["name"], source=dataset["source"], max_len=max_len, kcore=dataset["kcore"],
                       progress=True, **dataset["options"])
        return path, TrialData.from_prepared(path, max_len)
    except UserError as error:
        where = f"{study.source}: " if study.source else ""
        raise UserError(f"{where}dataset '{dataset['name']}': {error}") from None


def _quiet_ray_data() -> None:
    """Ray Data narrates every execution (one per epoch per trial); the sweep's own reports say enough."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled", as asked


def _training_table(path: Path) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(path / "sequences.parquet", columns=["train"])


def _training_dataset(table: Any) -> Any:
    """The training windows as a materialized Ray Dataset (materialized now, before trials hold every CPU).

    The driver reads the file and puts the table into the object store (``from_arrow``) rather than
    ``read_parquet``, whose read tasks may be scheduled on another node, where the driver's prepared-data folder
    does not exist; trials then fetch the blocks from the object store wherever they run.
    """
    import ray.data

    _quiet_ray_data()
    return ray.data.from_arrow(table).map_batches(keep_trainable, batch_format="numpy").materialize()


def _concurrency(study: Study) -> int:
    """Trials at once: as many as the connected cluster fits (a UserError up front if none does, e.g. no GPU)."""
    fits = check_fits(study.resources["cpu"], study.resources["gpu"], study.resources["workers_per_trial"])
    wanted = study.resources["max_concurrent"]
    return fits if wanted == "auto" else min(int(wanted), fits)


def _progress_reporter(study: Study) -> Any:
    """A status table with the searched keys and the objectives only (a trial reports ~50 metrics).

    Used by Tune's classic console output, which the command line selects (RAY_AIR_NEW_OUTPUT=0) because the
    newer one prints every metric of every finished trial.
    """
    from ray.tune import CLIReporter

    metrics = {"epoch": "epoch", **{tune_key(m): m for m in study.objectives}}
    if study.scheduler:
        metrics[tune_key(study.scheduler["metric"])] = study.scheduler["metric"]
    return CLIReporter(metric_columns=metrics, parameter_columns=list(study.search), max_report_frequency=30,
                       sort_by_metric=False)


def _row_context(study: Study, meta: dict[str, Any]) -> dict[str, Any]:
    defaults = models.model_class(study.model).config_class().to_dict()
    defaults.pop("num_items", None)
    return {"study": study.name, "model": study.model, "model_defaults": defaults,
            "dataset_meta": {k: meta.get(k) for k in ("name", "content_hash", "synthetic")},
            "base_settings": _base_settings(study), "study_time_budget_s": study.budget["time_budget_s"]}


def _base_settings(study: Study) -> dict[str, Any]:
    """The settings every trial shares; a trial uses as many threads as CPUs it holds (at least one)."""
    settings = study.settings()
    settings.setdefault("num_threads", max(1, math.floor(study.resources["cpu"])))
    return settings


def _check_resume(study: Study, out: Path, resume: bool) -> None:
    import yaml
    from ray.tune import Tuner

    tune_path = out / TUNE_DIR
    restorable = tune_path.exists() and Tuner.can_restore(str(tune_path))
    if resume:
        if not restorable:
            raise UserError(f"nothing to resume in {out}: no Ray Tune experiment state there; run without --resume")
        stored = yaml.safe_load((out / STUDY_FILE).read_text()) if (out / STUDY_FILE).exists() else {}
        current = study.to_dict()
        changed = sorted(k for k in set(stored) | set(current) if k != "storage" and stored.get(k) != current.get(k))
        if changed:
            raise UserError(f"{out / STUDY_FILE} differs from this study in: {', '.join(changed)}; --resume continues "
                            "the same study (start a new one under another name or storage)")
    elif restorable or (out / RECORDS_DIR).exists():
        raise UserError(f"{out} already holds study '{study.name}'; pass --resume to continue it, or choose another "
                        "name or storage to start a new one")
    elif (out / OPTUNA_FILE).exists():
        # left by a start that never got as far as a trial: reusing it would feed its stale trials to the sampler
        (out / OPTUNA_FILE).unlink()


def _write_environment(out: Path) -> None:
    import ray

    from study.environment import collect

    env = collect(ray.cluster_resources())
    path = out / ENVIRONMENT_FILE
    if path.exists():  # a resumed study keeps what the earlier sessions ran on
        try:
            previous = json.loads(path.read_text())
            env["previous_sessions"] = previous.pop("previous_sessions", []) + [previous]
        except (OSError, json.JSONDecodeError):
            pass
    atomic_write_text(path, json.dumps(json_safe(env), indent=2) + "\n")


def _close_orphans(storage_url: str, study_name: str) -> dict[str, int]:
    """Mark Optuna trials left RUNNING by an interrupted session as FAIL; map Tune trial ids to Optuna numbers."""
    import optuna
    from optuna.trial import TrialState

    study = optuna.load_study(study_name=study_name, storage=storage_url)
    numbers = {}
    for trial in study.get_trials(deepcopy=False):
        if trial.state == TrialState.RUNNING:
            study._storage.set_trial_user_attr(trial._trial_id, "note", "orphaned by an interrupted session")
            study.tell(trial.number, state=TrialState.FAIL)
        tune_id = trial.user_attrs.get("tune_trial_id")
        if tune_id:
            numbers[tune_id] = trial.number
    return numbers


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


def run_study(study: Study, *, resume: bool = False, dashboard: bool = False, address: str = "local",
              num_cpus: int | None = None, quiet: bool = False, points: list[dict[str, Any]] | None = None,
              storage: Path | None = None) -> dict[str, Any]:
    """Run (or resume) a study; returns the output paths and the trials table.

    ``points`` (with ``storage``, a folder of their own inside the study's folder) runs exactly these trial
    configs instead of searching: the same trainable, resources and recorder, but no Optuna, no ASHA and no study
    time budget, so every point trains its full budget. :mod:`study.replicate` reruns chosen configurations under
    new seeds this way.

    With ``study.storage_uri`` the study's folder is mirrored there (:mod:`study.storage`). With a ``ray://``
    address the Tune driver runs on the cluster's head node (see :func:`_run_on_head`), which needs such a URI.
    """
    out = Path(storage).resolve() if storage is not None else study.storage  # Tune wants an absolute path
    mirror = Mirror(study.storage, study.storage_uri)
    if mirror.uri and storage is None:
        if resume:
            fetched = mirror.pull()
            if fetched:
                print(f"fetched {fetched} file(s) of the study from {mirror.uri}", file=sys.stderr)
        elif mirror.holds(STUDY_FILE):
            raise UserError(f"{mirror.uri} already holds study '{study.name}'; pass --resume to continue it, or "
                            "choose another name or storage to start a new one")
    _check_resume(study, out, resume)
    path, base_data = _prepare_data(study)  # before Ray: a missing dataset fails fast, with the recipe's advice
    if is_client(address):
        if not mirror.uri:
            raise UserError(f"with --address {address} the study is driven from the cluster's head node, which "
                            f"cannot write to this machine's {study.storage}: set storage: to a URI both reach "
                            "(s3://bucket/prefix, gs://bucket/prefix, or file:///path on a shared file system)")
        return _run_on_head(study, mirror, out, base_data, _training_table(path), resume=resume,
                            dashboard=dashboard, address=address, quiet=quiet, points=points)
    started_ray = start_ray(address, dashboard=dashboard, num_cpus=num_cpus, quiet=quiet)
    try:
        fit = _drive(study, out, mirror, base_data, _training_table(path), resume=resume, quiet=quiet, points=points)
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    return _outcome(study, out, mirror, fit, points)


def _drive(study: Study, out: Path, mirror: Mirror, base_data: TrialData, train_table: Any, *, resume: bool,
           quiet: bool, points: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Runs the trials on the connected Ray and writes ``out`` (records, tables); returns the fit's timing."""
    from ray import tune
    from ray.tune.schedulers import FIFOScheduler
    from ray.tune.search import BasicVariantGenerator

    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        atomic_write_text(out / STUDY_FILE, f"# resolved from {study.source}\n" + study.to_yaml())
    concurrency = _concurrency(study)  # before anything is scheduled: a request no node can meet would hang
    _write_environment(out)
    mirror.push(force=True)  # the study is claimed in storage before its first trial
    train_ds = _training_dataset(train_table)
    storage_url = f"sqlite:///{out / OPTUNA_FILE}"
    plan = TrialPlan(model=study.model, base_settings=_base_settings(study),
                     threads=max(1, math.floor(study.resources["cpu"])),
                     measure_efficiency=bool(study.settings().get("measure_efficiency", True)),
                     records_dir=str(out / RECORDS_DIR), shuffle_rows=max(1, train_ds.count()),
                     recorded=read_records(out / RECORDS_DIR) if resume else None,
                     workers=study.resources["workers_per_trial"], cpu=study.resources["cpu"],
                     gpu=study.resources["gpu"])
    trainable = tune.with_parameters(sweep_trial, plan=plan, data=base_data, train_ds=train_ds)
    if plan.workers > 1:
        # The Tune trial only drives the TorchTrainer, whose workers reserve the CPUs/GPUs themselves; Tune
        # refuses an empty request, so the driver asks for one byte of memory (no CPU a worker would miss).
        trainable = tune.with_resources(trainable, tune.PlacementGroupFactory([{"CPU": 0, "memory": 1}]))
    else:
        trainable = tune.with_resources(trainable, {"cpu": study.resources["cpu"], "gpu": study.resources["gpu"]})
    # The study is read from its own records, never from Tune's ResultGrid, whose per-trial files may be missing
    # (a trial killed mid-write) or looked up under a study folder's earlier path; its warnings would only confuse
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    if resume:
        tuner = tune.Tuner.restore(str(out / TUNE_DIR), trainable=trainable, resume_unfinished=True,
                                   resume_errored=False, restart_errored=False)
        _relocate(tuner, out, mirror, storage_url)
    else:
        recorder = SweepRecorder(str(out), _row_context(study, base_data.meta), mirror)
        if points is None:
            search = dict(search_alg=make_searcher(study, storage_url), scheduler=make_scheduler(study),
                          num_samples=study.budget["num_samples"], max_concurrent_trials=concurrency,
                          time_budget_s=study.budget["time_budget_s"] or None)
        else:  # fixed points: as many at once as the sweep runs, each to its full budget (no ASHA, no time budget)
            search = dict(search_alg=BasicVariantGenerator(points_to_evaluate=points, max_concurrent=concurrency),
                          scheduler=FIFOScheduler(), num_samples=len(points))
        tuner = tune.Tuner(
            trainable,
            param_space=None if points is None else points_space(points),
            tune_config=tune.TuneConfig(**search, reuse_actors=True),
            run_config=tune.RunConfig(name=TUNE_DIR, storage_path=str(out), callbacks=[recorder],
                                      failure_config=tune.FailureConfig(max_failures=0),
                                      progress_reporter=_progress_reporter(study), verbose=0 if quiet else 1),
        )
    fit_started = time.time()
    try:
        tuner.fit()
    except BaseException:  # Ctrl-C or a crash: what finished goes to storage, for a --resume anywhere
        with contextlib.suppress(Exception):
            mirror.push(force=True)
        raise
    fit_wall = time.time() - fit_started
    numbers = _close_orphans(storage_url, study.name) if points is None else {}
    records = read_records(out / RECORDS_DIR)
    for trial_id, number in numbers.items():
        if trial_id in records:
            records[trial_id]["optuna_number"] = number
    write_tables(out, _row_context(study, base_data.meta), records)
    mirror.push(force=True)
    return {"fit_wall_s": fit_wall, "fit_started_at": fit_started, "meta": base_data.meta}


def _relocate(tuner: Any, out: Path, mirror: Mirror, storage_url: str) -> None:
    """Point the restored recorder and searcher at this session's study folder.

    ``Tuner.restore`` unpickles them with the paths of the session that started the study, which may have run in
    another folder or on another machine. Ray keeps the restored configs on its internal tuner (no public
    accessor), so a Ray that moved them fails here loudly rather than writing to the old paths.
    """
    internal = tuner._local_tuner
    recorders = [c for c in internal.get_run_config().callbacks or [] if isinstance(c, SweepRecorder)]
    searcher = internal._tune_config.search_alg
    if not recorders:
        raise RuntimeError("the restored Tune run has no SweepRecorder; cannot resume this study here")
    for recorder in recorders:
        recorder.out_dir, recorder.mirror = str(out), mirror
    if isinstance(searcher, StudySearch):  # fixed points (replicates) have no searcher to move
        searcher.relocate(storage_url)


def _outcome(study: Study, out: Path, mirror: Mirror, fit: dict[str, Any],
             points: list[dict[str, Any]] | None) -> dict[str, Any]:
    import pandas as pd

    paths = table_paths(out)
    paths.update(study=out / STUDY_FILE, environment=out / ENVIRONMENT_FILE)
    if points is None:
        paths["optuna"] = out / OPTUNA_FILE
    trials = pd.read_parquet(paths["trials"])
    text = summary(trials, study.objectives, list(study.search), paths)
    if mirror.uri:
        text += f"\nmirrored to {mirror.uri}"
    return {"paths": paths, "trials": trials, "fit_wall_s": fit["fit_wall_s"], "fit_started_at": fit["fit_started_at"],
            "summary": text, "storage_uri": mirror.uri}


def _run_on_head(study: Study, mirror: Mirror, out: Path, base_data: TrialData, train_table: Any, *, resume: bool,
                 dashboard: bool, address: str, quiet: bool, points: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Ray Client (``ray://``): drive the study from a task on the head node, then fetch its results here.

    Under Ray Client, Tune would run its loop on the head node anyway (callbacks, the Optuna searcher and its
    SQLite file included), where this machine's paths mean nothing. So the whole driver runs there, in a
    working copy of its own that it mirrors to the study's URI; this machine sends it the prepared data (the
    head needs neither the raw files nor internet access) and finally pulls the URI into its own working copy.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    relative = out.relative_to(study.storage).as_posix() if out != study.storage else ""
    started_ray = start_ray(address, dashboard=dashboard, quiet=quiet)
    try:
        # the head: long-lived, and usually kept free of trials; any node would do (soft), the URI holds the study
        head = next((node["NodeID"] for node in ray.nodes()
                     if node["Alive"] and "node:__internal_head__" in node["Resources"]), None)
        driver = ray.remote(num_cpus=0, max_retries=0)(_head_driver)
        if head is not None:
            driver = driver.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=True))
        running = driver.remote(study, mirror.uri, relative, base_data, train_table, resume=resume, quiet=quiet,
                                points=points)
        try:
            fit = ray.get(running)
        except KeyboardInterrupt:  # the driver runs on the head: stop it too, or it would go on without us
            ray.cancel(running, force=True)
            raise
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, UserError):  # e.g. a GPU asked of a cluster without one: an error line, exit 2
            raise UserError(str(error.cause)) from None
        raise
    finally:
        if started_ray:
            ray.shutdown()
    fetched = mirror.pull(overwrite=True)
    print(f"fetched {fetched} file(s) of the study from {mirror.uri} into {study.storage}", file=sys.stderr)
    return _outcome(study, out, mirror, fit, points)


def _head_driver(study: Study, uri: str, relative: str, base_data: TrialData, train_table: Any, *, resume: bool,
                 quiet: bool, points: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The study's driver inside a Ray task on the head node (see :func:`_run_on_head`)."""
    import dataclasses
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix=f"seqrec-study-{study.name}-"))
    try:
        mirror = Mirror(root, uri)
        if resume or relative:  # a replicate batch lives inside the study's folder, next to what it reads
            mirror.pull()
        here = dataclasses.replace(study, storage=root)
        return _drive(here, root / relative if relative else root, mirror, base_data, train_table, resume=resume,
                      quiet=quiet, points=points)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def build_rows(study: Study, meta: dict[str, Any], records: dict[str, dict]) -> list[dict[str, Any]]:
    """Rows of every record (used by tests and benchmarks to inspect a study without re-reading parquet)."""
    context = _row_context(study, meta)
    return [build_row(context, record) for record in records.values()]
