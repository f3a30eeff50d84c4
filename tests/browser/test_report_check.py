"""``report.html`` reads well in a real browser: ``tests.browser.report_check --make`` builds a report from two tiny
synthetic studies and checks it in headless Chromium at 1400 px (nothing wider than the page, numbers rounded).

Marked ``browser``: not part of the default run (``python -m pytest -m browser`` runs it), and skipped where no
chromium is on PATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser.browser import chromium_path

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(chromium_path() is None, reason="no chromium on PATH (apt-get install chromium)")]


def test_a_made_report_has_no_sideways_scroll_and_rounded_numbers(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SEQREC_DATA": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "tests.browser.report_check", "--make", "--screenshot",
                           str(tmp_path / "report.png")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "FAIL" not in done.stdout and (tmp_path / "report.png").stat().st_size > 0
