"""Data-parallel trials (``resources.workers_per_trial > 1``): a Ray Train ``TorchTrainer`` under each Tune trial.

The trainer needs no DDP wrapper: every worker builds the same model from the same seed, and a global optimizer
pre-step hook averages all gradients across workers before each step, so the replicas stay equal.
``streaming_split(equal=True)`` gives each worker the same number of windows, hence the same number of steps (the
sweep refuses the ``last`` objective here, whose prefix expansion would break that). Every worker evaluates the
full validation set (identical results); rank 0's reports go to Tune.

Checkpoints (``checkpoint.every``) work as in a one-process trial, through Ray Train: rank 0 reports the
:class:`~study.train.state.TrainingState` as a Train checkpoint, kept in the Tune trial's own folder of the study, and
a retried or ``--resume``-d trial starts a Train run of the same name there, which Train restores from its last
checkpoint (every worker then resumes from it).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any

import models
from study.search.trial import (
    EpochReporter,
    TrialPlan,
    crop_trial_data,
    preflight,
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
    if replay_recorded(plan):
        return
    context = get_context()
    trainer = TorchTrainer(
        data_parallel_worker,
        train_loop_config={"config": config, "plan": plan, "data": data, "started": started},
        scaling_config=ScalingConfig(num_workers=plan.workers, use_gpu=plan.gpu > 0,
                                     resources_per_worker={"CPU": plan.cpu, **({"GPU": plan.gpu} if plan.gpu else {})}),
        datasets={"train": train_ds},
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
    quiet_ray_data()
    logging.getLogger("ray.train").setLevel(logging.WARNING)  # Train logs every report of every worker
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    settings = trial_settings(plan, config)
    train_cfg, hparams = split_settings(plan.model, settings)
    torch.set_num_threads(train_cfg.num_threads)
    max_len = hparams.get("max_len", models.model_class(plan.model).config_class.max_len)
    trial_data = crop_trial_data(data, max_len)
    # Only rank 0 measures: the figures describe one replica, and the memory probe must not join the all-reduce.
    figures = preflight(plan.model, settings, trial_data, plan.measure_efficiency and rank == 0)
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
    batches = ray_data_batches(shard, train_cfg.batch_size, train_cfg.seed, max_len, plan.shuffle_rows // world + 1)
    handle = register_optimizer_step_pre_hook(average_gradients)
    try:
        run_trial(plan.model, trial_data, settings, callback=reporter, train_batches=batches, resume_from=resume_from)
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

