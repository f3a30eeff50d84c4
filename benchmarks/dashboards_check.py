"""Check that the URLs ``python -m study.sweep STUDY --dashboard`` prints work as printed.

    python -m benchmarks.dashboards_check [--screenshots DIR]

Runs a small synthetic sweep with ``--dashboard`` (a minute or two on 2 cores) and, while it runs:

* Ray's dashboard (the ``Ray dashboard: URL`` line): an API call without the token is refused (401), the same call
  with ``Authorization: Bearer <output of ray get-auth-token>`` answers 200, and ``POST /api/authenticate`` (what
  the page's token dialog sends) sets the ``ray-authentication-token`` cookie, which then opens the API as well;
* optuna-dashboard (the ``optuna-dashboard: URL`` line): ``/api/studies`` lists the study and its trials appear;
* with ``--screenshots DIR`` and a ``chromium`` on PATH, headless Chromium (over the DevTools protocol, see
  :mod:`benchmarks.browser`) opens both pages as a person would: Ray's first shows its token dialog; with the
  ``ray-authentication-token`` cookie the dialog leaves behind it shows the dashboard, whose Actors page lists the
  trials' actors; optuna-dashboard's Trials page lists the trials. A screenshot of each goes into DIR.

After the sweep, optuna-dashboard must have stopped. Exits 0 when every check passed, 1 otherwise; each check
prints one ``ok``/``FAIL`` line.
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
from pathlib import Path

from benchmarks.browser import Browser, BrowserError, Checks, chromium_path

REPO = Path(__file__).resolve().parents[1]
TOKEN_DIALOG = "Authentication Token Required"  # the title of the dialog Ray's page shows without the cookie
TOKEN_COOKIE = "ray-authentication-token"
URL_LINE = re.compile(r"^(Ray dashboard|optuna-dashboard): (http://\S+)")
STUDY_NAME = "dashboards-check"


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


async def browse(urls: dict[str, str], token: str, study_id: int | None, folder: Path, check: Checks) -> None:
    """Both pages in headless Chromium, as a person opens them: Ray's past its token page, optuna-dashboard's
    trial list; a screenshot of each into ``folder``."""
    ray_url, optuna_url = urls["Ray dashboard"], urls["optuna-dashboard"]
    has_dialog = f"document.body.innerText.includes({json.dumps(TOKEN_DIALOG)})"
    async with Browser(width=1280, height=800) as browser:
        await browser.open(ray_url)
        check(await browser.wait_for(has_dialog), f"a browser without the cookie sees Ray's {TOKEN_DIALOG!r} dialog")
        # what the dialog leaves behind once the token is pasted (POST /api/authenticate answers with this cookie)
        await browser.set_cookie(TOKEN_COOKIE, token, ray_url)
        # a fresh load: a change of the #fragment alone would keep the page, and its dialog, as they are
        await browser.open("about:blank")
        await browser.open(f"{ray_url}/#/actors")
        shown = await browser.wait_for(f"!{has_dialog} && document.querySelectorAll('tbody tr').length > 0", 60)
        if not check(shown, "with the ray-authentication-token cookie Ray's dashboard opens past the token dialog, "
                            "and its Actors page lists the trials' actors"):
            print(f"     the page reads: {' '.join((await browser.evaluate('document.body.innerText')).split())[:300]}")
        # Ray lists a trial's actor before it has started it; the picture shows them running when the sweep's
        # pace allows (no check)
        await browser.wait_for("document.body.innerText.includes('ALIVE')", 60)
        path = await browser.screenshot(folder / "ray-dashboard.png")
        check(path.stat().st_size > 10_000, f"screenshot of Ray's dashboard after authentication: {path}")
        if study_id is None:
            return
        await browser.open(f"{optuna_url}/dashboard/studies/{study_id}/trials")
        listed = await browser.wait_for("document.body.innerText.includes('Trial 0')", 60)
        check(listed, "optuna-dashboard's trial page lists the study's trials")
        # the picture reads better with a finished trial's values in it; no check: the sweep's pace decides
        await browser.wait_for("document.body.innerText.includes('Complete')", 120)
        path = await browser.screenshot(folder / "optuna-dashboard.png")
        check(path.stat().st_size > 10_000, f"screenshot of optuna-dashboard: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--screenshots", type=Path, help="folder for PNG screenshots of both dashboards")
    parser.add_argument("--timeout", type=float, default=600, help="seconds the whole check may take")
    args = parser.parse_args()
    check = Checks()
    deadline = time.monotonic() + args.timeout
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "study.sweep", str(REPO / "search_spaces" / "sasrec.yaml"), "--dashboard",
                   "--num-cpus", "2", "--set", f"name={STUDY_NAME}", "--set", "dataset.name=synthetic",
                   "--set", f"storage={tmp}/results", "--set", "budget.num_samples=4", "--set", "budget.max_epochs=2",
                   "--set", "fixed.measure_efficiency=false"]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE"}
        # the URL lines come on stdout with the sweep's other notes (stderr would carry only what went wrong)
        sweep = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in sweep.stdout], daemon=True).start()
        urls: dict[str, str] = {}
        while len(urls) < 2 and time.monotonic() < deadline and sweep.poll() is None:
            try:
                line = lines.get(timeout=1).rstrip()
            except queue.Empty:
                continue
            print(f"  sweep: {line}")
            if match := URL_LINE.match(line):
                urls[match.group(1)] = match.group(2)
        if check(len(urls) == 2, f"the sweep printed both dashboard URLs ({', '.join(urls) or 'none'})"):
            token = check_ray(urls["Ray dashboard"], check)
            study_id = check_optuna(urls["optuna-dashboard"], check, deadline)
            if args.screenshots:
                if chromium_path() is None:
                    print("skip the browser checks: no chromium on PATH (apt-get install chromium)")
                else:
                    try:
                        asyncio.run(browse(urls, token, study_id, args.screenshots, check))
                    except BrowserError as error:
                        check(False, f"headless Chromium: {error}")
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
    print("all checks passed" if not check.failed else f"{check.failed} check(s) failed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
