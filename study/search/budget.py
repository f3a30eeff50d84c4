"""The study's budget: a clock that ends the study the way Ctrl-C does, what a resume may add, and the estimate
of what the study will cost, measured before its first trial.

Tune's own ``time_budget_s`` marks every running trial TERMINATED without ending it: no callback hears of those
trials, so their epochs never became records, Optuna kept them as failed, and ``--resume`` had nothing left to
continue. :class:`StudyClock` is a Tune stopper that instead, once the budget is spent, sends the driver the
signal Tune handles as "stop and save" (SIGUSR1, Tune's own alternative to Ctrl-C):

* Tune saves its experiment state with those trials still running, so a ``--resume`` given more time continues
  them from their last checkpoints and runs the samples not yet started;
* the recorder writes each of them as a result (``stop_reason: study_time_budget``) from its last report, which
  carries the best epoch so far (:meth:`study.search.recorder.SweepRecorder.on_experiment_end`);
* the driver tells Optuna their values (:func:`study.search.searcher.close_orphans`).

The budget covers the whole study: the seconds spent by earlier sessions are kept in ``clock.json`` and count
against it, so a resumed study gets only what is left (a larger ``budget.time_budget_s`` gives it more).
Where the driver cannot receive a signal (Tune driven from a thread, as on a Ray Client head node), the clock
falls back to Tune's stop-all: the trials are still recorded, but a resume starts no new epochs for them.

A resume may give the study more time or samples, nothing else (:func:`budget_grows`); one whose time is spent
says why in one line (:func:`check_work_left`). Before the first trial, :func:`estimate_study` times an epoch of the
largest configuration (the loader, real batches, validation) and one checkpoint, which set the cost line, the
local checkpoint interval (:meth:`StudyEstimate.checkpoint_every`) and whether the study fits its budget
(:func:`fit_line`).
"""

from __future__ import annotations

import json
import math
import os
import signal
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.tune.stopper import Stopper

from study.errors import UserError
from study.layout import CLOCK_FILE, RECORDS_DIR
from study.search.console import WIDTH
from study.search.records import atomic_write_text, read_records, trains_on
from study.spec.resolved import Study
from study.train.trainer import TrialData

SAVE_EVERY_S = 30.0  # how often the spent time reaches clock.json while the study runs (a kill loses at most this)


def spent_before(out: Path) -> float:
    """Seconds of the time budget that earlier sessions of the study in ``out`` spent."""
    try:
        return float(json.loads((Path(out) / CLOCK_FILE).read_text())["spent_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


class StudyClock(Stopper):
    """Ends the study once ``budget_s`` seconds (0 = no budget) are spent, counting earlier sessions' time."""

    def __init__(self, out: Path, budget_s: float):
        self.out, self.budget_s = str(out), float(budget_s or 0)
        self.earlier_s = spent_before(out)
        self.spent = False  # set once the budget ran out in this session
        self._started: float | None = None
        self._spent_at: float | None = None
        self._saved_at = 0.0

    def __reduce__(self) -> tuple[Any, tuple]:
        # Tune saves its stopper with the experiment state and restores that one on --resume, over the stopper it
        # was given: a clock unpickles as the clock of the session running now, which knows this session's budget
        return _session_clock, ()

    def start_session(self) -> StudyClock:
        """Make this the clock that restored clocks stand for (see ``__reduce__``)."""
        global _SESSION_CLOCK
        _SESSION_CLOCK = self
        return self

    def elapsed(self) -> float:
        """Seconds spent so far: earlier sessions and this one (until the budget ran out: the study's own time)."""
        now = self._spent_at or time.time()
        if self._started is None:
            self._started = now
        return self.earlier_s + now - self._started

    def save(self) -> None:
        atomic_write_text(Path(self.out) / CLOCK_FILE,
                          json.dumps({"spent_s": round(self.elapsed(), 3), "budget_s": self.budget_s}) + "\n")
        self._saved_at = time.time()

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False  # the budget stops the study, never one trial

    def stop_all(self) -> bool:
        elapsed = self.elapsed()
        if time.time() - self._saved_at >= SAVE_EVERY_S:
            self.save()
        if not self.budget_s or elapsed < self.budget_s or self.spent:
            return False
        self.spent, self._spent_at = True, time.time()
        self.save()
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1"):
            os.kill(os.getpid(), signal.SIGUSR1)  # Tune's handler: stop the loop, save the state as it stands
            return False
        return True  # no signal here: Tune ends the trials itself (they are still recorded)


_SESSION_CLOCK: StudyClock | None = None


def _session_clock() -> StudyClock:
    if _SESSION_CLOCK is None:  # read outside a sweep (an experiment state opened by hand): no budget
        return StudyClock(Path("."), 0)
    return _SESSION_CLOCK


def over_budget_line(name: str, out: Path, budget_s: float) -> str | None:
    """Why ``--resume`` of a study whose time budget is spent would do nothing, and how to extend it."""
    spent = spent_before(out)
    if not budget_s or spent < budget_s:
        return None
    return (f"study '{name}' has spent its time budget ({spent:.0f} s of budget.time_budget_s={budget_s:g}); "
            f"to continue it, give it more: --resume --set budget.time_budget_s={int(max(2 * budget_s, spent + 60))}")


def continue_note(name: str, out: Path, budget_s: float) -> str | None:
    """The summary's last words after a session that the budget ended: what a resume needs to continue the trials
    it stopped (also those stopped before their first epoch, which have no record yet)."""
    line = over_budget_line(name, out, budget_s)
    return None if line is None else textwrap.fill(line, width=WIDTH, subsequent_indent="  ")


RESUMABLE_BUDGET = ("time_budget_s", "num_samples")  # what a --resume may raise: the study goes on further


def budget_grows(stored: dict | None, current: dict | None) -> bool:
    """Whether ``current`` is ``stored`` with only more time or samples (no time budget, 0, is the most)."""
    stored, current = stored or {}, current or {}
    if any(stored.get(k) != current.get(k) for k in set(stored) | set(current) if k not in RESUMABLE_BUDGET):
        return False
    old_time, new_time = stored.get("time_budget_s") or 0, current.get("time_budget_s") or 0
    more_time = new_time == 0 or (old_time != 0 and new_time >= old_time)
    return more_time and (current.get("num_samples") or 0) >= (stored.get("num_samples") or 0)


def check_work_left(study: Study, out: Path) -> None:
    """A resume whose time budget is spent stops with one line saying how to give it more; one whose samples have
    all run says so in one line and goes on (it replays the records and writes the tables again)."""
    over = over_budget_line(study.name, out, study.budget.time_budget_s)
    if over:
        raise UserError(over)
    records = read_records(out / RECORDS_DIR)
    done = sum(1 for record in records.values() if not trains_on(record))
    if done >= study.budget.num_samples:
        print(f"study '{study.name}' has run all its budget.num_samples={study.budget.num_samples} trials; to run "
              f"more: --resume --set budget.num_samples={2 * study.budget.num_samples}", flush=True)


CHECKPOINT_SHARE = 0.01  # ``checkpoint.every: auto`` on one machine: checkpoints may cost about this share of the time


@dataclass
class StudyEstimate:
    """What the study's largest configuration costs, measured on the driver before the first trial."""

    text: str  # the cost line for the console
    epoch_s: float  # one training epoch
    checkpoint_s: float  # saving one training state (weights and Adam's two moments) to local disk

    def checkpoint_every(self) -> int:
        """Epochs between checkpoints so that saving costs at most ``CHECKPOINT_SHARE`` of the training time."""
        if not (self.epoch_s > 0 and math.isfinite(self.epoch_s)):
            return 1
        return max(1, math.ceil(self.checkpoint_s / (CHECKPOINT_SHARE * self.epoch_s)))


def fit_line(study: Study, epoch_s: float, concurrency: int) -> str | None:
    """Whether the study fits its time budget, with ``concurrency`` trials at once; None when there is no budget.

    Every trial runs at most ``budget.max_epochs`` epochs, and ASHA lets none stop before its grace period, so the
    study takes between those two bounds (trial start-up and evaluation come on top).
    """
    budget = study.budget.time_budget_s
    if not budget or not (epoch_s > 0 and math.isfinite(epoch_s)):
        return None
    waves = math.ceil(study.budget.num_samples / max(1, concurrency))
    most = waves * study.budget.max_epochs * epoch_s
    least = waves * (study.scheduler.grace_period if study.scheduler else study.budget.max_epochs) * epoch_s
    span = f"~{_minutes(least)}" if least == most else f"~{_minutes(least)} to ~{_minutes(most)}"
    head = f"time budget {_minutes(budget)}; the study's training takes {span} ({concurrency} trials at once)"
    if most <= budget:
        return head + ": it fits"
    samples = max(1, int(budget // (study.budget.max_epochs * epoch_s)) * max(1, concurrency))
    advice = (f"fewer samples (budget.num_samples={samples} would fit), a larger budget "
              f"(budget.time_budget_s={math.ceil(most * 1.2)}), or a shorter max_len")
    verdict = "it will not fit" if least > budget else "it may not fit if ASHA stops few trials"
    return textwrap.fill(f"{head}: {verdict}; {advice}", width=WIDTH, subsequent_indent="  ")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def estimate_study(study: Study, data: TrialData) -> StudyEstimate:
    """What an epoch and a checkpoint of the study's largest configuration cost.

    "Largest" takes every searched key at its largest candidate (the last one for non-numeric choices); the steps
    are timed here on the driver with the CPU threads one trial gets.
    """
    import torch

    import models
    from study.train.config import split_settings
    from study.train.step import TrainStep
    from study.train.trainer import epoch_cost, resolve_device, with_user_count

    point = {}
    for key, param in study.search.items():
        candidates = param.candidates()
        numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in candidates)
        point[key] = max(candidates) if numeric else candidates[-1]
    settings = study.settings(point)
    train_cfg, hparams = split_settings(study.model, settings)
    max_len = hparams.get("max_len", models.model_class(study.model).config_class.max_len)
    trial_data = data.cropped(max_len)
    hparams = with_user_count(study.model, {**hparams, "num_items": data.num_items, "max_len": max_len}, data.meta)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, math.floor(study.resources.cpu)))
    try:
        step = TrainStep(models.build(study.model, **hparams), train_cfg, item_popularity=trial_data.item_popularity)
        # the step's settings, `auto` ones resolved: the windows an epoch cuts depend on the objective
        cost = epoch_cost(step, trial_data, step.train, resolve_device("cpu" if study.resources.gpu == 0 else "auto"))
        if study.dataset["stream"]:  # the driver holds the first users' windows only: scale to every user's
            cost = cost.scaled(data.meta["num_users"] / max(1, len(data.train)))
        checkpoint_s = _time_checkpoint(step.model)
    finally:
        torch.set_num_threads(threads)
    shown = ", ".join(f"{key}={value}" for key, value in point.items() if key != "lr") or "the fixed settings"
    shown = textwrap.shorten(shown, width=100, placeholder=" ...")
    text = f"largest configuration ({shown}), {study.budget.num_samples} trials:\n" + cost.line(study.budget.max_epochs)
    return StudyEstimate(text, cost.epoch_s, checkpoint_s)


def _time_checkpoint(model: Any) -> float:
    """Seconds to write a training state of ``model`` to local disk: its weights and Adam's two moments."""
    import tempfile

    import torch

    weights = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    state = {"model": weights, **{f"moment{i}": {k: v.clone() for k, v in weights.items()} for i in (1, 2)}}
    with tempfile.TemporaryDirectory(prefix="seqrec-checkpoint-cost-") as folder:
        started = time.perf_counter()
        torch.save(state, os.path.join(folder, "state.pt"))
        return time.perf_counter() - started
