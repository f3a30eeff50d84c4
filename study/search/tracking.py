"""Experiment trackers as Tune callbacks: every trial's per-epoch reports also go to MLflow or Weights & Biases.

TensorBoard needs nothing here: Tune writes event files for every trial under ``results/<study>/tune/<trial>/``
(``tensorboard --logdir results/<study>/tune``). The study file's ``tracking:`` section (read and checked in
:mod:`study.spec.fields`, which refuses a tracker whose package is missing) chooses the others.
"""

from __future__ import annotations

from typing import Any

from study.spec.fields import Tracking


def tracking_callbacks(tracking: Tracking) -> list[Any]:
    """The Tune logger callbacks of the study's trackers (none when the section is empty)."""
    callbacks: list[Any] = []
    if tracking.mlflow is not None:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        callbacks.append(MLflowLoggerCallback(tracking_uri=tracking.mlflow.get("tracking_uri"),
                                              experiment_name=tracking.mlflow["experiment"], save_artifact=False))
    if tracking.wandb is not None:
        from ray.air.integrations.wandb import WandbLoggerCallback

        callbacks.append(WandbLoggerCallback(project=tracking.wandb["project"]))
    return callbacks
