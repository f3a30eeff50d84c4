"""Data-parallel trials (``resources.workers_per_trial > 1``): a Ray Train ``TorchTrainer`` under each Tune trial.

The trainer needs no DDP wrapper: every worker builds the same model from the same seed, and a global optimizer
pre-step hook averages all gradients across workers before each step, so the replicas stay equal.
``streaming_split(equal=True)`` gives each worker the same number of windows, hence the same number of steps (the
sweep refuses the ``last`` objective here, whose prefix expansion would break that). Every worker evaluates the
full validation set (identical results); rank 0's reports go to Tune.
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
        # metrics reach the study through Tune
        run_config=RunConfig(name=context.get_trial_id(), storage_path=os.path.join(tempfile.gettempdir(),
                                                                                     "seqrec-study-train"),
                             callbacks=[TuneReportCallback()]),
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

