"""The durable files of a sweep's trials, under ``results/<study>/trials/`` (the layout is described in
:mod:`study.search.recorder`, which writes them): one JSON record per finished trial, and the per-epoch lines of a
trial still running. Every file is written to a temporary name in the same folder, then ``os.replace``d into
place, so a reader (or a crash) never sees half a file.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from study.layout import PARTIAL_HISTORY_SUFFIX, record_path
from study.train.results import json_safe

STATUS_OK, STATUS_FAILED = "ok", "failed"
STUDY_TIME_BUDGET = "study_time_budget"  # the stop reason of a trial the study's time budget ended
# Ray's errors for a trial whose worker process or node went away rather than one its own code raised: a study
# stopped with SIGTERM or a lost node ends its running trials with these. They say nothing about the configuration,
# so such a trial trains again on --resume instead of being replayed as failed.
LOST_PROCESS_ERRORS = frozenset({"ActorDiedError", "ActorUnavailableError", "RayActorError", "WorkerCrashedError",
                                 "NodeDiedError", "OwnerDiedError", "LocalRayletDiedError"})


def lost_process(record: dict[str, Any]) -> bool:
    """Whether a failed record failed because its process was lost (see ``LOST_PROCESS_ERRORS``)."""
    error = record.get("error") or ""
    return record["status"] == STATUS_FAILED and error.split(":", 1)[0].strip() in LOST_PROCESS_ERRORS


def trains_on(record: dict[str, Any]) -> bool:
    """Whether a recorded trial trains again on ``--resume`` rather than being replayed: its process was lost, or
    the study's time budget stopped it (its record holds the result so far; a resume given more time goes on)."""
    return lost_process(record) or record.get("stop_reason") == STUDY_TIME_BUDGET


def atomic_write(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """Write through ``write(file)`` into a temporary sibling, fsync, then rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda out: out.write(text.encode()))




def append_history(history: list[dict[str, Any]], row: dict[str, Any]) -> list[dict[str, Any]]:
    """``history`` with ``row`` added; an epoch that runs again (resumed from an earlier checkpoint) replaces the
    rows from that epoch on, so no epoch appears twice."""
    epoch = row.get("epoch")
    kept = [r for r in history if epoch is None or r.get("epoch") is None or r["epoch"] < epoch]
    return [*kept, row]


def read_partial_histories(records_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The epochs of every trial that was running when the sweep stopped (see the module docstring)."""
    histories: dict[str, list[dict[str, Any]]] = {}
    if Path(records_dir).is_dir():
        for path in sorted(Path(records_dir).glob(f"*{PARTIAL_HISTORY_SUFFIX}")):
            rows: list[dict[str, Any]] = []
            for line in path.read_text().splitlines():
                try:
                    rows = append_history(rows, json.loads(line))
                except json.JSONDecodeError:
                    break  # a line cut by the kill: everything before it is whole
            histories[path.name[:-len(PARTIAL_HISTORY_SUFFIX)]] = rows
    return histories


def write_record(records_dir: Path, record: dict[str, Any]) -> None:
    atomic_write_text(record_path(records_dir, record["trial_id"]), json.dumps(json_safe(record), indent=1) + "\n")


def read_records(records_dir: Path) -> dict[str, dict[str, Any]]:
    records = {}
    if records_dir.is_dir():
        for path in sorted(records_dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # only complete files exist under their final name; anything else is not ours
            records[record["trial_id"]] = record
    return records
