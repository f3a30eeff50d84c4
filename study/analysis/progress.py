"""Where a sweep stands while its trials run, from the files its recorder writes under ``trials/``
(:mod:`study.search.recorder`): a record per finished trial (``<id>.json``) and the epochs of each trial that has
not finished (``<id>.history.jsonl``).

A trial with epoch lines and no record yet is running, or was running when its sweep was stopped (``--resume``
continues it): the files look the same either way, so the report says both. The report covers the finished trials
(``trials.parquet``); with none finished there is nothing to report, and :func:`still_running` says which trials
run and how far they got instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from study.analysis.console import text_table
from study.analysis.runs import RECORDS_DIR, TRIALS_FILE
from study.errors import UserError

# The validation figure shown for a running trial: the one the default objectives select on, else the first there.
PREFERRED_METRIC = "best_valid_ndcg@10"


@dataclass(frozen=True)
class Unfinished:
    """A trial's last reported epoch: its best epoch so far and that epoch's validation figure."""

    trial_id: str
    epoch: int | None
    best_epoch: int | None
    metric: str | None  # e.g. valid_ndcg@10
    best: float | None
    wall_time_s: float | None


def _last_epoch(trial_id: str, rows: list[dict]) -> Unfinished:
    last = rows[-1] if rows else {}
    metric = PREFERRED_METRIC if PREFERRED_METRIC in last else next(
        (k for k in last if k.startswith("best_valid_")), None)
    return Unfinished(trial_id=trial_id, epoch=last.get("epoch"), best_epoch=last.get("best_epoch"),
                      metric=metric.removeprefix("best_") if metric else None,
                      best=last.get(metric) if metric else None, wall_time_s=last.get("wall_time_s"))


def unfinished_trials(folder: Path) -> list[Unfinished]:
    """The trials of ``folder`` with epochs and no record yet, by trial id."""
    from study.search.records import read_partial_histories

    histories = read_partial_histories(Path(folder) / RECORDS_DIR)
    return [_last_epoch(trial_id, rows) for trial_id, rows in sorted(histories.items())]


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}"


def unfinished_table(trials: list[Unfinished]) -> list[str]:
    """The unfinished trials as console lines: id, epoch, best epoch, its validation figure, training time."""
    rows = [{"trial": t.trial_id, "epoch": "–" if t.epoch is None else str(t.epoch),
             "best epoch": "–" if t.best_epoch is None else str(t.best_epoch),
             "best validation": "–" if t.best is None else f"{t.metric} {t.best:.4f}",
             "time (h:mm)": _clock(t.wall_time_s)} for t in trials]
    return text_table(rows, shrink="trial")


def describe(trials: list[Unfinished], limit: int = 3) -> str:
    """``a at epoch 12, b at epoch 3 and 4 more``: the first few unfinished trials, for one line of text."""
    shown = [f"{t.trial_id} at epoch {t.epoch if t.epoch is not None else '–'}" for t in trials[:limit]]
    more = f" and {len(trials) - limit} more" if len(trials) > limit else ""
    return ", ".join(shown) + more


class StudyRunning(UserError):
    """A study none of whose trials has finished: nothing to report. ``table``: its unfinished trials, as lines."""

    def __init__(self, message: str, table: list[str]) -> None:
        super().__init__(message)
        self.table = table


def still_running(folder: Path) -> UserError:
    """The error for a folder without ``trials.parquet`` whose ``trials/`` holds files (see the module docstring)."""
    from study.search.records import read_records

    folder = Path(folder)
    finished = read_records(folder / RECORDS_DIR)
    trials = unfinished_trials(folder)
    if finished:  # the table follows each record within moments, unless the sweep was killed in between
        return UserError(f"{folder}: {len(finished)} trial(s) finished but {TRIALS_FILE} is not written yet; try "
                         "again in a moment (a sweep stopped before writing it rewrites it with --resume)")
    if not trials:
        return UserError(f"{folder}: no {TRIALS_FILE} and no trial records; not a study's results folder "
                         "(run python -m study.sweep first)")
    return StudyRunning(f"{folder}: still running: none of its {len(trials)} trial(s) has finished, so there is "
                        f"nothing to report yet ({describe(trials)}); report again once a trial has finished "
                        "(a stopped sweep continues with --resume)",
                        ["trials not finished (running, or stopped with their sweep):",
                         *unfinished_table(trials)])
