"""The two dashboards of ``python -m study.sweep STUDY --dashboard``: Ray's (cluster) and optuna-dashboard (search).

* Ray's dashboard shows the cluster while the sweep runs: nodes, CPU/GPU/memory use, the trial actors, their logs
  and stack traces. Ray starts it (:func:`study.cluster.start_ray`) on 127.0.0.1. With Ray's token authentication
  (the default since Ray 2.59) it takes the token only from an ``Authorization: Bearer`` (or
  ``X-Ray-Authorization``) header or its ``ray-authentication-token`` cookie, never from the URL; a plain browser
  sends neither and gets the page's "Authentication Token Required" dialog. :class:`RaySignIn` makes the printed
  link a way in in one step: it sets that cookie and forwards to the dashboard (see there).
* optuna-dashboard shows the search itself from the study's ``optuna.db``: every trial's suggested values and
  objective values, optimisation history, parameter importances, the Pareto front of a multi-objective study.
  :class:`OptunaDashboard` runs it as a child process on 127.0.0.1 and a free port, and stops it when the sweep
  ends; ``optuna-dashboard sqlite:///results/<study>/optuna.db`` browses a finished study.
"""

from __future__ import annotations

import hmac
import http.server
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType

LOOPBACK = "127.0.0.1"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
START_TIMEOUT_S = 20.0
# The cookie Ray's dashboard reads the token from, with the lifetime its own sign-in (POST /api/authenticate) gives it
TOKEN_COOKIE, TOKEN_COOKIE_MAX_AGE_S = "ray-authentication-token", 30 * 24 * 60 * 60
COOKIE_SAFE = re.compile(r"[A-Za-z0-9!#$%&'()*+\-./:<=>?@\[\]^_`{|}~]+")  # RFC 6265 cookie-octets


def ray_dashboard_line(url: str, token_auth: bool, sign_in: str | None = None) -> str:
    """The one line that tells a researcher how to open Ray's dashboard: its URL, or under token authentication
    the :class:`RaySignIn` link ``sign_in`` that opens it signed in, else the token's command for its dialog."""
    url = url if url.startswith("http") else f"http://{url}"
    if not token_auth:
        return f"Ray dashboard: {url}"
    if sign_in:
        return f"Ray dashboard: {sign_in} (opens {url}, signed in with its token)"
    return f"Ray dashboard: {url} (it asks for a token once: paste the output of `ray get-auth-token`)"


def ray_auth_token() -> str | None:
    """The token of this process's Ray (what ``ray get-auth-token`` prints, found the same way), None if none, or
    if it could not go into a cookie unquoted (a hand-made ``RAY_AUTH_TOKEN``; Ray's own are hex)."""
    try:
        from ray._raylet import AuthenticationTokenLoader

        loader = AuthenticationTokenLoader.instance()
        token = loader.get_raw_token(ignore_auth_mode=True) if loader.has_token(ignore_auth_mode=True) else None
    except Exception:  # a Ray without this (private) loader: the line falls back to the token's command
        return None
    return token if token and COOKIE_SAFE.fullmatch(token) else None


class RaySignIn:
    """A loopback link that signs a browser in to Ray's dashboard and opens it: the way in in one step.

    Ray 2.60's dashboard page reads nothing from its URL but ``?theme=``, so no link to the dashboard itself can
    carry the token. Cookies belong to a host, not to a port (RFC 6265), so a server on another port of the
    dashboard's loopback address can set the dashboard's cookie: ``GET /KEY`` answers with the cookie (the
    attributes the dashboard's own sign-in gives it: ``HttpOnly``, ``SameSite=Strict``, 30 days) and a redirect to
    the dashboard, which then opens past its token dialog. ``KEY`` is random per process and the server runs only
    while the command does (a daemon thread), so a printed link outlives neither, unlike the token it hands over;
    every other path is a 404. Only for a dashboard on a loopback address: a cookie set here could not reach
    another host.
    """

    def __init__(self, dashboard_url: str, token: str) -> None:
        self.dashboard_url = dashboard_url if dashboard_url.startswith("http") else f"http://{dashboard_url}"
        self.host = urllib.parse.urlsplit(self.dashboard_url).hostname or LOOPBACK
        self.url: str | None = None
        self._token, self._key = token, secrets.token_urlsafe(12)
        self._server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> RaySignIn:
        """Serve the link on the dashboard's host and a free port; ``url`` stays None for a remote dashboard."""
        if self.host not in LOOPBACK_HOSTS:
            return self
        self._server = http.server.ThreadingHTTPServer((self.host, 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="ray-sign-in", daemon=True).start()
        self.url = f"http://{self.host}:{self._server.server_address[1]}/{self._key}"
        return self

    def stop(self) -> None:
        server, self._server, self.url = self._server, None, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        path, cookie = f"/{self._key}", (f"{TOKEN_COOKIE}={self._token}; Max-Age={TOKEN_COOKIE_MAX_AGE_S}; Path=/; "
                                         "HttpOnly; SameSite=Strict")
        target = self.dashboard_url.rstrip("/") + "/"

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if not hmac.compare_digest(self.path.split("?")[0].encode(), path.encode()):
                    self.send_error(404)
                    return
                self.send_response(303)
                self.send_header("Set-Cookie", cookie)
                self.send_header("Location", target)
                self.send_header("Cache-Control", "no-store")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, fmt: str, *args: object) -> None:
                pass  # the sweep's console carries no request log

        return Handler


_sign_in: RaySignIn | None = None  # this process's link: one dashboard at a time, as one Ray at a time


def ray_sign_in(dashboard_url: str) -> str | None:
    """The one-step link into Ray's dashboard at ``dashboard_url`` (:class:`RaySignIn`, replacing this process's
    earlier one), or None where there is none: no token found, or a dashboard on another host."""
    global _sign_in
    token = ray_auth_token()
    if _sign_in is not None:
        _sign_in.stop()
        _sign_in = None
    if token is None:
        return None
    _sign_in = RaySignIn(dashboard_url, token).start()
    return _sign_in.url


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
