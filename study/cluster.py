"""Starting or joining Ray for every study command (sweep, replicate, scaling): one ``--address`` for all.

``--address`` takes

* ``local`` (default): Ray starts inside this process, on this machine only;
* ``auto``: join the cluster that ``ray start`` runs on this machine (a head or a worker node of it);
* ``HOST:PORT``: join a cluster by its GCS address, from a machine that is itself a node of that cluster;
* ``ray://HOST:10001``: connect with Ray Client from outside the cluster.

When joining an existing cluster, the project's packages (``study``, ``models``, ``kernels``) travel to every
worker through the job's ``runtime_env`` (``py_modules``): the nodes need the same Python and package versions
(torch, ray, …) but not this repository. The dataset is prepared once by the driver and reaches trials through the
object store, so no worker runs a dataset recipe or reads the driver's disk.

Security: the dashboard (8265) and the Ray Client port (10001) execute code for whoever reaches them
(CVE-2023-48022), so a local Ray binds them to 127.0.0.1 only; see docs/cluster.md for remote clusters.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from study.errors import UserError

LOCAL, AUTO = "local", "auto"
CLIENT_ATTEMPTS = 3
# Ray gives a new local node a fixed 30 s to register its raylet; on cores other work keeps busy that may not be
# enough, and the same start a little later usually is
LOCAL_ATTEMPTS = 3
DASHBOARD_HOST, DASHBOARD_PORT = "127.0.0.1", 8265
# Trials share cores: OpenMP threads that spin while waiting steal them from the neighbouring trial (~10x slower).
WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# The packages a trial imports; shipped to an existing cluster (they are importable here already for `local`).
SHIPPED_PACKAGES = ("study", "models", "kernels")
# Never uploaded: bytecode and editor/OS leftovers (results/, caches and .git live outside the shipped packages).
SHIPPED_EXCLUDES = ["__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".DS_Store"]
ADDRESS_HELP = ("where Ray runs: local (default: start Ray inside this process, on this machine), auto (join the "
                "cluster `ray start` runs on this machine), HOST:PORT (join a cluster by its GCS address from one "
                "of its nodes) or ray://HOST:10001 (Ray Client, from outside the cluster); see docs/cluster.md")

_HOST_PORT = re.compile(r"^(?:ray://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}$")


def add_address_argument(parser: Any) -> None:
    """The shared ``--address`` option of every study command."""
    import argparse

    def parse(text: str) -> str:
        try:
            return check_address(text)
        except UserError as error:  # argparse reports ArgumentTypeError as a usage error (exit code 2)
            raise argparse.ArgumentTypeError(str(error)) from None

    parser.add_argument("--address", default=LOCAL, type=parse, help=ADDRESS_HELP)


def check_address(address: str) -> str:
    """``address`` if it is one Ray accepts (see the module docstring), else a UserError saying what is."""
    address = address.strip()
    if address in (LOCAL, AUTO) or _HOST_PORT.match(address):
        return address
    raise UserError(f"--address {address!r}: expected local, auto, HOST:PORT or ray://HOST:PORT")


def is_remote(address: str) -> bool:
    """Whether the address joins a cluster that exists already (its workers may be on other machines)."""
    return address != LOCAL


def is_client(address: str) -> bool:
    """Whether the address connects with Ray Client (this machine is outside the cluster)."""
    return address.startswith("ray://")


def runtime_env(address: str) -> dict[str, Any]:
    """The job's runtime_env: worker env vars always, the project's packages when joining an existing cluster."""
    env: dict[str, Any] = {"env_vars": dict(WORKER_ENV)}
    if is_remote(address):
        import importlib

        # py_modules takes the package folders themselves; Ray zips and uploads them once per job (content hash).
        env["py_modules"] = [str(Path(importlib.import_module(name).__file__).parent) for name in SHIPPED_PACKAGES]
        env["excludes"] = list(SHIPPED_EXCLUDES)
    return env


def choose_auth_mode(address: str) -> None:
    """Token authentication for a local Ray, chosen explicitly; call before Ray is imported.

    It is Ray's default since 2.59, which Ray otherwise announces with a warning at every start. Ray reads
    ``RAY_AUTH_MODE`` once, when it is imported, so setting it later would leave this process without the token
    its own cluster then demands. ``RAY_AUTH_MODE=disabled`` in the environment still opts out; a joined cluster
    keeps its own mode.
    """
    # once Ray is imported (a test or a notebook calling a command's main) the mode is Ray's to choose, as above
    if address == LOCAL and "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def dashboard_port(host: str = DASHBOARD_HOST) -> int:
    """8265, Ray's usual dashboard port, unless another Ray on this machine holds it: then a free one."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, DASHBOARD_PORT))
            return DASHBOARD_PORT
        except OSError:
            probe.bind((host, 0))
            return int(probe.getsockname()[1])


def start_ray(address: str = LOCAL, *, dashboard: bool = False, num_cpus: int | None = None,
              quiet: bool = False) -> bool:
    """Start (``local``) or join Ray; returns whether this call connected (and so must call ``ray.shutdown``)."""
    import ray

    if ray.is_initialized():
        return False
    address = check_address(address)
    if not sys.stdout.isatty():  # a log file or a pipe: the trials' lines without the terminal's colour codes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    kwargs: dict[str, Any] = {"runtime_env": runtime_env(address), "log_to_driver": not quiet,
                              "configure_logging": True, "logging_level": logging.WARNING}
    if address == LOCAL:
        kwargs.update(address=LOCAL, num_cpus=num_cpus, include_dashboard=dashboard)
        if dashboard:  # never 0.0.0.0: the dashboard runs code on the cluster for whoever reaches it
            kwargs.update(dashboard_host=DASHBOARD_HOST, dashboard_port=dashboard_port())
    else:
        if num_cpus is not None:
            raise UserError("--num-cpus sizes a local Ray only; an existing cluster has the CPUs its nodes declare")
        kwargs.update(address=address)
    # Ray Client's server forks a server per connection, which now and then dies at start-up (seen on loopback
    # when connections follow each other closely); a second attempt gets a fresh one
    attempts = CLIENT_ATTEMPTS if is_client(address) else LOCAL_ATTEMPTS if address == LOCAL else 1
    for attempt in range(1, attempts + 1):
        try:
            context = ray.init(**kwargs)
            break
        except Exception as error:
            if not (isinstance(error, ConnectionError) or (address == LOCAL and _start_timed_out(error))):
                raise
            if attempt == attempts:
                raise UserError(_start_failure(address, error, attempts)) from None
            what = "starting Ray here" if address == LOCAL else f"connecting to {address}"
            print(f"{what} failed ({str(error).strip().splitlines()[-1]}); retrying", file=sys.stderr)
            ray.shutdown()  # drop the half-made connection, or the half-started node's processes
            time.sleep(2.0 * attempt)
    if dashboard:
        _print_dashboard(context, address)
    return True


def _start_timed_out(error: Exception) -> bool:
    """Whether ``ray.init`` gave up on a local node whose raylet did not register in time (Ray raises a bare
    ``Exception`` for it, so its message is what tells it apart)."""
    return "timed out during startup" in str(error)


def _start_failure(address: str, error: Exception, attempts: int) -> str:
    if address != LOCAL:
        return f"cannot reach the Ray cluster at {address}: {error}"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"Ray's local node did not start, {attempts} times ({str(error).strip().splitlines()[0]}); with a load "
            f"average of {load:.1f} on {os.cpu_count()} CPUs the machine is too busy for it: run again when other "
            "work has finished")


def _print_dashboard(context: Any, address: str) -> None:
    from study.search.dashboards import ray_dashboard_line, ray_sign_in

    url = getattr(context, "dashboard_url", None)
    if not url:
        print("Ray dashboard: not running (it needs ray[default])")
        return
    # Ray sets RAY_AUTH_MODE=token in this process when it found the cluster's token
    token_auth = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    # the dashboard takes no token from a URL: the printed link sets its cookie first (RaySignIn)
    print(ray_dashboard_line(url, token_auth, ray_sign_in(url) if token_auth else None), flush=True)
    if is_remote(address) and not url.startswith(("127.0.0.1", "localhost")):
        print("  it listens beyond loopback: reach it through `ssh -L 8265:localhost:8265 HEAD` or `kubectl "
              "port-forward`, never expose it publicly (it runs code for whoever reaches it)")


def check_fits(cpu: float, gpu: float, workers: int = 1, what: str = "trial", spare_cpu: float = 0.0) -> int:
    """How many ``what``s fit at once on the connected cluster; a UserError, before any is scheduled, if none does.

    Ray would otherwise queue a request no node can satisfy and wait for ever (with an autoscaler: until a node
    type that has it appears), so a GPU asked of a CPU-only cluster is refused here, up front. ``spare_cpu`` CPUs
    are left out of what the trials may take (Ray Data's tasks run on them).
    """
    import ray

    cluster = ray.cluster_resources()
    have_cpu, have_gpu = float(cluster.get("CPU", 0)) - spare_cpu, float(cluster.get("GPU", 0))
    if gpu > 0 and have_gpu == 0:
        raise UserError(f"each {what} asks for {gpu * workers:g} GPU (resources.gpu) but the Ray cluster has no GPU "
                        f"({have_cpu:g} CPU on {len(ray.nodes())} node(s)); set resources.gpu: 0 or connect to a "
                        "cluster with GPU nodes")
    fits = math.floor(have_cpu / (cpu * workers) + 1e-9)
    if gpu > 0:
        fits = min(fits, math.floor(have_gpu / (gpu * workers) + 1e-9))
    if fits < 1:
        spare = f" besides the {spare_cpu:g} left to Ray Data" if spare_cpu else ""
        raise UserError(f"no {what} fits: each needs {cpu * workers:g} CPU and {gpu * workers:g} GPU, the Ray "
                        f"cluster has {have_cpu:g} CPU{spare} and {have_gpu:g} GPU")
    return fits


def node_identity() -> dict[str, str | None]:
    """The Ray node id and IP of the calling worker process (where a trial ran)."""
    try:
        import ray

        if not ray.is_initialized():  # asking a driver without Ray for its runtime context would start Ray
            return {"node_id": None, "node_ip": None}
        return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address()}
    except Exception:  # outside Ray (a plain function call in a test): nothing to say
        return {"node_id": None, "node_ip": None}
