"""The two dashboards of ``python -m study.sweep STUDY --dashboard``: Ray's (cluster) and optuna-dashboard (search).

* Ray's dashboard shows the cluster while the sweep runs: nodes, CPU/GPU/memory use, the trial actors, their logs
  and stack traces. Ray starts it (:func:`study.cluster.start_ray`) on 127.0.0.1; with Ray's token authentication
  (the default since Ray 2.59) the page asks for the token once and keeps it in a cookie. It accepts the token only
  from an ``Authorization: Bearer`` header or that cookie, never from the URL, so the printed line says which
  command prints it.
* optuna-dashboard shows the search itself from the study's ``optuna.db``: every trial's suggested values and
  objective values, optimisation history, parameter importances, the Pareto front of a multi-objective study.
  :class:`OptunaDashboard` runs it as a child process on 127.0.0.1 and a free port, and stops it when the sweep
  ends; ``optuna-dashboard sqlite:///results/<study>/optuna.db`` browses a finished study.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 20.0


def ray_dashboard_line(url: str, token_auth: bool) -> str:
    """The one line that tells a researcher how to open Ray's dashboard (the URL, and the token's command)."""
    url = url if url.startswith("http") else f"http://{url}"
    if not token_auth:
        return f"Ray dashboard: {url}"
    return f"Ray dashboard: {url} (it asks for a token once: paste the output of `ray get-auth-token`)"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _executable() -> str | None:
    """optuna-dashboard's console script of this Python's environment (else the one on PATH)."""
    beside = Path(sys.executable).with_name("optuna-dashboard")
    return str(beside) if beside.is_file() else shutil.which("optuna-dashboard")


class OptunaDashboard:
    """optuna-dashboard on ``storage_url`` (an Optuna RDB URL), on 127.0.0.1 and a free port, for a ``with`` block.

    ``url`` is None when it could not start; ``problem`` then says why (the sweep goes on without it).
    """

    def __init__(self, storage_url: str, host: str = LOOPBACK) -> None:
        self.storage_url, self.host = storage_url, host
        self.url: str | None = None
        self.problem: str | None = None
        self._process: subprocess.Popen | None = None

    def start(self) -> OptunaDashboard:
        executable = _executable()
        if executable is None:
            self.problem = "optuna-dashboard is not installed (pip install optuna-dashboard)"
            return self
        import optuna

        # the schema first, here: two processes creating the SQLite tables at once could collide
        optuna.storages.RDBStorage(self.storage_url)
        port = free_port(self.host)
        self._process = subprocess.Popen(
            [executable, self.storage_url, "--host", self.host, "--port", str(port), "--quiet"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://{self.host}:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self.problem = f"optuna-dashboard exited with code {self._process.returncode} at start"
                return self
            try:
                with urllib.request.urlopen(f"{url}/api/studies", timeout=2):
                    self.url = url
                    return self
            except OSError:
                time.sleep(0.2)
        self.problem = f"optuna-dashboard did not answer on {url} within {START_TIMEOUT_S:g} s"
        self.stop()
        return self

    def line(self) -> str:
        """The line to print: the URL, or why there is none."""
        if self.url:
            return f"optuna-dashboard: {self.url} (stops with the sweep)"
        return f"optuna-dashboard: not started: {self.problem}"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> OptunaDashboard:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()
