"""One sweep per results folder: ``results/<study>/sweep.lock``, held for the whole run.

Two sweeps writing one folder would merge their trials, their Optuna studies and Tune's experiment states into a
study neither of them ran. The lock file is created atomically (``O_EXCL``) before the sweep touches anything else
in the folder and holds the holder's host, process id and start time. A second sweep finds it and stops with one
line naming the holder. A lock whose process is gone (same host, no such process, or a process started after the
lock was taken: the id was reused) is stale: it is taken over, with a line saying so. A lock held on another host
cannot be checked from here and is respected.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from study.errors import UserError
from study.layout import LOCK_FILE


def _process_started(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), or None when there is no such process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # exists, owned by someone else
        pass
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # no psutil, or it vanished meanwhile: alive as far as we can tell
        return 0.0


def stale(holder: dict[str, Any]) -> bool:
    """Whether a lock's holder is certainly gone: on this host, and its process no longer the one that locked."""
    if holder.get("host") != socket.gethostname():
        return False
    started = _process_started(int(holder.get("pid", -1)))
    return started is None or started > float(holder.get("started_at", 0)) + 1.0


def _describe(holder: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started_at", 0))))
    return f"process {holder.get('pid')} on {holder.get('host')} since {when}"


def _try_create(path: Path, holder: dict[str, Any]) -> bool:
    try:
        handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(handle, "w") as out:
        out.write(json.dumps(holder) + "\n")
    return True


def _read_holder(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # being written this instant, or not ours: treated as held


def in_use_by(out: Path) -> str | None:
    """Who holds ``out``'s lock, when a sweep may still be writing the folder (a live holder, one on another host,
    or one writing its lock this instant); None when nothing does."""
    path = Path(out) / LOCK_FILE
    if not path.is_file():
        return None
    held = _read_holder(path)
    if held and stale(held):
        return None
    return _describe(held) if held else "a sweep starting this instant"


@contextlib.contextmanager
def study_lock(out: Path, name: str) -> Iterator[None]:
    """Hold ``out``'s lock while the block runs; a folder another live sweep holds is a :class:`UserError`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": time.time()}
    if not _try_create(path, holder):
        who = in_use_by(out)
        if who:
            raise UserError(f"{out} is in use by another sweep of study '{name}' ({who}); wait for it to end, or "
                            "stop it, before running this one")
        held = _read_holder(path)
        print(f"taking over the lock of {out}: its holder ({_describe(held)}) is no longer running", flush=True)
        path.unlink(missing_ok=True)
        if not _try_create(path, holder):
            raise UserError(f"{out} is in use by another sweep of study '{name}' ({_describe(_read_holder(path))})")
    try:
        yield
    finally:
        if _read_holder(path).get("pid") == holder["pid"]:
            path.unlink(missing_ok=True)
