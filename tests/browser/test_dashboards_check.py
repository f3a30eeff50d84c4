"""The printed way into Ray's dashboard works in one step in a real browser: ``tests.browser.dashboards_check
--ray-only`` starts Ray as the study commands do (token authentication, the dashboard on 127.0.0.1), opens the
printed link in a fresh headless Chromium and finds the dashboard past its token dialog.

Marked ``browser``: not part of the default run (``python -m pytest -m browser`` runs it), and skipped where no
chromium is on PATH (``apt-get install chromium``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser.browser import chromium_path

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(chromium_path() is None, reason="no chromium on PATH (apt-get install chromium)")]


def test_the_printed_link_opens_rays_dashboard_past_its_token_dialog(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "tests.browser.dashboards_check", "--ray-only", "--screenshots",
                           str(tmp_path), "--timeout", "240"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "ok   the printed link, opened as it is, lands on Ray's dashboard" in done.stdout
    assert (tmp_path / "ray-dashboard.png").stat().st_size > 10_000
