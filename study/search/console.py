"""What a sweep or a replicate batch prints while its trials run: short lines that fit 120 columns.

Tune's own tables show every searched key at full name and width, plus paths and resources, and grow past a
terminal's width; the full figures are in ``trials.parquet`` / ``history.parquet`` anyway. :class:`StatusReporter`
(a Tune ``ProgressReporter``) prints instead

* once: the searched keys' abbreviations (``keys: hs=hidden_size, nl=num_layers``), when any key is abbreviated;
* a line per trial when it ends: its id, outcome, epochs and objectives, and its searched values (and its
  seed, when the trial's config sets one: a replicate);
* a status line at most every ``every_s`` seconds while something changed, and at least every ``progress_s``
  seconds while trials run: elapsed time, trial counts by state, the best objective so far; the at-least-once
  line is followed by one per running trial (its epoch and its best objective so far), so a sweep of long
  epochs still shows that it moves;
* once, when the trials' median epoch takes over ``SLOW_FACTOR`` times the driver's estimate (a busy machine):
  the measured epoch time and what the study's epochs then cost.

:class:`TuneMessages` keeps Tune's own messages about failed and interrupted runs off the console.
"""

from __future__ import annotations

import logging
import statistics
import textwrap
import time
from collections.abc import Callable
from typing import Any

WIDTH = 120
ABBREVIATE_OVER = 8  # key names this long or longer are abbreviated in the console lines
PROGRESS_S = 60.0  # the longest a running sweep goes without a line
SLOW_FACTOR = 2.0  # epochs this many times slower than estimated are worth a warning


def abbreviations(keys: list[str]) -> dict[str, str]:
    """A short, unique name per key: the initials of its ``_``-separated words for long keys, else the key.

    ``hidden_size`` → ``hs``, ``num_layers`` → ``nl``, ``lr`` → ``lr``; a clash keeps the full names of the keys
    involved, so every short name means one key.
    """
    short = {}
    for key in keys:
        words = [w for w in key.replace(".", "_").split("_") if w]
        short[key] = "".join(w[0] for w in words) if len(key) >= ABBREVIATE_OVER and len(words) > 1 else key
    taken: dict[str, int] = {}
    for name in short.values():
        taken[name] = taken.get(name, 0) + 1
    return {key: name if taken[name] == 1 or name == key else key for key, name in short.items()}


def fit(line: str, width: int = WIDTH) -> str:
    """``line`` cut to ``width`` columns (an ellipsis marks the cut)."""
    return line if len(line) <= width else line[: width - 1] + "…"


def format_value(value: Any) -> str:
    """A searched value or a metric, short: 4 significant digits for floats."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}"


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _trial_id(trial: Any) -> str:
    return str(getattr(trial, "trial_id", trial))


class StatusReporter:
    """A Tune ``ProgressReporter`` printing the lines of the module docstring.

    ``objectives`` maps each objective's Tune result key to its display name and direction (``max``/``min``);
    ``keys`` are the searched keys (the trial's config keys shown).
    """

    def __init__(self, objectives: dict[str, tuple[str, str]], keys: list[str], every_s: float = 30.0,
                 print_fn: Callable[[str], Any] | None = None, expected_epoch_s: float | None = None,
                 progress_s: float = PROGRESS_S, budget_line: Callable[[float], str | None] | None = None) -> None:
        self.objectives, self.keys, self.every_s, self.progress_s = objectives, list(keys), every_s, progress_s
        self.expected_epoch_s = expected_epoch_s  # the driver's estimate (cost line), for the slow-epoch warning
        self.budget_line = budget_line  # the study's time against its budget, for a given epoch time
        self._slow_said = False
        self.short = abbreviations(self.keys)
        # None = the print of the moment: Tune pickles the reporter with the experiment, and a stored builtin
        # print fails to pickle once a library has wrapped it
        self._print_fn = print_fn
        self._start = time.time()
        self._total: int | None = None
        self._finished: set[str] = set()
        self._last_counts: tuple | None = None
        self._last_time = 0.0
        self._legend_shown = False

    def _print(self, line: str) -> None:
        (self._print_fn or print)(line)

    # the ProgressReporter interface (duck-typed: Tune calls these three)
    def setup(self, start_time: float | None = None, total_samples: int | None = None, metric: str | None = None,
              mode: str | None = None, **kwargs: Any) -> None:
        self._start = start_time or time.time()
        self._total = total_samples

    def should_report(self, trials: list[Any], done: bool = False) -> bool:
        return True  # report() decides what is worth a line

    def report(self, trials: list[Any], done: bool, *sys_info: str) -> None:
        if not self._legend_shown:
            self._legend_shown = True
            legend = ", ".join(f"{short}={key}" for key, short in self.short.items() if short != key)
            if legend:
                self._print(fit(f"keys: {legend}"))
        for trial in trials:
            if trial.status in ("TERMINATED", "ERROR") and _trial_id(trial) not in self._finished:
                self._finished.add(_trial_id(trial))
                self._print(self.trial_line(trial))
        counts = self._counts(trials)
        now = time.time()
        quiet_too_long = bool(self._last_time) and now - self._last_time >= self.progress_s  # (not at the start)
        if done or quiet_too_long or (counts != self._last_counts and now - self._last_time >= self.every_s):
            self._last_counts, self._last_time = counts, now
            self._print(self.status_line(trials, now))
            if quiet_too_long and not done:
                for trial in trials:
                    if trial.status == "RUNNING":
                        self._print(self.progress_line(trial))
        self._warn_if_slow(trials)

    def progress_line(self, trial: Any) -> str:
        """``  6852f146 epoch 4  best valid_ndcg@10 0.0215`` (or ``no epoch yet``) for a running trial."""
        result = getattr(trial, "last_result", None) or {}
        if "epoch" not in result:
            return f"  {_trial_id(trial)} no epoch yet"
        best = "  ".join(f"best {name} {format_value(result[key])}" for key, (name, _) in self.objectives.items()
                         if key in result)
        return fit(f"  {_trial_id(trial)} epoch {result['epoch']}  {best}".rstrip())

    def _warn_if_slow(self, trials: list[Any]) -> None:
        if self._slow_said or not self.expected_epoch_s:
            return
        times = [float(t.last_result["median_epoch_time_s"]) for t in trials
                       if isinstance((getattr(t, "last_result", None) or {}).get("median_epoch_time_s"), (int, float))]
        if not times:
            return
        measured = statistics.median(times)
        if measured > SLOW_FACTOR * self.expected_epoch_s:
            self._slow_said = True
            self._print(fit(f"epochs run {measured / self.expected_epoch_s:.1f}x slower than estimated "
                            f"({_duration(measured)} measured vs ~{_duration(self.expected_epoch_s)}): a busy machine"))
            again = self.budget_line(measured) if self.budget_line else None
            if again:  # one paragraph again, wrapped as the budget line is
                self._print(textwrap.fill("at the measured speed, " + " ".join(again.split()), width=WIDTH,
                                          subsequent_indent="  "))

    def _counts(self, trials: list[Any]) -> tuple:
        states: dict[str, int] = {}
        for trial in trials:
            states[trial.status] = states.get(trial.status, 0) + 1
        return tuple(sorted(states.items()))

    def trial_line(self, trial: Any) -> str:
        """``trial 6852f146 done  epochs 3  valid_ndcg@10 0.0215 | lr=0.0052 hs=64``."""
        result = getattr(trial, "last_result", None) or {}
        outcome = "failed" if trial.status == "ERROR" or result.get("status") == "failed" else "done"
        parts = [f"trial {_trial_id(trial)} {outcome:<6}"]
        if "epoch" in result:
            parts.append(f"epochs {result['epoch']}")
        for key, (name, _) in self.objectives.items():
            if key in result:
                parts.append(f"{name} {format_value(result[key])}")
        config = getattr(trial, "config", None) or {}
        shown = dict(self.short)
        if "seed" in config:  # a replicate's trial differs from its source by the seed alone
            shown.setdefault("seed", "seed")
        values = " ".join(f"{name}={format_value(config[key])}" for key, name in shown.items() if key in config)
        return fit("  ".join(parts) + (f" | {values}" if values else ""))

    def status_line(self, trials: list[Any], now: float) -> str:
        """``[0:01:30] trials 3/6: 2 running, 1 done, 0 failed | best valid_ndcg@10 0.0215 (6852f146)``."""
        states = dict(self._counts(trials))
        total = max(self._total or 0, len(trials))
        ended = states.get("TERMINATED", 0) + states.get("ERROR", 0)
        line = (f"[{_clock(now - self._start)}] trials {ended}/{total}: {states.get('RUNNING', 0)} running, "
                f"{states.get('PENDING', 0)} pending, {states.get('TERMINATED', 0)} done, "
                f"{states.get('ERROR', 0)} failed")
        best = self._best(trials)
        return fit(line + (f" | best {best}" if best else ""))

    def _best(self, trials: list[Any]) -> str:
        if len(self.objectives) != 1:
            return ""  # several objectives have a front, not a best: the summary shows it
        (key, (name, mode)), = self.objectives.items()
        scored = [(t.last_result[key], _trial_id(t)) for t in trials
                  if isinstance((getattr(t, "last_result", None) or {}).get(key), (int, float))]
        if not scored:
            return ""
        value, trial = max(scored) if mode == "max" else min(scored)
        return f"{name} {format_value(value)} ({trial})"


class TuneMessages(logging.Filter):
    """Keeps Tune's messages about failed and interrupted runs off the console, noticing the interruption.

    * A failed trial: Tune logs its whole traceback, then "Trials did not complete". The sweep's own records say
      which trial failed and why (``trials/<id>.json``, the summary's failure lines), and the traceback stays in
      the trial's ``error.txt`` under ``tune/``.
    * Ctrl-C: Tune stops the trials, saves the experiment state and returns from ``fit()`` normally, after two
      warnings (one naming ``Tuner.restore``, which is not how this platform resumes). ``interrupted`` records it,
      and the sweep then ends the way any Ctrl-C ends a command (:func:`study.cli.run_command`): one line naming
      ``--resume``, exit code 130.
    * Frequent snapshots: with ``checkpoint.every`` small and short epochs, Tune saves its experiment state at each
      checkpoint (it must, to keep only ``checkpoint.keep`` of them) and warns that this happens often, advising
      settings the study sets on purpose. Likewise its "performance bottleneck" timings of its own loop.
    * The study's time budget: its clock (:mod:`study.search.budget`) stops Tune with the signal Tune reads as
      Ctrl-C, so ``interrupted`` is also set then; the driver tells the two apart by the clock.
    """

    INTERRUPTED = ("Stop signal received", "Experiment has been interrupted", "Training has been interrupted")
    FAILED = ("Trial task failed for trial", "Trials did not complete")
    NOISE = ("Experiment state snapshotting has been triggered multiple times",)
    # Tune times its own loop and warns when a step of it is slow; on a machine whose cores all train trials the
    # driver's loop is slow by design, and the warning advises settings (report less often) the study needs as set
    SLOW_LOOP = "may be a performance bottleneck"
    LOGGERS = ("ray.tune.tune", "ray.tune.execution.tune_controller", "ray.tune.execution.experiment_state",
               "ray.tune.utils.util")

    def __init__(self) -> None:
        super().__init__()
        self.interrupted = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(self.INTERRUPTED):
            self.interrupted = True
            return False
        return not message.startswith(self.FAILED + self.NOISE) and self.SLOW_LOOP not in record.getMessage()

    def __enter__(self) -> TuneMessages:
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)
