"""What each Tune trial runs: one configuration, trained by :func:`study.train.trainer.run_trial`, reported each epoch.

A trial measures its efficiency figures once, before its first epoch (they depend on the configuration, not on the
trained weights), then trains on the windows the driver shared through the object store with the trainer's own
seeded shuffle, so a one-process trial sees exactly the batches ``python -m study.train`` sees for the same seed
and gives identical metrics (a data-parallel trial reads Ray Data shards instead), and reports every epoch: the
epoch's validation metrics, the best-validation ones so far, the test metrics of that best epoch, and the
efficiency figures (:class:`EpochReporter`). ASHA therefore prunes on validation every epoch, and a trial it stops
early still carries every objective to Optuna. :func:`tune_key` names the reported figure each objective reads.

:func:`sweep_trial` is the trainable of a one-process trial; a data-parallel trial
(``resources.workers_per_trial > 1``) runs :func:`study.search.data_parallel.data_parallel_trial`, built from the
same pieces.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

import models
from study.cluster import node_identity
from study.search.records import STATUS_OK, trains_on
from study.train.results import json_safe
from study.train.trainer import TrialData


def tune_key(objective: str) -> str:
    """The reported metric an objective reads: validation at the best epoch, efficiency as measured."""
    if objective.startswith("valid_"):
        return "best_" + objective
    if objective == "epoch_time_s":
        return "median_epoch_time_s"  # the per-epoch `epoch_time_s` stays in history
    return objective


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
    checkpoint_every: int = 0  # epochs between Tune checkpoints of the training state (0 = none)
    checkpoint_keep: int = 2  # checkpoints kept per trial (a data-parallel trial's Train run keeps its own)
    # where each trial keeps its best-validation model (<models_dir>/<trial_id>/), when the trials can write to the
    # study's folder (a local run); on a cluster the trial's last checkpoint holds them instead
    models_dir: str | None = None
    # the training windows come from Ray Data, read from the prepared Parquet every epoch (``dataset.stream``)
    stream: bool = False


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
    """Drop user windows with no (input, target) pair, as the in-memory shuffle does; keep each window's user.

    Windows are left-padded, so "some input and a target" is columns -2 and -1 being real items, whatever
    max_len a trial later crops to.
    """
    windows = as_windows(batch["train"])
    keep = (windows[:, -2] > 0) & (windows[:, -1] > 0)
    return {"user": np.asarray(batch["user"])[keep], "train": windows[keep]}


def ray_data_batches(iterable: Any, batch_size: int, seed: int, max_len: int,
                     shuffle_rows: int) -> Callable[[int], Iterable[tuple[np.ndarray, np.ndarray]]]:
    """``train_batches(epoch)`` for run_trial: shuffled (user windows, user ids) from a Ray Data shard iterator.

    Ids come as stored: a data-parallel trial's padding rows keep their negative ids, which
    :class:`study.search.data_parallel.ShardBatches` reads to leave them out.

    The local shuffle buffer holds the whole (small) training set, so each epoch is a full shuffle seeded by the
    trial seed and the epoch, done in the trial's process: no Ray tasks, so nothing competes for the CPUs trials
    hold.
    """
    def epoch_batches(epoch: int) -> Iterable[np.ndarray]:
        for batch in iterable.iter_batches(batch_size=batch_size, batch_format="numpy", prefetch_batches=1,
                                           local_shuffle_buffer_size=max(shuffle_rows, batch_size),
                                           local_shuffle_seed=seed * 1_000_003 + epoch):
            yield as_windows(batch["train"])[:, -(max_len + 1):], np.asarray(batch["user"], dtype=np.int64)

    return epoch_batches


def preflight(model_name: str, settings: dict[str, Any], data: TrialData, measure: bool) -> dict[str, Any]:
    """Figures known before training: parameters, peak memory, inference latency and energy, the popularity
    baseline, and how energy is measured on this trial's device (``energy_method``).

    Measured on the freshly built model: memory and latency depend on the configuration, not on the weights.
    """
    import torch

    from study.train import efficiency, energy
    from study.train.config import split_settings
    from study.train.metrics import popularity_metrics, sample_negatives
    from study.train.objectives import resolve_objective
    from study.train.results import kernel_path
    from study.train.trainer import NEGATIVE_SEED_OFFSETS, resolve_device, seed_everything, with_user_count

    train_cfg, hparams = split_settings(model_name, settings)
    hparams = with_user_count(model_name, {**hparams, "num_items": data.num_items,
                                           "max_len": hparams.get("max_len",
                                                                  models.model_class(model_name).config_class.max_len)},
                              data.meta)
    device = resolve_device(train_cfg.device)
    seed_everything(train_cfg.seed)
    model = models.build(model_name, **hparams).to(device)
    objective = resolve_objective(model, train_cfg.objective)
    counter = energy.open_counter(device)
    figures: dict[str, Any] = {"params": efficiency.count_parameters(model), "objective": objective,
                               "device": str(device), "kernel_path": kernel_path(device),
                               "energy_method": energy.method_of(counter)}
    if measure:
        figures.update(efficiency.efficiency_figures(model_name, hparams, train_cfg, data, model, device, counter))
    negatives = None
    if train_cfg.eval_mode == "sampled":  # the same test negatives run_trial draws
        popularity = data.item_popularity if train_cfg.negative_sampler == "popularity" else None
        negatives = sample_negatives(data.test, data.num_items, train_cfg.num_negatives, popularity,
                                     seed=train_cfg.seed + NEGATIVE_SEED_OFFSETS["test"])
    figures["pop_ndcg@10"] = popularity_metrics(data.test, data.item_popularity, negatives=negatives,
                                                mask_history=train_cfg.mask_history)["ndcg@10"]
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return figures


class EpochReporter:
    """Turns each :class:`~study.train.trainer.EpochReport` into one flat Tune report (history + objectives)."""

    def __init__(self, figures: dict[str, Any], batch_size: int, started: float,
                 report: Callable[..., None], checkpoint_every: int = 0, resumed: Any = None,
                 best_model_dir: str | None = None):
        self.figures, self.batch_size, self.started, self.report = figures, batch_size, started, report
        self.checkpoint_every, self.best_model_dir = checkpoint_every, best_model_dir
        # a trial resumed from a checkpoint (a TrainingState) keeps the medians of its earlier epochs
        self.epoch_times: list[float] = list(resumed.epoch_times) if resumed else []
        self.throughputs: list[float] = [t for t in resumed.throughputs if math.isfinite(t)] if resumed else []
        self.train_energies: list[float] = list(resumed.train_energies) if resumed else []
        # and the wall time its kept epochs took, so that the row's wall time is the whole trial's, not this run's
        self.earlier_s = resumed.elapsed_s if resumed else 0.0
        self.node = node_identity()

    def __call__(self, epoch_report: Any) -> None:
        from study.train.energy import median_j
        from study.train.results import kernel_path

        self.epoch_times.append(epoch_report.epoch_time_s)
        self.train_energies.append(epoch_report.train_energy_j)
        if math.isfinite(epoch_report.throughput):
            self.throughputs.append(epoch_report.throughput)
        throughput = statistics.median(self.throughputs) if self.throughputs else float("nan")
        metrics = {
            **epoch_report.flat(),
            **self.figures,
            "kernel_path": kernel_path(_device(self.figures)),  # known only once the model has run
            "median_epoch_time_s": statistics.median(self.epoch_times),
            "train_energy_j_per_epoch": median_j(self.train_energies),  # the epoch's own is train_energy_j
            "train_throughput": throughput,
            # one optimizer step = batch_size sequences (the last batch of an epoch may be smaller)
            "step_time_ms": 1000.0 * self.batch_size / throughput if throughput > 0 else float("nan"),
            # the best epoch's model statistics, as the best_valid_* metrics: the trial's row reads the last report
            "extra_json": json.dumps(json_safe(epoch_report.best_extra)),
            "trial_started_at": self.started,
            "process_started_at": _process_started_at(),
            "trial_compute_s": self.earlier_s + time.time() - self.started,
            "pid": os.getpid(),
            # where the trial ran (Tune's own `node_ip` is bookkeeping, dropped from records)
            "trial_node_id": self.node["node_id"],
            "trial_node_ip": self.node["node_ip"],
        }
        if self.best_model_dir and epoch_report.snapshot and epoch_report.best_epoch == epoch_report.epoch:
            # before the report: a scheduler may stop the trial at any report, and the best model must be there
            from study.train.state import save_best_model

            save_best_model(epoch_report.snapshot(), self.best_model_dir)
        if self.checkpoint_every and epoch_report.snapshot and epoch_report.epoch % self.checkpoint_every == 0:
            self.report_with_checkpoint(metrics, epoch_report.snapshot())
        else:
            self.report(metrics)

    def report_with_checkpoint(self, metrics: dict[str, Any], state: Any) -> None:
        """Report with the training state as a Tune checkpoint, which Tune copies to the study's storage."""
        from ray import tune

        from study.train.state import save_state

        with tempfile.TemporaryDirectory(prefix="seqrec-checkpoint-") as folder:
            save_state(state, folder)
            self.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


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


def trial_settings(plan: TrialPlan, config: dict[str, Any]) -> dict[str, Any]:
    settings = {**plan.base_settings, **config}
    settings.setdefault("num_threads", plan.threads)
    # Efficiency is measured once before the first epoch (see preflight), not again at the end.
    settings["measure_efficiency"] = False
    return settings


class TrialFailed(RuntimeError):
    """A trial that failed before (its record says so); raised again on resume so it stays failed."""


def replay_recorded(plan: TrialPlan) -> bool:
    """Replay a trial the driver recorded before a crash that Tune's own state missed; True when replayed.

    Retraining it would waste its compute and could give another result than the one already in its record. A
    failure is replayed (raised again) unless the trial's process was lost, as when the study itself was stopped:
    that trial trains again (False), as does one the study's time budget stopped (its record is a result so far).
    """
    from ray import tune

    record = (plan.recorded or {}).get(tune.get_context().get_trial_id())
    if record is None or trains_on(record):
        return False
    if record["status"] != STATUS_OK:
        raise TrialFailed(record.get("error") or "failed before the study was interrupted")
    tune.report({**record["last_report"], "replayed": True})
    return True


def sweep_trial(config: dict[str, Any], *, plan: TrialPlan, data: TrialData, train_ds: Any = None) -> None:
    """The Tune function trainable of a one-process trial: one configuration, reported every epoch.

    It trains with the trainer's in-memory shuffle of ``data.train``: the same seed gives the same batches, hence the
    same metrics, as ``python -m study.train``. A streaming study's trial (``plan.stream``) instead draws its batches
    from ``train_ds`` through a local shuffle buffer: seeded, but not study.train's order. Every
    ``plan.checkpoint_every`` epochs its report carries the training state as a Tune checkpoint; a retried or resumed
    trial starts from the last one and ends as it would have without the interruption.
    """
    from ray import tune

    started = time.time()
    quiet_exit_in_callbacks()
    # Ray announces every checkpoint it persists; the sweep's console would get a line per trial and epoch
    logging.getLogger("ray.train._internal.storage").setLevel(logging.WARNING)
    if replay_recorded(plan):
        return

    import torch

    from study.train.config import split_settings
    from study.train.trainer import run_trial

    settings = trial_settings(plan, config)
    train_cfg, hparams = split_settings(plan.model, settings)
    torch.set_num_threads(train_cfg.num_threads)
    max_len = hparams.get("max_len", models.model_class(plan.model).config_class.max_len)
    trial_data = data.cropped(max_len)
    figures = preflight(plan.model, settings, trial_data, plan.measure_efficiency)
    resume_from = last_training_state()
    best_model_dir = os.path.join(plan.models_dir, tune.get_context().get_trial_id()) if plan.models_dir else None
    reporter = EpochReporter(figures, train_cfg.batch_size, started, tune.report,
                             checkpoint_every=plan.checkpoint_every, resumed=resume_from,
                             best_model_dir=best_model_dir)
    # a streaming trial reads its windows from Ray Data each epoch (``trial_data.train`` is then a probe sample);
    # otherwise it shuffles the windows it holds, as study.train does
    train_batches = None
    if plan.stream:
        quiet_ray_data()
        train_batches = ray_data_batches(train_ds, train_cfg.batch_size, train_cfg.seed, max_len, plan.shuffle_rows)
    run_trial(plan.model, trial_data, settings, callback=reporter, resume_from=resume_from,
              train_batches=train_batches)


def quiet_exit_in_callbacks() -> None:
    """Keep a trial process's stop off the sweep's console.

    Ray's workers answer SIGTERM (Ray shutting down, a trial being stopped) by raising SystemExit wherever the
    process stands. Inside a weakref or finalizer callback Python cannot raise it: it prints "Exception ignored in
    ... SystemExit: 1" with a traceback, which Ray forwards to the driver, and a clean sweep's console then ends with
    what reads as a crash. Only that case is silenced: the exit was already dropped (as it was before), a SystemExit
    raised anywhere else still stops the process, and every other unraisable exception is printed as Python prints
    it. Installing it twice (a reused worker) keeps one hook.
    """
    previous = sys.unraisablehook
    if getattr(previous, "quiet_exit", False):
        return

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, SystemExit):
            previous(unraisable)

    hook.quiet_exit = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def last_training_state() -> Any:
    """The training state of this trial's last Tune checkpoint (a retry or a --resume), or None on a first start."""
    from ray import tune

    from study.train.state import load_state

    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        return load_state(folder)


def quiet_ray_data() -> None:
    """Ray Data narrates every execution (one per epoch per trial); the sweep's own reports say enough."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled", as asked
