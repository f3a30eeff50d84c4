"""Experiment trackers as Tune callbacks: every trial's per-epoch reports also go to MLflow or Weights & Biases.

TensorBoard needs nothing here: Tune writes event files for every trial under ``results/<study>/tune/<trial>/``
(``tensorboard --logdir results/<study>/tune``). The study file's ``tracking:`` section (read and checked in
:mod:`study.spec.fields`, which refuses a tracker whose package is missing) chooses the others.

MLflow goes through :class:`MLflowTrialRuns` rather than Ray's ``MLflowLoggerCallback``, which a study cannot use
as it is: importing it imports mlflow (seconds, on every sweep, tracked or not), it logs every figure under Tune's
name although MLflow refuses ``@`` in a name (``valid_ndcg@10``), it counts steps in Tune iterations rather than
epochs, and a ``--resume`` or a retried trial would open a second run for the same trial.
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any

from ray.tune.logger import LoggerCallback

from study.spec.fields import Tracking

# MLflow's rule for metric and parameter names (mlflow.utils.validation; its portable form, without ":")
_MLFLOW_REFUSED = re.compile(r"[^/\w.\- ]")
TRIAL_ID_TAG = "tune_trial_id"  # finds a trial's run again in a later session of the study
# Tune's bookkeeping in every result, not figures of the trial (the config goes to the run's parameters)
_NOT_METRICS = frozenset({"config", "done", "training_iteration", "timestamp", "time_since_restore",
                          "iterations_since_restore", "should_checkpoint", "replayed"})


def mlflow_name(key: str) -> str:
    """``key`` as a name MLflow accepts: ``@`` reads ``_at_`` (``valid_ndcg@10`` → ``valid_ndcg_at_10``)."""
    return _MLFLOW_REFUSED.sub("_", key.replace("@", "_at_"))


def tracking_callbacks(tracking: Tracking, shared_params: dict[str, Any] | None = None) -> list[Any]:
    """The Tune logger callbacks of the study's trackers (none when the section is empty).

    ``shared_params``: the settings every trial shares, logged with each trial's own config as its MLflow
    parameters, so that a run shows the whole configuration it trained.
    """
    callbacks: list[Any] = []
    if tracking.mlflow is not None:
        callbacks.append(MLflowTrialRuns(tracking.mlflow.get("tracking_uri"), tracking.mlflow["experiment"],
                                         shared_params))
    if tracking.wandb is not None:
        from study.search.wandb_runs import WandbTrialRuns

        # wandb.init runs in one logging actor per trial, which may not see this shell's variables: the mode and
        # folder a user chose here (WANDB_MODE=offline logs without an account, `wandb sync` uploads later) go with it
        chosen = {key: os.environ[name] for key, name in (("mode", "WANDB_MODE"), ("dir", "WANDB_DIR"))
                  if os.environ.get(name)}
        callbacks.append(WandbTrialRuns(project=tracking.wandb["project"], **chosen))
    return callbacks


class MLflowTrialRuns(LoggerCallback):
    """One MLflow run per trial: the trial's configuration as parameters, every numeric figure of each report as a
    metric whose step is the report's epoch, the run's status when the trial ends."""

    def __init__(self, tracking_uri: str | None, experiment: str, shared_params: dict[str, Any] | None = None):
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self.shared_params = dict(shared_params or {})
        self._client: Any = None
        self._experiment_id: str | None = None
        self._runs: dict[str, str] = {}  # Tune trial id -> MLflow run id

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks with the experiment (for --resume): the client and run ids are this session's
        return {**self.__dict__, "_client": None, "_experiment_id": None, "_runs": {}}

    def setup(self, *args: Any, **kwargs: Any) -> None:
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        found = self._client.get_experiment_by_name(self.experiment)
        self._experiment_id = found.experiment_id if found else self._client.create_experiment(self.experiment)

    def log_trial_start(self, trial: Any) -> None:
        run_id = self._run_of(trial)
        from mlflow.entities import Param

        params = {**self.shared_params, **_flat(trial.config)}
        self._client.log_batch(run_id, params=[Param(mlflow_name(key), str(value)) for key, value in params.items()])

    def log_trial_result(self, iteration: int, trial: Any, result: dict[str, Any]) -> None:
        if result.get("replayed"):  # finished in an earlier session, whose reports this run already holds
            return
        from mlflow.entities import Metric

        step = int(result.get("epoch") or result["training_iteration"])
        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_name(key), value, now, step) for key, value in _numbers(result).items()
                   if key not in _NOT_METRICS]
        self._client.log_batch(self._run_of(trial), metrics=metrics)

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        self._client.set_terminated(self._run_of(trial), status="FAILED" if failed else "FINISHED")

    def _run_of(self, trial: Any) -> str:
        """The trial's run: the one this or an earlier session opened for it, or a new one."""
        if trial.trial_id not in self._runs:
            earlier = self._client.search_runs([self._experiment_id], max_results=1,
                                               filter_string=f"tags.{TRIAL_ID_TAG} = '{trial.trial_id}'")
            if earlier:
                run_id = earlier[0].info.run_id
                self._client.update_run(run_id, status="RUNNING")
            else:
                run_id = self._client.create_run(self._experiment_id, run_name=str(trial),
                                                 tags={TRIAL_ID_TAG: trial.trial_id}).info.run_id
            self._runs[trial.trial_id] = run_id
        return self._runs[trial.trial_id]


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``outer/inner`` keys (a searched block of settings, say), as MLflow's flat names want."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _numbers(result: dict[str, Any]) -> dict[str, float]:
    """The result's figures MLflow can hold: finite numbers (not flags, strings, or the nested config)."""
    return {key: float(value) for key, value in result.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}
