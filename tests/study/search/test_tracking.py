"""Experiment trackers fed by a real sweep: an MLflow file store read back with MLflow's own client, and W&B's
offline runs."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

EPOCHS = 2


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False,
             runtime_env={"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory, ray_session, write_tiny_sweep) -> Path:
    """One sweep of two trials, two epochs each, logged to an MLflow file store and to W&B offline at once: each
    tracker is its own Tune callback, so one sweep feeds both. Returns the folder that holds the study (``out``),
    the MLflow store (``mlruns``) and W&B's runs (``wandb-runs``)."""
    from study.search.runner import run_study
    from study.spec.study_file import load_study

    root = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEQREC_DATA", str(root / "cache"))  # never the user's cache
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses new file stores unless told (docs)
        # W&B without an account: offline runs under WANDB_DIR (`wandb sync` uploads them)
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_DIR", str(root / "wandb-runs"))
        patch.setenv("WANDB_SILENT", "true")
        path = write_tiny_sweep(root / "study.yaml", name="tracked", storage=root / "out", samples=2, max_concurrent=1)
        trackers = f"{{mlflow: {{tracking_uri: 'file:{root / 'mlruns'}', experiment: tracked-x}}, " \
                   "wandb: {project: wandb-tracked}}"
        run_study(load_study(path, [f"budget.max_epochs={EPOCHS}", "scheduler=none", "fixed.measure_efficiency=true",
                                    f"tracking={trackers}"]), quiet=True)
    return root


@pytest.mark.slow
def test_an_mlflow_file_store_holds_one_run_per_trial_with_its_epochs(tracked: Path) -> None:
    from mlflow.tracking import MlflowClient

    from study.search.tracking import TRIAL_ID_TAG

    out = tracked / "out"
    trials = pd.read_parquet(out / "trials.parquet").set_index("trial_id")
    assert (trials["status"] == "ok").all() and len(trials) == 2
    history = pd.read_parquet(out / "history.parquet")

    client = MlflowClient(tracking_uri=f"file:{tracked / 'mlruns'}")
    experiment = client.get_experiment_by_name("tracked-x")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.data.tags[TRIAL_ID_TAG] for run in runs) == sorted(trials.index)  # one run per trial
    for run in runs:
        trial = trials.loc[run.data.tags[TRIAL_ID_TAG]]
        assert run.info.status == "FINISHED"
        # the searched config, and the settings every trial shares
        assert float(run.data.params["lr"]) == pytest.approx(trial["config.lr"])
        assert run.data.params["hidden_size"] == "16" and run.data.params["max_epochs"] == str(EPOCHS)
        # per-epoch validation metrics, under names MLflow accepts, one value per epoch
        logged = {point.step: point.value for point in client.get_metric_history(run.info.run_id, "valid_ndcg_at_10")}
        assert len(client.get_metric_history(run.info.run_id, "valid_ndcg_at_10")) == EPOCHS
        epochs = history[history["trial_id"] == trial.name].set_index("epoch")["valid_ndcg@10"]
        assert logged == pytest.approx(epochs.to_dict()) and sorted(logged) == list(range(1, EPOCHS + 1))
        # the efficiency figures measured before the first epoch
        assert run.data.metrics["params"] == trial["params"]
        assert run.data.metrics["peak_mem_mb"] == pytest.approx(trial["peak_mem_mb"])
        assert "infer_ms_p50" in run.data.metrics and "median_epoch_time_s" in run.data.metrics


class FakeTrial:
    """What the callback reads of a Tune trial."""

    def __init__(self, trial_id: str, config: dict):
        self.trial_id, self.config = trial_id, config

    def __str__(self) -> str:
        return f"trainable_{self.trial_id}"


def test_a_resumed_session_logs_into_the_run_its_trial_already_has(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune restores its callbacks by unpickling them; a resumed or retried trial must not open a second run."""
    import pickle

    from mlflow.tracking import MlflowClient

    from study.search.tracking import MLflowTrialRuns

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    trial = FakeTrial("abc_00000", {"lr": 0.01, "block": {"depth": 2}})
    first = MLflowTrialRuns(uri, "resumed", {"hidden_size": 16})
    restored = pickle.loads(pickle.dumps(first))  # as Tune keeps it for --resume, before the first session runs
    first.setup()
    first.log_trial_start(trial)
    first.log_trial_result(1, trial, {"epoch": 1, "valid_ndcg@10": 0.1, "training_iteration": 1, "done": False,
                                      "kernel_path": "eager", "config": trial.config, "throughput": float("nan")})
    # the session is killed here: the run never ends
    restored.setup()
    restored.log_trial_start(trial)
    restored.log_trial_result(3, trial, {"epoch": 2, "valid_ndcg@10": 0.2, "training_iteration": 2})
    restored.log_trial_result(4, trial, {"epoch": 2, "valid_ndcg@10": 0.2, "replayed": True})
    restored.log_trial_end(trial)

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("resumed").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "trainable_abc_00000"
    assert run.data.params == {"hidden_size": "16", "lr": "0.01", "block/depth": "2"}
    assert [(p.step, p.value) for p in client.get_metric_history(run.info.run_id, "valid_ndcg_at_10")] == \
        [(1, 0.1), (2, 0.2)]
    assert set(run.data.metrics) == {"epoch", "valid_ndcg_at_10"}  # no strings, NaNs or Tune bookkeeping


@pytest.mark.slow
def test_wandb_offline_writes_one_run_per_trial_with_its_epochs(tracked: Path) -> None:
    """The run file is W&B's binary log, whose records keep every logged key and value as text: each epoch's
    validation NDCG@10, as history.parquet has it, is in its trial's run."""
    trials = pd.read_parquet(tracked / "out" / "trials.parquet")
    assert (trials["status"] == "ok").all() and len(trials) == 2
    history = pd.read_parquet(tracked / "out" / "history.parquet")

    runs = {run.name.rsplit("-", 1)[1]: run for run in (tracked / "wandb-runs" / "wandb").glob("offline-run-*")}
    assert sorted(runs) == sorted(trials["trial_id"])  # one run per trial, named by its Tune trial id
    for trial_id, run in runs.items():
        (log,) = run.glob("run-*.wandb")
        content = log.read_bytes()
        epochs = history[history["trial_id"] == trial_id]
        assert len(epochs) == EPOCHS and b"valid_ndcg@10" in content
        for value in epochs["valid_ndcg@10"]:
            assert repr(float(value)).encode() in content


# Runs one trial's W&B logging actor, as Ray would, outside Ray: its queue holds two epochs' reports, then the end.
# Prints the processes the actor left behind, which Ray would kill the moment ``run`` returns.
_ACTOR_SCRIPT = """
import os, sys
from pathlib import Path
from ray.air.integrations.wandb import _QueueItem
from study.search.wandb_runs import WandbTrialRuns

class Reports:
    items = [(_QueueItem.RESULT, {"training_iteration": epoch, "valid_ndcg@10": 0.01 * epoch + 0.001})
             for epoch in (1, 2)] + [(_QueueItem.END, None)]
    def get(self):
        return self.items.pop(0)

actor = WandbTrialRuns._logger_actor_cls(logdir=sys.argv[1], queue=Reports(), exclude=[], to_config=[],
                                         project="tracked", id="trial001", name="trial001", mode="offline",
                                         dir=sys.argv[1])
actor.run()

def parent(process):
    try:  # a process may end while we look: it is then no child of ours
        return process.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return None

children = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and parent(p) == str(os.getpid())]
print("left:", " ".join(children))
"""


def test_a_wandb_trial_run_is_complete_when_its_logging_actor_returns(tmp_path: Path) -> None:
    """Ray kills a trial's logging actor, and its children, as soon as the actor's ``run`` returns. W&B's service
    process (a child that writes the run file) must be gone by then: CI once found a run whose service had been killed
    first, its file holding the 7-byte header and nothing else. When ``run`` returns, no child is left and the
    file holds both epochs' values."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ACTOR_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "WANDB_SILENT": "true"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "left:"  # W&B's service exited before run returned
    (log,) = (tmp_path / "wandb").glob("offline-run-*-trial001/run-trial001.wandb")
    content = log.read_bytes()
    assert b"valid_ndcg@10" in content
    for value in (0.011, 0.021):
        assert repr(value).encode() in content
