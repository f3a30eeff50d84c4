"""W&B runs of a study's trials: Ray's ``WandbLoggerCallback`` with a logging actor that waits for W&B to write.

Imported only when a study's ``tracking:`` section names W&B: importing Ray's integration imports ``wandb``, which
takes seconds. :mod:`study.search.tracking` says how the section chooses its trackers.
"""

from __future__ import annotations

from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor


class _LoggingActorThatWaits(_WandbLoggingActor):
    """Ray's per-trial logging actor, whose ``run`` returns only once the trial's W&B run file is complete.

    ``wandb.finish`` only asks W&B's service process (which ``wandb.init`` started as a child of this actor) to close
    the run, and returns at once. Ray kills the actor, and its children with it, as soon as ``run`` returns: on a
    loaded machine the service died before it had written anything, and the offline run held its 7-byte header
    alone (seen in CI). ``wandb.teardown`` waits until the service has closed its runs and exited.
    """

    def run(self) -> None:
        super().run()
        self._wandb.teardown()


class WandbTrialRuns(WandbLoggerCallback):
    """One W&B run per trial, named by its Tune trial id (Ray's callback), complete when the trial ends."""

    _logger_actor_cls = _LoggingActorThatWaits
