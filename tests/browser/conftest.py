"""The browser checks are modules of ``tests.browser`` run from the repository root
(``python -m tests.browser.dashboards_check``): make the root importable however pytest was started."""

import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])
if REPO not in sys.path:
    sys.path.insert(0, REPO)
