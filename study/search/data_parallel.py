"""Data-parallel trials (``resources.workers_per_trial > 1``): a Ray Train ``TorchTrainer`` under each Tune trial.

The trainer needs no DDP wrapper: every worker builds the same model from the same seed, and a global optimizer
pre-step hook averages all gradients across workers before each step, so the replicas stay equal. Every worker
evaluates the full validation set (identical results); rank 0's reports go to Tune.

Each epoch the workers' shards are disjoint and together hold every training window exactly once. Train splits
the dataset with ``streaming_split(equal=True)``, which drops the rows left over when their count is not a
multiple of the workers, so the trial first appends that many padding rows (:func:`pad_for_equal_shards`). Every
worker then holds the same number of rows, hence takes the same number of steps (the all-reduce pairs step k of
every worker). A padding row never trains: it is dropped from its batch, and a batch of padding only still takes
its step but with weight 0. Gradients are averaged weighted by the real windows behind them, so every window
weighs the same whichever shard (and batch size) it lands in (the sweep refuses the ``last`` objective here,
whose prefixes come from whole histories, not from a worker's shard).

Checkpoints (``checkpoint.every``) work as in a one-process trial, through Ray Train: rank 0 reports the
:class:`~study.train.state.TrainingState` as a Train checkpoint, kept in the Tune trial's own folder of the study, and
a retried or ``--resume``-d trial starts a Train run of the same name there, which Train restores from its last
checkpoint (every worker then resumes from it).
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

import models
from study.search.trial import (
    EpochReporter,
    TrialPlan,
    preflight,
    quiet_exit_in_callbacks,
    quiet_ray_data,
    ray_data_batches,
    replay_recorded,
    trial_settings,
)
from study.train.trainer import TrialData


def data_parallel_trial(config: dict[str, Any], *, plan: TrialPlan, data: TrialData, train_ds: Any) -> None:
    """The Tune function trainable of a data-parallel trial: ``plan.workers`` Ray Train workers, each on its shard."""
    from ray.train import DataConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune import get_context
    from ray.tune.integration.ray_train import TuneReportCallback

    started = time.time()
    quiet_exit_in_callbacks()
    if replay_recorded(plan):
        return
    context = get_context()
    trainer = TorchTrainer(
        data_parallel_worker,
        train_loop_config={"config": config, "plan": plan, "data": data, "started": started},
        scaling_config=ScalingConfig(num_workers=plan.workers, use_gpu=plan.gpu > 0,
                                     resources_per_worker={"CPU": plan.cpu, **({"GPU": plan.gpu} if plan.gpu else {})}),
        datasets={"train": pad_for_equal_shards(train_ds, plan.workers)},
        dataset_config=DataConfig(datasets_to_split=["train"]),
        # Train's own run state stays on the trial's node (the study's folder may be on another machine): the
        # metrics reach the study through Tune; a checkpointing study keeps the run with the trial (with_checkpoints)
        run_config=with_checkpoints(RunConfig(name=context.get_trial_id(),
                                              storage_path=os.path.join(tempfile.gettempdir(), "seqrec-study-train"),
                                              callbacks=[TuneReportCallback()]), plan),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error


def data_parallel_worker(loop_config: dict[str, Any]) -> None:
    """One Ray Train worker: trains the trial's replica on its shard, averaging gradients before every step."""
    import ray.train
    import torch
    import torch.distributed as dist
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from study.train.config import split_settings
    from study.train.trainer import run_trial

    config, plan, data, started = (loop_config[k] for k in ("config", "plan", "data", "started"))
    quiet_exit_in_callbacks()
    quiet_ray_data()
    logging.getLogger("ray.train").setLevel(logging.WARNING)  # Train logs every report of every worker
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    settings = trial_settings(plan, config)
    train_cfg, hparams = split_settings(plan.model, settings)
    torch.set_num_threads(train_cfg.num_threads)
    max_len = hparams.get("max_len", models.model_class(plan.model).config_class.max_len)
    trial_data = data.cropped(max_len)
    # Only rank 0 measures: the figures describe one replica, and the memory probe must not join the all-reduce.
    figures = preflight(plan.model, settings, trial_data, plan.measure_efficiency and rank == 0)
    figures["workers"] = world

    def report(metrics: dict[str, Any], checkpoint: Any = None) -> None:
        # every rank reports (Train requires it); the Tune callback forwards rank 0's, and rank 0's checkpoint is kept
        ray.train.report(metrics, checkpoint=as_train_checkpoint(checkpoint) if rank == 0 else None)

    resume_from = last_train_state()
    # the Train run is named after the Tune trial: rank 0 keeps the best model where a one-process trial does
    best_model_dir = os.path.join(plan.models_dir, context.get_experiment_name()) if plan.models_dir else None
    reporter = EpochReporter(figures, train_cfg.batch_size, started, report, resumed=resume_from,
                             checkpoint_every=plan.checkpoint_every if rank == 0 else 0,
                             best_model_dir=best_model_dir if rank == 0 else None)
    shard = ray.train.get_dataset_shard("train")
    batches = ShardBatches(ray_data_batches(shard, train_cfg.batch_size, train_cfg.seed, max_len,
                                            plan.shuffle_rows // world + 1), on_epoch_end=shard_logger(rank))
    handle = register_optimizer_step_pre_hook(weighted_gradient_average(batches, dist.all_reduce, world))
    try:
        # no training energy: a worker's device holds one replica of several (their sum would need every worker's
        # counter, and CPU workers on one machine read the same package twice); inference energy is one replica's
        run_trial(plan.model, trial_data, settings, callback=reporter, train_batches=batches, resume_from=resume_from,
                  measure_energy=False)
    finally:
        handle.remove()


def with_checkpoints(run_config: Any, plan: TrialPlan) -> Any:
    """The trial's Train RunConfig, checkpointing as the study says (unchanged when it does not checkpoint).

    The run is kept in the Tune trial's folder, where Tune keeps a one-process trial's checkpoints (the study's
    storage), rather than on the node's temporary disk: a restarted trial, maybe on another node, finds it there.
    """
    import dataclasses

    from ray.train import CheckpointConfig

    if not plan.checkpoint_every:
        return run_config
    settings: dict[str, Any] = {"checkpoint_config": CheckpointConfig(num_to_keep=plan.checkpoint_keep)}
    storage = _tune_trial_storage()
    if storage is not None:
        settings.update(storage_path=storage[0], storage_filesystem=storage[1])
    return dataclasses.replace(run_config, **settings)


def _tune_trial_storage() -> tuple[str, Any] | None:
    """(path, filesystem) of the Tune trial's folder in the study's storage, or None where Tune does not say.

    Tune's public context gives only the trial's working directory, which is per Ray session; its storage context
    knows the folder that outlives the session.
    """
    try:
        from ray.train._internal.session import get_session

        storage = get_session().storage
        return storage.trial_fs_path, storage.storage_filesystem
    except (ImportError, AttributeError, RuntimeError):
        return None


def as_train_checkpoint(checkpoint: Any) -> Any:
    """The EpochReporter's (Tune) checkpoint as the Ray Train one ``ray.train.report`` takes; None stays None."""
    import ray.train

    return None if checkpoint is None else ray.train.Checkpoint.from_directory(checkpoint.path)


def last_train_state() -> Any:
    """The training state of the Train run's last checkpoint (a restored run), or None on a first start."""
    import ray.train

    from study.train.state import load_state

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        return load_state(folder)


# $SEQREC_SHARD_LOG: a folder where every worker of a data-parallel trial writes, each epoch, the ids of the windows
# it trained on (tests assert the shards with it, benchmarks time the first batch); unset, nothing is written.
SHARD_LOG_ENV = "SEQREC_SHARD_LOG"


def padding_owner(users: np.ndarray) -> np.ndarray:
    """A padding row's user id is ``-1 - u``, u being the user whose window it copies: negative, so it is never
    taken for a real window, and reversible, so a step that holds padding only still runs on a valid window."""
    return -1 - users


def pad_for_equal_shards(train_ds: Any, workers: int) -> Any:
    """``train_ds`` plus ``(-rows) % workers`` padding rows, so that Train's equal split drops no real window.

    The padding copies the first window (with :func:`padding_owner`'s id) into a small table that the trial puts in
    the object store beside the materialized windows: no pass over the windows, so no Ray Data task has to wait for
    the CPUs the trial's workers are about to hold.
    """
    import pyarrow as pa
    import ray.data

    missing = -train_ds.count() % workers
    if missing == 0:
        return train_ds
    first = train_ds.take_batch(1, batch_format="pyarrow")
    padding = pa.concat_tables([first] * missing)
    owners = padding_owner(padding.column("user").to_numpy())
    padding = padding.set_column(padding.schema.get_field_index("user"), "user",
                                 pa.array(owners, type=first.schema.field("user").type))
    return train_ds.union(ray.data.from_arrow(padding))


class ShardBatches:
    """``train_batches(epoch)`` for run_trial over one worker's shard, padding rows left out.

    ``weight`` is the number of real windows in the batch last handed out: the step that trains on it averages its
    gradient with that weight. A batch of padding only is handed out as its first row, with weight 0 (the step must
    still happen, since every worker's step k meets the others' in one all-reduce).
    """

    def __init__(self, batches: Callable[[int], Iterable[tuple[np.ndarray, np.ndarray]]],
                 on_epoch_end: Callable[[int, np.ndarray, int, float], None] | None = None) -> None:
        self.batches, self.on_epoch_end = batches, on_epoch_end
        self.weight = 0

    def __call__(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        trained: list[np.ndarray] = []
        steps, first_batch_at = 0, math.nan
        for windows, users in self.batches(epoch):
            real = users >= 0
            self.weight = int(real.sum())
            if self.weight == 0:
                windows, users = windows[:1], padding_owner(users[:1])
            elif self.weight < len(users):
                windows, users = windows[real], users[real]
            if self.weight:
                trained.append(users)
            if not steps:
                first_batch_at = time.time()
            steps += 1
            yield windows, users
        if self.on_epoch_end is not None:
            self.on_epoch_end(epoch, np.concatenate(trained) if trained else np.empty(0, np.int64), steps,
                              first_batch_at)


def pack_gradients(params: list[Any], weight: float, step: int) -> Any:
    """What a worker all-reduces: ``weight`` x its gradients (a missing one as zeros), then ``weight`` and ``step``."""
    import torch

    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    flat = torch.cat(grads) * weight
    return torch.cat([flat, flat.new_tensor([weight, step])])


def unpack_average(params: list[Any], summed: Any, step: int, world: int) -> None:
    """Set every gradient to the weighted average of the workers' (``summed``: the all-reduced packs).

    Each worker's gradient is the mean over its batch's real windows, so dividing the weighted sum by the total
    weight gives the mean over all the step's windows, whichever worker held them. The step counts must agree:
    a worker one step ahead would average with another's next batch, so the trial fails instead.
    """
    total, steps = summed[-2].item(), summed[-1].item()
    if steps != step * world:
        raise RuntimeError(f"data-parallel workers out of step: this one is at step {step}, the {world} workers' "
                           f"steps sum to {steps:g}")
    if total <= 0:
        raise RuntimeError(f"step {step}: no worker's batch held a real window")
    average = summed[:-2] / total
    offset = 0
    for p in params:
        p.grad = average[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def weighted_gradient_average(batches: ShardBatches, all_reduce: Callable[[Any], Any],
                              world: int) -> Callable[[Any, Any, Any], None]:
    """The optimizer pre-step hook: one all-reduce of :func:`pack_gradients`, then :func:`unpack_average`."""
    taken = 0

    def average(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal taken
        taken += 1
        params = [p for group in optimizer.param_groups for p in group["params"]]
        packed = pack_gradients(params, float(batches.weight), taken)
        all_reduce(packed)
        unpack_average(params, packed, taken, world)

    return average


def shard_logger(rank: int) -> Callable[[int, np.ndarray, int, float], None] | None:
    """Where ``$SEQREC_SHARD_LOG`` is set, the writer of ``<log>/<trial id>/epoch-<e>-rank-<r>.npz`` (window ids,
    step count, the time of the epoch's first batch); None otherwise."""
    folder = os.environ.get(SHARD_LOG_ENV)
    if not folder:
        return None
    import ray.train

    # the TorchTrainer's run is named after the Tune trial (see data_parallel_trial)
    where = os.path.join(folder, ray.train.get_context().get_experiment_name())
    os.makedirs(where, exist_ok=True)

    def write(epoch: int, windows: np.ndarray, steps: int, first_batch_at: float) -> None:
        np.savez(os.path.join(where, f"epoch-{epoch}-rank-{rank}.npz"), windows=windows, steps=steps,
                 first_batch_at=first_batch_at)

    return write
