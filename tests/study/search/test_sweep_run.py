"""Real sweeps on a synthetic file in LastFM's format (no ``../shared`` needed): outputs, multi-objective Optuna,
a failing trial, and kill -9 + --resume; and a two-worker data-parallel sweep on ml-100k whose shards are asserted
(on a generated file with ml-100k's counts where ``../shared`` is absent).

The kill test runs the CLI in a subprocess (its own embedded Ray) and kills the whole process session with SIGKILL
once a trial has finished; it runs first, before this module's in-process Ray starts, so that the two clusters do
not share the two CPUs.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
# window_step 0: the newest window of each user only, an eighth of a whole-history epoch; what these tests check
# does not depend on the windows
TINY_MODEL = ("{max_len: 20, batch_size: 128, hidden_size: 16, num_layers: 1, num_heads: 1, inner_size: 32, "
              "window_step: 0")

pytestmark = pytest.mark.slow


def write_study(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_kill_9_then_resume_elsewhere_loses_no_finished_trial(tmp_path: Path, synthetic_lastfm_file: Path,
                                                               kill_session) -> None:
    out = tmp_path / "out"
    study = write_study(tmp_path / "kill.yaml", f"""
        name: kill-resume
        model: sasrec
        dataset: {{name: lastfm, source: {synthetic_lastfm_file}}}
        fixed: {TINY_MODEL}, measure_efficiency: false}}
        search:
          lr: {{loguniform: [1.0e-3, 1.0e-2]}}
        budget: {{num_samples: 4, max_epochs: 3}}
        scheduler: {{type: asha, grace_period: 1, reduction_factor: 2}}
        resources: {{cpu: 1, max_concurrent: 1}}
        storage: {out}
        """)
    env = {**os.environ, "SEQREC_DATA": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "study.sweep", str(study), "--num-cpus", "2", "--quiet"]
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    records = out / "trials"
    try:
        deadline = time.time() + 240
        while time.time() < deadline and first.poll() is None and not list(records.glob("*.json")):
            time.sleep(0.2)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        finished = {p.name: p.read_bytes() for p in records.glob("*.json")}
        assert finished, "no trial finished in time"
    finally:
        kill_session(first.pid)  # SIGKILL to the driver and every Ray process it started
        first.wait(timeout=60)
        log.close()
    assert first.returncode == -signal.SIGKILL
    finished = {name: data for name, data in finished.items() if (records / name).exists()}
    assert len(finished) < 4, "the study finished before it could be killed"

    # the study resumes wherever its folder is now (moved, copied to another machine, pulled from a bucket): the
    # restored recorder and Optuna searcher must follow it, and nothing may be written to the old place
    moved = tmp_path / "moved"
    shutil.move(out, moved)
    out, records = moved, moved / "trials"
    resumed = subprocess.run(command + ["--resume", "--set", f"storage={moved}"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (tmp_path / "out").exists()
    for name, data in finished.items():  # finished trials are kept as they were: neither lost nor retrained
        assert (records / name).read_bytes() == data, name
    trials = pd.read_parquet(out / "trials.parquet")
    assert {name.removesuffix(".json") for name in finished} <= set(trials["trial_id"])
    assert len(trials) >= 4 and (trials["status"] == "ok").all(), trials[["trial_id", "status", "error"]]
    history = pd.read_parquet(out / "history.parquet")
    assert not history.duplicated(["trial_id", "epoch"]).any()
    assert set(history["trial_id"]) == set(trials["trial_id"])
    optuna_study = optuna.load_study(study_name="kill-resume", storage=f"sqlite:///{out / 'optuna.db'}")
    states = {t.user_attrs.get("tune_trial_id"): t.state for t in optuna_study.trials}
    assert all(states[tid] == optuna.trial.TrialState.COMPLETE for tid in trials["trial_id"]), states
    assert not any(s == optuna.trial.TrialState.RUNNING for s in states.values())  # orphans of the kill closed
    assert f"{len(trials)} trials: {len(trials)} ok" in resumed.stdout


def test_a_grid_stopped_under_its_trials_resumes_each_point_once(tmp_path: Path, synthetic_lastfm_file: Path,
                                                                 kill_session) -> None:
    """A trial whose worker dies (as when the study is stopped with SIGTERM) trains again on --resume, and the
    grid runs every point once: before, the trial was replayed as failed and another point ran twice.

    Four epochs: its worker is killed within a poll (0.1 s) of its first epoch's report, three epochs (seconds) before
    it could end; the resume then trains the three points in full, one at a time, so every epoch more is three on the
    clock."""
    out = tmp_path / "out"
    study = write_study(tmp_path / "grid.yaml", f"""
        name: grid-resume
        model: sasrec
        dataset: {{name: lastfm, source: {synthetic_lastfm_file}}}
        fixed: {TINY_MODEL}, measure_efficiency: false, patience: 0}}
        search:
          seed: {{grid: [1, 2, 3]}}
        budget: {{num_samples: 3, max_epochs: 4}}
        scheduler: none
        sampler: grid
        resources: {{cpu: 1, max_concurrent: 1}}
        storage: {out}
        """)
    env = {**os.environ, "SEQREC_DATA": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "study.sweep", str(study), "--num-cpus", "2", "--quiet"]
    records = out / "trials"
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            running = wait_for(lambda: list(records.glob("*.history.jsonl")), first, tmp_path / "first.log")
            lost_id = running[0].name.split(".")[0]
            kill_trial_workers(first.pid)  # its worker dies under it, as at a SIGTERM to the study
            wait_for(lambda: (records / f"{lost_id}.json").exists(), first, tmp_path / "first.log")
        finally:
            kill_session(first.pid)
            first.wait(timeout=60)
    lost = json.loads((records / f"{lost_id}.json").read_text())
    assert lost["status"] == "failed" and lost["error"].startswith(("ActorDiedError", "RayActorError")), lost["error"]

    resumed = subprocess.run(command + ["--resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    trials = pd.read_parquet(out / "trials.parquet")
    assert (trials["status"] == "ok").all(), trials[["trial_id", "status", "error"]]
    assert sorted(trials["config.seed"]) == [1, 2, 3]  # each point once
    assert lost_id in set(trials["trial_id"])  # trained again, not replayed as failed
    optuna_study = optuna.load_study(study_name="grid-resume", storage=f"sqlite:///{out / 'optuna.db'}")
    complete = [t for t in optuna_study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.params["seed"] for t in complete) == [1, 2, 3]
    assert not any(t.state == optuna.trial.TrialState.RUNNING for t in optuna_study.trials)


def wait_for(condition, process: subprocess.Popen, log: Path, seconds: float = 240) -> Any:
    """Poll ``condition`` until it holds; fail with the log's tail if the process ends or time runs out."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        assert process.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"timed out; log tail:\n{log.read_text()[-3000:]}")


def kill_trial_workers(session: int) -> None:
    """SIGKILL the Tune trial actors (function trainables run in ``ray::ImplicitFunc``) of a process session."""
    listing = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True, check=True).stdout
    killed = 0
    for line in listing.splitlines():
        pid, sid, args = line.split(None, 2)
        if int(sid) == session and "ImplicitFunc" in args:
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
    assert killed, "no trial worker found"


@pytest.fixture(scope="module")
def shard_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this module's data-parallel workers write the windows of each epoch (``$SEQREC_SHARD_LOG``)."""
    return tmp_path_factory.mktemp("shard-log")


@pytest.fixture(scope="module")
def ray_session(shard_log: Path):
    import ray

    from study.search.data_parallel import SHARD_LOG_ENV

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_WAIT_POLICY": "PASSIVE", SHARD_LOG_ENV: str(shard_log)}})
    yield
    ray.shutdown()


def test_two_trial_multi_objective_sweep_with_a_failing_trial(tmp_path: Path, data_cache: Path, ray_session,
                                                              synthetic_lastfm_file: Path) -> None:
    from study.search.runner import run_study
    from study.spec.study_file import load_study

    out = tmp_path / "out"
    path = write_study(tmp_path / "study.yaml", f"""
        name: lastfm-two
        model: sasrec
        dataset: {{name: lastfm, source: {synthetic_lastfm_file}}}
        fixed: {TINY_MODEL}}}
        search:
          lr: {{grid: [0.001, 1.0e+8]}}   # the second learning rate makes the loss NaN: a failing trial
        objectives: {{valid_ndcg@10: max, peak_mem_mb: min}}
        budget: {{num_samples: 2, max_epochs: 2}}
        scheduler: none
        resources: {{cpu: 1}}
        storage: {out}
        """)
    outcome = run_study(load_study(path), quiet=True)

    trials = pd.read_parquet(out / "trials.parquet").set_index("config.lr")
    assert sorted(trials["status"]) == ["failed", "ok"]
    failed, ok = trials.loc[1e8], trials.loc[0.001]
    assert failed["error"].startswith("NonFiniteLoss: non-finite training loss"), failed["error"]
    assert failed["stop_reason"] == "error"
    assert ok["stop_reason"] == "max_epochs" and ok["epochs_run"] == 2 and ok["error"] == ""
    for column in ("valid_ndcg@10", "test_ndcg@10", "valid_hr@10", "test_mrr@20", "pop_ndcg@10", "params",
                   "peak_mem_mb", "infer_ms_p50", "infer_ms_p95", "train_throughput", "step_time_ms", "epoch_time_s"):
        assert math.isfinite(ok[column]) and ok[column] >= 0, column
    assert ok["params"] > 0 and ok["peak_mem_mb"] > 0 and ok["seed"] == 0 and ok["dataset"] == "lastfm"
    assert ok["objective"] == "causal" and ok["config.num_threads"] == 1
    # energy: measured where this machine has a counter (RAPL for these CPU trials), else no number and it says so
    from study.train.energy import method_of, open_counter

    assert ok["energy_method"] == method_of(open_counter("cpu"))
    if ok["energy_method"] == "unavailable":
        assert pd.isna(ok["train_energy_j_per_epoch"]) and pd.isna(ok["infer_energy_j_per_1k"])
    else:
        assert ok["train_energy_j_per_epoch"] > 0 and ok["infer_energy_j_per_1k"] > 0
    csv = pd.read_csv(out / "trials.csv")
    assert sorted(csv["trial_id"]) == sorted(trials["trial_id"])

    history = pd.read_parquet(out / "history.parquet")
    mine = history[history["trial_id"] == ok["trial_id"]].sort_values("epoch")
    assert list(mine["epoch"]) == [1, 2]
    assert "train_energy_j" in mine  # each epoch's own training energy (NaN where not measured)
    best = mine.loc[mine["valid_ndcg@10"].idxmax()]
    # the row's test figures belong to the best-validation epoch, never the last one by default
    assert ok["test_ndcg@10"] == pytest.approx(best["test_ndcg@10"])
    assert ok["valid_ndcg@10"] == pytest.approx(mine["valid_ndcg@10"].max())

    optuna_study = optuna.load_study(study_name="lastfm-two", storage=f"sqlite:///{out / 'optuna.db'}")
    assert [d.name for d in optuna_study.directions] == ["MAXIMIZE", "MINIMIZE"]
    by_id = {t.user_attrs["tune_trial_id"]: t for t in optuna_study.trials}
    assert by_id[failed["trial_id"]].state == optuna.trial.TrialState.FAIL
    assert by_id[ok["trial_id"]].state == optuna.trial.TrialState.COMPLETE
    assert by_id[ok["trial_id"]].values == pytest.approx([ok["valid_ndcg@10"], ok["peak_mem_mb"]])

    assert yaml.safe_load((out / "study.yaml").read_text())["objectives"] == {"valid_ndcg@10": "max",
                                                                               "peak_mem_mb": "min"}
    environment = json.loads((out / "environment.json").read_text())
    assert environment["packages"]["ray"] and environment["hardware"]["accelerator"] in ("cpu", "gpu")
    assert environment["ray_cluster"]["CPU"] == 2
    assert not [p for p in out.rglob("*.tmp")], "a temporary file was left behind"
    assert "Pareto front" in outcome["summary"] and "failed" in outcome["summary"]


def test_ray_data_batches_cover_every_trainable_window_once_per_epoch(data_cache: Path, ray_session,
                                                                     synthetic_lastfm_file: Path) -> None:
    import numpy as np

    from study.data import prepare
    from study.search.trial import ray_data_batches
    from study.search.windows import materialized_dataset, training_windows
    from study.train.trainer import TrialData, user_batches

    path = prepare("lastfm", source=synthetic_lastfm_file, max_len=30, progress=False)
    dataset = materialized_dataset(training_windows(path, False))  # from_arrow + filter + materialize, as sweeps do
    expected = TrialData.from_prepared(path, 12).train
    expected = np.concatenate([batch.windows for batch in user_batches(expected, 10_000, np.random.default_rng(0))])
    batches = ray_data_batches(dataset, 64, seed=3, max_len=12, shuffle_rows=dataset.count())
    full = TrialData.from_prepared(path, 12).train
    epochs = []
    for epoch in (1, 2):
        pairs = list(batches(epoch))
        windows, users = np.concatenate([w for w, _ in pairs]), np.concatenate([u for _, u in pairs])
        assert np.array_equal(windows, full[users])  # every window travels with its user id
        epochs.append(windows)
    for windows in epochs:
        assert windows.shape == expected.shape and windows.dtype.kind == "i"
        assert sorted(map(bytes, windows)) == sorted(map(bytes, expected.astype(windows.dtype)))
    assert not np.array_equal(epochs[0], epochs[1])  # reshuffled each epoch
    again = np.concatenate([w for w, _ in ray_data_batches(dataset, 64, seed=3, max_len=12,
                                                           shuffle_rows=dataset.count())(1)])
    assert np.array_equal(again, epochs[0])  # and reproducible from the seed
    # the shared evaluation arrays, cropped in the trial, equal a dataset loaded for that max_len directly
    cropped, direct = TrialData.from_prepared(path, 30).cropped(12), TrialData.from_prepared(path, 12)
    for name in ("inputs", "targets", "history_items", "history_starts", "history_lengths"):
        assert np.array_equal(getattr(cropped.valid, name), getattr(direct.valid, name)), name
        assert np.array_equal(getattr(cropped.test, name), getattr(direct.test, name)), name
    assert np.array_equal(cropped.train, direct.train) and cropped.train.flags.writeable


def test_streamed_windows_cover_every_trainable_window_once_per_epoch(data_cache: Path, ray_session,
                                                                      synthetic_lastfm_file: Path) -> None:
    """``dataset.stream``: read from the Parquet file each epoch through a shuffle buffer smaller than the data."""
    import numpy as np

    from study.data import prepare
    from study.search.trial import ray_data_batches
    from study.search.windows import streamed_dataset, training_windows
    from study.train.trainer import TrialData

    path = prepare("lastfm", source=synthetic_lastfm_file, max_len=30, progress=False)
    full = TrialData.from_prepared(path, 12).train
    trainable = np.flatnonzero((full[:, -2] > 0) & (full[:, -1] > 0))
    assert len(trainable) > 200
    batches = ray_data_batches(streamed_dataset(training_windows(path, True)), 32, seed=3, max_len=12,
                               shuffle_rows=100)
    orders = []
    for epoch in (1, 2):
        pairs = list(batches(epoch))
        windows, users = np.concatenate([w for w, _ in pairs]), np.concatenate([u for _, u in pairs])
        assert sorted(users) == list(trainable)  # each trainable window once, no other
        assert np.array_equal(windows, full[users])
        orders.append(users)
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[0], np.sort(orders[0]))
    again = np.concatenate([u for _, u in batches(1)])
    assert np.array_equal(again, orders[0])  # reproducible from the seed
    sample = TrialData.from_prepared(path, 12, train_rows=50)
    assert np.array_equal(sample.train, full[:50]) and len(sample.valid.inputs) == len(full)


def test_a_streaming_sweep_leaves_ray_data_a_cpu_and_trains(tmp_path: Path, data_cache: Path, ray_session,
                                                             write_tiny_sweep) -> None:
    """Ray Data runs nothing while less than one CPU is free, so on two CPUs the streamed trials run one at a time.
    (The test above reads a stream for two epochs.)"""
    from study.search.runner import run_study
    from study.spec.study_file import StudyConfigError, load_study

    out = tmp_path / "out"
    path = write_tiny_sweep(tmp_path / "study.yaml", name="streamed", storage=out, samples=2)
    run_study(load_study(path, ["dataset.stream=true", "scheduler=none"]), quiet=True)  # one epoch each
    trials = pd.read_parquet(out / "trials.parquet")
    assert list(trials["status"]) == ["ok", "ok"] and list(trials["epochs_run"]) == [1, 1]
    assert (trials["valid_ndcg@10"] > 0).all() and yaml.safe_load((out / "study.yaml").read_text())[
        "dataset"]["stream"] is True
    with pytest.raises(StudyConfigError, match="stream"):
        load_study(path, ["dataset.stream=true", "protocol.objective=last"])


def test_a_one_epoch_quick_run_turns_asha_off_and_runs(tmp_path: Path, data_cache: Path, ray_session,
                                                       write_tiny_sweep) -> None:
    from study.search.runner import run_study
    from study.spec.study_file import load_study

    out = tmp_path / "out"
    path = write_tiny_sweep(tmp_path / "study.yaml", name="quick", storage=out, samples=2, max_concurrent=1)
    study = load_study(path, ["sampler=tpe", "scheduler={type: asha, grace_period: 3}", "budget.max_epochs=1"])
    assert study.scheduler is None and study.searcher.n_startup_trials == 2
    run_study(study, quiet=True)

    trials = pd.read_parquet(out / "trials.parquet")
    assert len(trials) == 2 and (trials["status"] == "ok").all() and (trials["epochs_run"] == 1).all()
    text = (out / "study.yaml").read_text()
    assert "# adapted: ASHA off: budget.max_epochs=1 leaves no epoch at which to stop a trial\n" in text
    resolved = yaml.safe_load(text)
    assert resolved["scheduler"] is None and resolved["budget"]["max_epochs"] == 1
    assert resolved["searcher"] == {"n_startup_trials": 2, "multivariate": True, "n_ei_candidates": 24}


@pytest.fixture
def ml100k_source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Real ml-100k where ../shared holds it (CI), prepared once per session; elsewhere the generated file with
    ML-100K's counts, so that the data-parallel sweep runs everywhere."""
    real = REPO.parent / "shared" / "datasets" / "ml-100k" / "ml-100k.inter"
    if not real.is_file():
        monkeypatch.setenv("SEQREC_DATA", str(request.getfixturevalue("data_cache")))
        return request.getfixturevalue("ml100k_shaped_udata")
    request.getfixturevalue("ml100k_prepared")
    monkeypatch.setenv("SEQREC_DATA", str(request.getfixturevalue("prepared_cache")))
    return real


def test_a_two_worker_sweep_on_ml100k_trains_every_window_once_per_epoch_on_disjoint_shards(
        tmp_path: Path, ray_session, shard_log: Path, ml100k_source: Path) -> None:
    import numpy as np

    from study.data import prepare
    from study.search.records import read_records
    from study.search.runner import run_study
    from study.spec.study_file import load_study
    from study.train.trainer import TrialData

    out = tmp_path / "out"
    path = write_study(tmp_path / "study.yaml", f"""
        name: two-workers
        model: sasrec
        dataset: {{name: ml-100k, source: {ml100k_source}}}
        fixed: {TINY_MODEL}, measure_efficiency: false}}
        search:
          lr: {{loguniform: [1.0e-3, 1.0e-2]}}
        sampler: random
        budget: {{num_samples: 1, max_epochs: 2}}
        resources: {{cpu: 1, workers_per_trial: 2}}
        storage: {out}
        """)
    run_study(load_study(path, ["scheduler=none", "checkpoint={every: 1, keep: 1}"]), quiet=True)

    ((trial_id, record),) = read_records(out / "trials").items()
    assert record["status"] == "ok" and record["last_report"]["workers"] == 2, record["error"]
    assert [row["epoch"] for row in record["history"]] == [1, 2]
    windows = TrialData.from_prepared(prepare("ml-100k", source=ml100k_source, max_len=20, progress=False), 20).train
    trainable = np.flatnonzero((windows[:, :-1] > 0).any(1) & (windows[:, -1] > 0))  # as the trainer keeps them
    if ml100k_source.suffix == ".inter":
        assert len(trainable) == 943  # odd: an equal split of the bare windows would drop one of them every epoch
    for epoch in (1, 2):
        shards = [np.load(shard_log / trial_id / f"epoch-{epoch}-rank-{rank}.npz") for rank in (0, 1)]
        first, second = (shard["windows"] for shard in shards)
        assert len(np.unique(first)) == len(first) and len(np.unique(second)) == len(second)
        assert np.intersect1d(first, second).size == 0  # disjoint
        assert np.array_equal(np.sort(np.concatenate([first, second])), trainable)  # covering
        assert abs(len(first) - len(second)) <= 1
        assert int(shards[0]["steps"]) == int(shards[1]["steps"]) == math.ceil((len(trainable) + 1) // 2 / 128)
    # rank 0 checkpointed the training state in the trial's Train run (what a restarted trial resumes from) and kept
    # the best model where a one-process trial does; export finds the weights in the checkpoint without that folder
    from study.export import export_model
    from study.train.state import load_state

    (checkpoint,) = [path for path in (out / "tune").glob("*/*/checkpoint_*") if path.is_dir()]
    assert load_state(checkpoint).epoch == 2  # keep: 1, the last epoch's
    assert (out / "models" / record["trial_id"] / "model.pt").is_file()
    shutil.rmtree(out / "models")
    assert json.loads((export_model(out, tmp_path / "export") / "model.json").read_text())["best_epoch"] == \
        record["last_report"]["best_epoch"]


def test_a_sweep_trial_gives_the_metrics_of_study_train_for_the_same_seed(tmp_path: Path, data_cache: Path,
                                                                          ray_session, write_tiny_sweep,
                                                                          synthetic_lastfm_prepared: Path) -> None:
    """Replicates and reports rely on it: a one-process trial sees exactly study.train's batches."""
    from study.search.runner import run_study
    from study.spec.study_file import load_study
    from study.train.trainer import TrialData, run_trial

    out = tmp_path / "out"
    path = write_tiny_sweep(tmp_path / "study.yaml", name="same-batches", storage=out, samples=1)
    run_study(load_study(path, ["budget.max_epochs=2", "scheduler=none", "seeds.train=5"]), quiet=True)
    (trial,) = pd.read_parquet(out / "trials.parquet").to_dict("records")
    assert trial["status"] == "ok" and trial["config.num_threads"] == 1

    settings = {"max_len": 20, "batch_size": 256, "hidden_size": 16, "num_layers": 1, "num_heads": 1,
                "inner_size": 32, "measure_efficiency": False, "lr": trial["config.lr"], "max_epochs": 2, "seed": 5,
                "num_threads": 1, "window_step": 0}
    # the sweep's dataset (write_tiny_sweep's SYNTHETIC_LASTFM), prepared with wider windows: cropped to the same 20
    alone = run_trial("sasrec", TrialData.from_prepared(synthetic_lastfm_prepared, 20), settings)
    metrics = [key for key in alone if key.startswith(("valid_", "test_"))]
    assert len(metrics) == 18
    assert {key: trial[key] for key in metrics} == {key: alone[key] for key in metrics}
