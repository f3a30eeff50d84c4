"""``benchmarks`` is a folder of scripts run from the repository root (``python -m benchmarks.NAME``), not an
installed package: make the root importable however pytest was started."""

import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])
if REPO not in sys.path:
    sys.path.insert(0, REPO)
