"""Multi-node Ray: the ``--address`` helper, and a real sweep on a 2-node cluster on loopback.

The cluster is two Ray nodes of one CPU each (``ray.cluster_utils.Cluster``: a head and a worker node, separate
raylets and object stores), bound to 127.0.0.1 so that nothing leaves this machine. The sweep runs as the CLI in a
subprocess joined with ``--address``, exactly as on a real cluster; with one CPU per node, two concurrent trials
can only run on different nodes. The test stops only the nodes it started (``Cluster.shutdown``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from study.cluster import check_address, runtime_env
from study.errors import UserError

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
LOOPBACK_DRIVER = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # see driver_env


@pytest.mark.parametrize("address", ["local", "auto", "127.0.0.1:6379", "head.example.org:6380",
                                     "ray://127.0.0.1:10001", "ray://[::1]:10001"])
def test_accepted_addresses(address: str) -> None:
    assert check_address(address) == address


@pytest.mark.parametrize("address", ["", "0.0.0.0", "ray://host", "http://host:8265", "host:port", "a b:1"])
def test_rejected_addresses(address: str) -> None:
    with pytest.raises(UserError, match="expected local, auto, HOST:PORT or ray://HOST:PORT"):
        check_address(address)


def test_existing_cluster_gets_the_code_local_ray_does_not() -> None:
    assert "py_modules" not in runtime_env("local")
    shipped = runtime_env(f"{LOOPBACK}:6379")
    assert sorted(Path(p).name for p in shipped["py_modules"]) == ["kernels", "models", "study"]
    assert all((Path(p) / "__init__.py").is_file() for p in shipped["py_modules"])
    assert "__pycache__" in shipped["excludes"]
    assert shipped["env_vars"]["OMP_WAIT_POLICY"] == "PASSIVE"


def test_ray_client_retries_a_connection_its_server_failed_to_start(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    import ray

    from study import cluster

    calls = []

    def init(**kwargs):
        calls.append(kwargs["address"])
        if len(calls) < cluster.CLIENT_ATTEMPTS:  # what Ray Client raises when its per-connection server died
            raise ConnectionAbortedError("Initialization failure from server:\nStarting Ray client server failed.")
        return None

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(cluster.time, "sleep", lambda seconds: None)
    assert cluster.start_ray("ray://127.0.0.1:10001", quiet=True)
    assert calls == ["ray://127.0.0.1:10001"] * cluster.CLIENT_ATTEMPTS
    assert "failed (Starting Ray client server failed.); retrying" in capsys.readouterr().err

    calls.clear()

    def refuse(**kwargs):
        calls.append(kwargs["address"])
        raise ConnectionError("refused")

    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(UserError, match="cannot reach the Ray cluster at 127.0.0.1:6379: refused"):
        cluster.start_ray("127.0.0.1:6379", quiet=True)
    assert calls == ["127.0.0.1:6379"]  # a GCS address is not retried: ray.init waits for the GCS on its own


TIMED_OUT = ("The current node timed out during startup. This could happen because some of the raylet failed to "
             "startup or the GCS has become overloaded.")  # Ray's own words, raised as a bare Exception


def test_a_local_ray_that_a_busy_machine_kept_from_starting_is_started_again(monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture) -> None:
    import ray

    from study import cluster

    calls, shutdowns = [], []

    def init(**kwargs):
        calls.append(kwargs["address"])
        if len(calls) == 1:
            raise Exception(TIMED_OUT)
        return None

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    monkeypatch.setattr(cluster.time, "sleep", lambda seconds: None)
    assert cluster.start_ray("local", num_cpus=2, quiet=True)
    assert calls == ["local", "local"] and shutdowns == [1]  # the half-started node's processes are stopped first
    assert "starting Ray here failed (The current node timed out during startup." in capsys.readouterr().err

    def failing(error: Exception):
        def init(**kwargs):
            calls.append(kwargs["address"])
            raise error
        return init

    calls.clear()
    monkeypatch.setattr(ray, "init", failing(Exception(TIMED_OUT)))
    with pytest.raises(UserError, match="Ray's local node did not start, 3 times .*the machine is too busy"):
        cluster.start_ray("local", num_cpus=2, quiet=True)
    assert len(calls) == cluster.LOCAL_ATTEMPTS

    calls.clear()
    monkeypatch.setattr(ray, "init", failing(ValueError("bad")))
    with pytest.raises(ValueError, match="bad"):  # any other failure is Ray's to report, at once
        cluster.start_ray("local", num_cpus=2, quiet=True)
    assert calls == ["local"]


# ---------------------------------------------------------------------------------------------------------------
# A real 2-node cluster


def driver_env(tmp_path: Path) -> dict[str, str]:
    """The sweep's environment: a private data cache, and a driver that stays on loopback.

    ``ray.init(address="127.0.0.1:PORT")`` swaps a loopback host for this machine's network IP (so that a real
    cluster's workers can reach the driver); the cluster here listens on 127.0.0.1 only, so the driver must keep
    the loopback address, which Ray does when its single-machine mode is on (the variable's name is historical).
    """
    return {**os.environ, "SEQREC_DATA": str(tmp_path / "cache"), "PYTHONPATH": str(REPO), LOOPBACK_DRIVER: "0"}


def run_sweep(study: Path, address: str, env: dict[str, str], timeout: float, cwd: Path = REPO,
              extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, float]:
    """The sweep CLI in its own session, joined to ``address``; the session is killed if it overruns."""
    started = time.time()
    process = subprocess.Popen([sys.executable, "-m", "study.sweep", str(study), "--address", address, "--quiet",
                                *extra],
                               cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # only the driver's own session, never the cluster's nodes
        stdout, stderr = process.communicate()
        pytest.fail(f"the sweep did not finish in {timeout:.0f} s:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), time.time() - started


# Ports Ray's own components take by default on every node: a "free" port the OS hands out may be one of them
# (the dashboard agent's 52365 lies in Linux's ephemeral range), and Ray then refuses to start the node.
RAY_DEFAULT_PORTS = {6379, 8076, 8077, 8265, 10001, 52365, 52366}


def free_port() -> int:
    while True:
        with socket.socket() as probe:
            probe.bind((LOOPBACK, 0))
            port = probe.getsockname()[1]
        if port not in RAY_DEFAULT_PORTS:
            return port


@pytest.fixture(scope="module")
def two_nodes(s3_server: dict[str, str]):
    """A head and a worker node, one CPU each, on 127.0.0.1, without dashboard; shut down whatever happens.

    The head also serves Ray Client (``client_address``); the nodes start after the test S3 server, so their
    workers inherit its AWS variables, as a real cluster's nodes get theirs from the machine.
    """
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "node_ip_address": LOOPBACK, "include_dashboard": False,
            "object_store_memory": 100 * 1024 * 1024}
    client_port = free_port()
    # Ray Client's per-connection server is a driver on the head node: like the sweep's driver (driver_env), it
    # must keep the loopback address, so the nodes start with the same variable.
    previous = os.environ.get(LOOPBACK_DRIVER)
    os.environ[LOOPBACK_DRIVER] = "0"
    try:
        cluster = Cluster(initialize_head=True, head_node_args={**node, "ray_client_server_port": client_port},
                          shutdown_at_exit=True)
    finally:
        if previous is None:
            os.environ.pop(LOOPBACK_DRIVER)
        else:
            os.environ[LOOPBACK_DRIVER] = previous
    cluster.client_address = f"ray://{LOOPBACK}:{client_port}"
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_sweep_runs_its_trials_on_both_nodes(tmp_path: Path, two_nodes, write_tiny_sweep) -> None:
    out = tmp_path / "out"
    study = write_tiny_sweep(tmp_path / "study.yaml", name="two-nodes", storage=out, samples=2)
    done, wall = run_sweep(study, two_nodes.address, driver_env(tmp_path), timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"2-node sweep: {wall:.1f} s")

    trials = pd.read_parquet(out / "trials.parquet")
    assert len(trials) == 2 and (trials["status"] == "ok").all(), trials[["trial_id", "status", "error"]]
    assert len(list((out / "trials").glob("*.json"))) == 2
    assert pd.read_parquet(out / "history.parquet")["trial_id"].nunique() == 2
    # with one CPU per node, the two trials running at once were on different nodes
    per_node = trials["node_id"].value_counts()
    print("trials per node:", per_node.to_dict())
    assert trials["node_id"].notna().all() and len(per_node) == 2, per_node
    assert set(per_node.index) == {node.node_id for node in two_nodes.list_all_nodes()}
    assert set(trials["node_ip"]) == {LOOPBACK}
    assert not trials["gpu"].any() and set(trials["device"]) == {"cpu"}
    environment = json.loads((out / "environment.json").read_text())
    assert environment, "the environment of the run was not recorded"


@pytest.mark.slow
def test_a_gpu_trial_on_a_cpu_cluster_fails_up_front(tmp_path: Path, two_nodes, write_tiny_sweep) -> None:
    out = tmp_path / "out"
    study = write_tiny_sweep(tmp_path / "gpu.yaml", name="two-nodes", storage=out, samples=2, gpu=0.5)
    # a hang (Ray waiting for a GPU node) would be killed at the timeout and fail the test
    done, _ = run_sweep(study, two_nodes.address, driver_env(tmp_path), timeout=90)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "asks for 0.5 GPU (resources.gpu) but the Ray cluster has no GPU (2 CPU on 2 node(s))" in done.stderr
    assert not (out / "trials").exists()


@pytest.mark.slow
def test_a_sweep_over_ray_client_runs_on_the_cluster_and_lands_in_s3(tmp_path: Path, two_nodes, s3_bucket: str,
                                                                      write_tiny_sweep) -> None:
    import pyarrow.fs as pafs

    uri = f"{s3_bucket}/studies/two-nodes"
    study = write_tiny_sweep(tmp_path / "client.yaml", name="two-nodes", storage=uri, samples=2)
    done, wall = run_sweep(study, two_nodes.client_address, driver_env(tmp_path), timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"2-node sweep over Ray Client: {wall:.1f} s")
    assert f"mirrored to {uri}" in done.stdout

    fs, root = pafs.FileSystem.from_uri(uri)
    remote = {info.path[len(root) + 1:] for info in fs.get_file_info(pafs.FileSelector(root, recursive=True))
              if info.type == pafs.FileType.File}
    assert {"study.yaml", "optuna.db", "trials.parquet", "history.parquet", "environment.json"} <= remote
    # the driver ran on the head node and never wrote into this machine's folder; the results were pulled here
    local = tmp_path / "results" / "two-nodes"
    records = sorted(p.name for p in (local / "trials").glob("*.json"))
    assert len(records) == 2 and {f"trials/{name}" for name in records} <= remote
    trials = pd.read_parquet(local / "trials.parquet")
    assert len(trials) == 2 and (trials["status"] == "ok").all(), trials[["trial_id", "status", "error"]]
    per_node = trials["node_id"].value_counts()
    print("trials per node (Ray Client):", per_node.to_dict())
    assert set(per_node.index) == {node.node_id for node in two_nodes.list_all_nodes()}

    # a resume drives the study from a new working copy on the head (the first one was removed): the restored
    # searcher and recorder must follow it there
    done, _ = run_sweep(study, two_nodes.client_address, driver_env(tmp_path), timeout=240, cwd=tmp_path,
                        extra=("--resume",))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 trials: 2 ok" in done.stdout
    assert sorted(p.name for p in (local / "trials").glob("*.json")) == records


@pytest.mark.slow
def test_ray_client_with_a_local_folder_is_refused_up_front(tmp_path: Path, two_nodes, write_tiny_sweep) -> None:
    study = write_tiny_sweep(tmp_path / "local.yaml", name="two-nodes", storage=tmp_path / "out", samples=1)
    done, _ = run_sweep(study, two_nodes.client_address, driver_env(tmp_path), timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "the study is driven from the cluster's head node" in done.stderr
    assert "set storage: to a URI both reach" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_error_on_the_head_reaches_the_ray_client_as_an_error_line(tmp_path: Path, two_nodes, s3_bucket: str,
                                                                       write_tiny_sweep) -> None:
    study = write_tiny_sweep(tmp_path / "gpu.yaml", name="two-nodes", storage=f"{s3_bucket}/gpu", samples=2,
                             gpu=0.5)
    done, _ = run_sweep(study, two_nodes.client_address, driver_env(tmp_path), timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "error: each trial asks for 0.5 GPU (resources.gpu) but the Ray cluster has no GPU" in done.stderr
    assert "Traceback" not in done.stderr


def test_trial_lines_in_a_log_file_carry_no_colour_codes(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """A sweep whose output goes to a file (nohup, a cluster job's log) prints its trials' lines through Ray's own
    printer without the escape codes a terminal would turn into colour."""
    import ray
    from ray._private.worker import print_worker_logs

    from study import cluster

    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    assert cluster.start_ray("local", num_cpus=2, quiet=True)  # pytest's captured stdout is no terminal
    line = {"pid": "4242", "ip": "10.0.0.1", "localhost": "10.0.0.1", "lines": ["Restored from checkpoint"],
            "actor_name": "", "task_name": "sweep_trial"}
    print_worker_logs(line, sys.stdout)
    out = capsys.readouterr().out
    assert out == "(sweep_trial pid=4242) Restored from checkpoint\n"
