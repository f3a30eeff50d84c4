"""The resumable result log of the accuracy benchmarks: one JSON line per finished cell, appended as it finishes.

A rerun reads the log and skips the cells already in it, so a benchmark interrupted after hours loses one cell.
"""

from __future__ import annotations

import json
from pathlib import Path

from study.train.results import to_json_line


def load_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as lines:
        return [json.loads(line) for line in lines if line.strip()]


def append_row(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(to_json_line(row) + "\n")
