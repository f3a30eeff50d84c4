"""Check that the URLs ``python -m study.sweep STUDY --dashboard`` prints work as printed.

    python -m tests.browser.dashboards_check [--screenshots DIR] [--ray-only]

Runs a small synthetic sweep with ``--dashboard`` (a minute or two on 2 cores) and, while it runs:

* Ray's dashboard (the ``Ray dashboard: LINK (opens URL, signed in with its token)`` line): an API call without
  the token is refused (401), the same call with ``Authorization: Bearer <output of ray get-auth-token>`` answers
  200, and ``POST /api/authenticate`` (what the page's token dialog sends) sets the ``ray-authentication-token``
  cookie, which then opens the API as well; the printed LINK answers with that cookie and a redirect to URL;
* optuna-dashboard (the ``optuna-dashboard: URL`` line): ``/api/studies`` lists the study and its trials appear;
* with ``--screenshots DIR`` and a ``chromium`` on PATH, headless Chromium (over the DevTools protocol, see
  :mod:`tests.browser.browser`) opens both pages as a person would, each in a fresh profile: Ray's dashboard URL
  itself shows the token dialog; the printed LINK, opened as it is and nothing else, shows the dashboard past the
  dialog, whose Actors page lists the trials' actors; optuna-dashboard's Trials page lists the trials. A
  screenshot of each goes into DIR.

After the sweep, optuna-dashboard must have stopped. ``--ray-only`` checks Ray's line alone, without a sweep: Ray
started as the commands start it (:func:`study.cluster.start_ray` with the dashboard, one CPU), its printed line,
the API checks and, with ``--screenshots``, the browser's way in (tests/browser/test_dashboards_check.py runs
it). Exits 0 when every check passed, 1 otherwise; each check prints one ``ok``/``FAIL`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import http.cookiejar
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from tests.browser.browser import Browser, BrowserError, Checks, chromium_path

REPO = Path(__file__).resolve().parents[2]
TOKEN_DIALOG = "Authentication Token Required"  # the title of the dialog Ray's page shows without the cookie
TOKEN_COOKIE = "ray-authentication-token"
URL_LINE = re.compile(r"^(Ray dashboard|optuna-dashboard): (http://\S+)")
RAY_TARGET = re.compile(r"\(opens (http://\S+), signed in")  # the dashboard itself, behind the printed link
STUDY_NAME = "dashboards-check"
# Ray as a study command starts it with --dashboard (token authentication, 127.0.0.1), held until stdin closes
HOLD_RAY = ("import sys; from study.cluster import choose_auth_mode, start_ray; choose_auth_mode('local'); "
            "start_ray('local', dashboard=True, num_cpus=1); sys.stdin.read()")


def status_of(url: str, headers: dict[str, str] | None = None, opener: urllib.request.OpenerDirector | None = None,
              data: bytes | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with (opener.open if opener else urllib.request.urlopen)(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # the redirect itself is checked, not where it leads


def check_link(link: str, url: str, token: str, check: Checks) -> None:
    """The printed link answers with the dashboard's cookie (the token) and a redirect to the dashboard."""
    try:
        with urllib.request.build_opener(_NoRedirect).open(link, timeout=10) as response:
            status, headers = response.status, response.headers
    except urllib.error.HTTPError as error:  # the 303 itself: the opener follows no redirect
        status, headers = error.code, error.headers
    cookie = headers.get("Set-Cookie", "")
    check(status == 303 and headers.get("Location", "").rstrip("/") == url.rstrip("/"),
          f"the printed link {link} redirects to {url} (HTTP {status})")
    check(cookie.startswith(f"{TOKEN_COOKIE}={token};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie,
          f"... and sets the {TOKEN_COOKIE} cookie to the token (HttpOnly, SameSite=Strict)")
    check(status_of(link + "x") == 404, "... a link with another key is refused (404)")


def check_ray(url: str, check: Checks) -> str:
    api = f"{url}/api/cluster_status"
    token = subprocess.run(["ray", "get-auth-token"], capture_output=True, text=True, timeout=60).stdout.strip()
    check(bool(token), "`ray get-auth-token` prints a token")
    check(status_of(api) == 401, f"Ray dashboard {api} without the token: 401")
    check(status_of(api, {"Authorization": f"Bearer {token}"}) == 200, "... with Authorization: Bearer <token>: 200")
    cookies = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(cookies))
    signed_in = status_of(f"{url}/api/authenticate", {"Authorization": f"Bearer {token}"}, browser, data=b"")
    check(signed_in == 200 and any(c.name == "ray-authentication-token" for c in cookies),
          "POST /api/authenticate (the page's token dialog) sets the ray-authentication-token cookie")
    check(status_of(api, opener=browser) == 200, "... and the cookie alone opens the API: 200")
    check(status_of(url) == 200, f"the page itself ({url}) loads (it shows the token dialog)")
    return token


def check_optuna(url: str, check: Checks, deadline: float) -> int | None:
    """The study's id in optuna-dashboard once it lists the study and a trial; None when it never does."""
    studies = []
    while time.monotonic() < deadline and not studies:
        studies = [s for s in get_json(f"{url}/api/studies")["study_summaries"] if s["study_name"] == STUDY_NAME]
        time.sleep(1)
    if not check(bool(studies), f"optuna-dashboard {url}/api/studies lists study {STUDY_NAME!r}"):
        return None
    trials = []
    while time.monotonic() < deadline and not trials:
        trials = get_json(f"{url}/api/studies/{studies[0]['study_id']}?after=0")["trials"]
        time.sleep(1)
    listed = check(bool(trials), f"... and its trials ({len(trials)} so far, states "
                                 f"{sorted({t['state'] for t in trials})})")
    return int(studies[0]["study_id"]) if listed else None


async def browse_ray(link: str, url: str, folder: Path, check: Checks, actors: bool) -> None:
    """Ray's page in headless Chromium as a person opens it, each time in a fresh profile (no cookie): the
    dashboard's URL itself shows the token dialog; the printed ``link``, opened as it is, shows the dashboard past
    the dialog, with the cluster's status, which only a signed-in page gets (with ``actors``, then its Actors page
    lists the trials' actors). A screenshot of the last page into ``folder``."""
    has_dialog = f"document.body.innerText.includes({json.dumps(TOKEN_DIALOG)})"
    async with Browser(width=1280, height=800) as browser:
        await browser.open(url)
        check(await browser.wait_for(has_dialog), f"a browser without the cookie sees Ray's {TOKEN_DIALOG!r} dialog")
    async with Browser(width=1280, height=800) as browser:
        await browser.open(link)
        # "Node Status" comes from /api/cluster_status, which answers only a signed-in page
        shown = await browser.wait_for(f"!{has_dialog} && document.body.innerText.includes('Node Status') && "
                                       f"location.href.startsWith({json.dumps(url)})", 60)
        shown = shown and not await browser.evaluate(has_dialog)
        if not check(shown, f"the printed link, opened as it is, lands on Ray's dashboard ({url}) past the token "
                            "dialog, showing the cluster's status"):
            print(f"     the page reads: {' '.join((await browser.evaluate('document.body.innerText')).split())[:300]}")
        if actors:
            await browser.open(f"{url}/#/actors")  # a fresh load: the cookie, not the page's state, signs it in
            listed = await browser.wait_for(f"!{has_dialog} && document.querySelectorAll('tbody tr').length > 0", 60)
            check(listed, "... and its Actors page lists the trials' actors")
            # Ray lists a trial's actor before it has started it; the picture shows them running when the sweep's
            # pace allows (no check)
            await browser.wait_for("document.body.innerText.includes('ALIVE')", 60)
        path = await browser.screenshot(folder / "ray-dashboard.png")
        check(path.stat().st_size > 10_000, f"screenshot of Ray's dashboard opened by the printed link: {path}")


async def browse(urls: dict[str, str], ray_url: str, study_id: int | None, folder: Path, check: Checks) -> None:
    """Both pages in headless Chromium, as a person opens them: Ray's by the printed link, optuna-dashboard's
    trial list; a screenshot of each into ``folder``."""
    await browse_ray(urls["Ray dashboard"], ray_url, folder, check, actors=True)
    if study_id is None:
        return
    async with Browser(width=1280, height=800) as browser:
        await browser.open(f"{urls['optuna-dashboard']}/dashboard/studies/{study_id}/trials")
        listed = await browser.wait_for("document.body.innerText.includes('Trial 0')", 60)
        check(listed, "optuna-dashboard's trial page lists the study's trials")
        # the picture reads better with a finished trial's values in it; no check: the sweep's pace decides
        await browser.wait_for("document.body.innerText.includes('Complete')", 120)
        path = await browser.screenshot(folder / "optuna-dashboard.png")
        check(path.stat().st_size > 10_000, f"screenshot of optuna-dashboard: {path}")


def run_browser(coroutine: Coroutine[Any, Any, None], check: Checks) -> None:
    """A browser check, skipped (with a line saying so) where there is no chromium."""
    if chromium_path() is None:
        coroutine.close()
        print("skip the browser checks: no chromium on PATH (apt-get install chromium)")
        return
    try:
        asyncio.run(coroutine)
    except BrowserError as error:
        check(False, f"headless Chromium: {error}")


def read_urls(process: subprocess.Popen, names: int, deadline: float, prefix: str) -> tuple[dict[str, str], str]:
    """The first ``names`` dashboard URLs ``process`` prints (by name), and the Ray dashboard's own URL."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    urls: dict[str, str] = {}
    ray_url = ""
    while len(urls) < names and time.monotonic() < deadline and process.poll() is None:
        try:
            line = lines.get(timeout=1).rstrip()
        except queue.Empty:
            continue
        print(f"  {prefix}: {line}")
        if match := URL_LINE.match(line):
            urls[match.group(1)] = match.group(2)
            if target := RAY_TARGET.search(line):
                ray_url = target.group(1)
    return urls, ray_url


def ray_only(args: argparse.Namespace, check: Checks, deadline: float) -> None:
    """Ray's line alone: Ray started as the commands start it, without a sweep (see the module docstring)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ray = subprocess.Popen([sys.executable, "-c", HOLD_RAY], cwd=REPO, env=env, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        urls, ray_url = read_urls(ray, 1, deadline, "ray")
        if check("Ray dashboard" in urls and bool(ray_url), "Ray printed its dashboard line with a sign-in link"):
            token = check_ray(ray_url, check)
            check_link(urls["Ray dashboard"], ray_url, token, check)
            if args.screenshots:
                run_browser(browse_ray(urls["Ray dashboard"], ray_url, args.screenshots, check, actors=False), check)
    finally:
        ray.stdin.close()  # start_ray's process ends, and Ray with it
        try:
            ray.wait(timeout=60)
        except subprocess.TimeoutExpired:
            ray.kill()
            ray.wait()


def sweep_checks(args: argparse.Namespace, check: Checks, deadline: float) -> None:
    """Both dashboards of a small synthetic sweep with --dashboard (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "study.sweep", str(REPO / "search_spaces" / "sasrec.yaml"), "--dashboard",
                   "--num-cpus", "2", "--set", f"name={STUDY_NAME}", "--set", "dataset.name=synthetic",
                   "--set", f"storage={tmp}/results", "--set", "budget.num_samples=4", "--set", "budget.max_epochs=2",
                   "--set", "fixed.measure_efficiency=false"]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE"}
        # the URL lines come on stdout with the sweep's other notes (stderr would carry only what went wrong)
        sweep = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        urls, ray_url = read_urls(sweep, 2, deadline, "sweep")
        printed = f"the sweep printed both dashboard URLs ({', '.join(urls) or 'none'})"
        if check(len(urls) == 2 and bool(ray_url), printed):
            token = check_ray(ray_url, check)
            check_link(urls["Ray dashboard"], ray_url, token, check)
            study_id = check_optuna(urls["optuna-dashboard"], check, deadline)
            if args.screenshots:
                run_browser(browse(urls, ray_url, study_id, args.screenshots, check), check)
        try:
            check(sweep.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, "the sweep finished (exit code 0)")
        except subprocess.TimeoutExpired:
            sweep.kill()
            check(False, "the sweep finished in time")
        if "optuna-dashboard" in urls:
            try:
                urllib.request.urlopen(f"{urls['optuna-dashboard']}/api/studies", timeout=5)
                check(False, "optuna-dashboard stopped with the sweep")
            except OSError:
                check(True, "optuna-dashboard stopped with the sweep")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--screenshots", type=Path, help="folder for PNG screenshots of the dashboards")
    parser.add_argument("--ray-only", action="store_true",
                        help="check Ray's dashboard line alone, on Ray started as the commands do (no sweep)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds the whole check may take")
    args = parser.parse_args(argv)
    check = Checks()
    deadline = time.monotonic() + args.timeout
    (ray_only if args.ray_only else sweep_checks)(args, check, deadline)
    print("all checks passed" if not check.failed else f"{check.failed} check(s) failed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
