"""A sweep's outputs in ``results/<study>/``: one durable record per finished trial, and the tables built from them.

* ``trials/<trial_id>.json``: written by the driver the moment a trial ends (ok, stopped or failed). These records
  are the source of truth: a study killed with SIGKILL keeps every trial that finished, and a resumed trial whose
  record exists is replayed instead of retrained, unless the record says its process was lost
  (:func:`study.search.records.lost_process`): a trial killed with its study trains again on ``--resume``.
* ``trials.parquet`` + ``trials.csv``: one row per trial (schema of :mod:`study.train.results` plus the sweep's columns:
  ``trial_id``, ``stop_reason``, ``step_time_ms``, ``config.<key>`` for every setting, ``extra.<key>`` for each model
  statistic of the best epoch (ELASTIC's ``extra.expert_usage_rate`` ...), ``optuna_number``).
* ``history.parquet``: one row per trial and epoch (``train_energy_j``: that epoch's training energy).
* ``trials/<trial_id>.history.jsonl``: the epochs of a trial still running, one line each, appended as they are
  reported and deleted once its record is written. A sweep killed mid-trial and resumed keeps the epochs before
  the kill: the resumed trial continues from its checkpoint, and an epoch run again past that checkpoint
  replaces the line it had. A recorded trial that trains again (:func:`study.search.records.trains_on`) starts
  from its record's epochs, and the lines of a continuation that was killed in turn go after them.

Every file is written to a temporary name in the same folder, then ``os.replace``d into place, so a reader (or a
crash) never sees half a file (:mod:`study.search.records` reads and writes the files of ``trials/``).
:class:`SweepRecorder` is the Tune callback on the driver that writes them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
from ray.tune import Callback

import models
from study.analysis import pareto
from study.layout import RECORDS_DIR, partial_history_path, table_paths
from study.schema import SCHEMA, SCHEMA_KEY, schema_of, upgrade_settings
from study.search.budget import StudyClock
from study.search.console import WIDTH, abbreviations, fit
from study.search.records import (
    STATUS_FAILED,
    STATUS_OK,
    STUDY_TIME_BUDGET,
    append_history,
    atomic_write,
    lost_process,
    read_partial_histories,
    read_records,
    trains_on,
    write_record,
)
from study.storage import Mirror
from study.train.config import TrainConfig, split_settings
from study.train.objectives import resolve_auto_settings
from study.train.padding import trims_padding
from study.train.results import json_safe, protocol_of
from study.train.settings import resolve_patience

EPOCH_KEYS = ("epoch", "train_loss", "best_epoch", "epoch_time_s", "throughput", "wall_time_s", "train_energy_j")
def is_epoch_key(key: str) -> bool:
    return key in EPOCH_KEYS or key.startswith(("valid_", "best_valid_", "test_"))


def history_row(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if is_epoch_key(k)}


def stop_reason(status: str, last: dict[str, Any], settings: dict[str, Any], *, scheduler_stop: bool,
                study_budget_over: bool) -> str:
    """Why a trial ended: error, max_epochs, patience, stopped (by ASHA), study_time_budget or trial_time_budget.

    ``scheduler_stop`` is Tune's ``done`` flag on the last result, which Tune sets when the scheduler stops a
    trial (a trial that returns on its own ends with an unflagged last result).
    """
    if status == STATUS_FAILED:
        return "error"
    epoch, best_epoch = int(last.get("epoch", 0)), int(last.get("best_epoch", 0))
    max_epochs = int(settings.get("max_epochs", TrainConfig.max_epochs))
    patience = resolve_patience(last.get("objective", ""), settings.get("patience"))
    if last and epoch >= max_epochs:
        return "max_epochs"
    if last and patience and epoch - best_epoch >= patience:
        return "patience"
    if scheduler_stop:
        return "stopped"
    if study_budget_over:
        return STUDY_TIME_BUDGET
    if last and float(settings.get("time_budget_s", 0) or 0) > 0:
        return "trial_time_budget"
    return "stopped"


def build_row(context: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """One trials.parquet row from a record: the :mod:`study.train.results` schema, built from the last epoch report.

    The last report carries the best-validation metrics (``best_valid_*``), the test metrics of that epoch, and
    the efficiency figures, so trials stopped early by ASHA get the same columns as trials that ran to the end.
    """
    last = record.get("last_report") or {}
    # a record of an earlier schema (a resumed study's) means its keys as they were then
    settings = upgrade_settings(context["model"], {**context["base_settings"], **record.get("config", {})},
                                schema_of(record))
    try:
        train_cfg, hparams = split_settings(context["model"], settings)
        if last.get("device"):  # what ran: the trainer resolves `auto` settings for its device
            train_cfg = replace(train_cfg, trim_padding=trims_padding(train_cfg.trim_padding, last["device"],
                                                                      train_cfg.compile))
        if last.get("objective"):  # and the windows for its objective and window length
            max_len = {**context["model_defaults"], **hparams}.get(
                "max_len", models.model_class(context["model"]).config_class.max_len)
            train_cfg = resolve_auto_settings(train_cfg, last["objective"], max_len, context["model"])
        config = {**context["model_defaults"], **hparams, **train_cfg.__dict__}
    except Exception:  # a trial can fail on its config; its row still records what was asked for
        train_cfg, config = TrainConfig(), dict(settings)
    objective = last.get("objective") or train_cfg.objective
    meta = context["dataset_meta"]
    row: dict[str, Any] = {
        "trial_id": record["trial_id"],
        SCHEMA_KEY: SCHEMA,
        "study": context["study"],
        "model": context["model"],
        "dataset": meta.get("name"),
        "dataset_hash": meta.get("content_hash"),
        "synthetic": bool(meta.get("synthetic", False)),
        **protocol_of(train_cfg, objective),
    }
    for key, value in last.items():
        if key.startswith("best_valid_"):
            row["valid_" + key[len("best_valid_"):]] = value
    for key, value in last.items():
        if key.startswith("test_"):
            row[key] = value
    row.update({
        "best_epoch": last.get("best_epoch"),
        "epochs_run": last.get("epoch", 0),
        "pop_ndcg@10": last.get("pop_ndcg@10"),
        "params": last.get("params"),
        "peak_mem_mb": last.get("peak_mem_mb"),
        "peak_mem_method": last.get("peak_mem_method"),
        "epoch_time_s": last.get("median_epoch_time_s"),
        "train_throughput": last.get("train_throughput"),
        "step_time_ms": last.get("step_time_ms"),
        "infer_ms_p50": last.get("infer_ms_p50"),
        "infer_ms_p95": last.get("infer_ms_p95"),
        "train_energy_j_per_epoch": last.get("train_energy_j_per_epoch"),
        "infer_energy_j_per_1k": last.get("infer_energy_j_per_1k"),
        "energy_method": last.get("energy_method"),
        "device": last.get("device"),
        "gpu": str(last.get("device") or "").startswith("cuda"),
        "kernel_path": last.get("kernel_path"),
        "node_id": last.get("trial_node_id"),  # the Ray node the trial ran on (None for a trial that never reported)
        "node_ip": last.get("trial_node_ip"),
        "seed": train_cfg.seed,
        "wall_time_s": last.get("trial_compute_s"),
        "status": record["status"],
        "error": record.get("error", ""),
        "stop_reason": record.get("stop_reason"),
        "extra": last.get("extra_json", "{}"),
        "config": json.dumps(json_safe(config), sort_keys=True),
    })
    row.update({f"config.{key}": value for key, value in sorted(config.items())})
    row.update({f"extra.{key}": value for key, value in sorted(_extra(row["extra"]).items())})
    row["optuna_number"] = record.get("optuna_number")
    return json_safe(row)


def _extra(text: Any) -> dict[str, Any]:
    """The ``extra`` JSON of a report (the best epoch's model statistics) as a mapping; malformed gives none."""
    try:
        extra = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return {}
    return extra if isinstance(extra, dict) else {}


def write_tables(out_dir: Path, context: dict[str, Any], records: dict[str, dict[str, Any]],
                 rows: dict[str, dict[str, Any]] | None = None) -> dict[str, Path]:
    """(Re)write trials.parquet, trials.csv and history.parquet from every record, atomically.

    ``rows`` holds rows built earlier by trial id (:class:`SweepRecorder` builds each trial's row once, not once
    per rewrite); a record without one gets its row built here.
    """
    rows = rows or {}
    ordered = sorted(records.values(), key=lambda r: (r.get("started_at") or 0, r["trial_id"]))
    trials = pd.DataFrame([rows.get(record["trial_id"]) or build_row(context, record) for record in ordered])
    history = pd.DataFrame([{"trial_id": record["trial_id"], **row}
                            for record in ordered for row in record.get("history", [])])
    if history.empty:
        history = pd.DataFrame({"trial_id": pd.Series(dtype=str), "epoch": pd.Series(dtype="int64")})
    paths = table_paths(out_dir)
    atomic_write(paths["trials"], lambda out: trials.to_parquet(out, index=False))
    atomic_write(paths["trials_csv"], lambda out: out.write(trials.to_csv(index=False).encode()))
    atomic_write(paths["history"], lambda out: history.to_parquet(out, index=False))
    return paths


# ---------------------------------------------------------------------------------------------------------------
# The summary printed at the end


def summary(trials: pd.DataFrame, objectives: dict[str, str], searched: list[str], paths: dict[str, Path],
            top: int = 5) -> str:
    """A few lines: trial counts, the best trials (or the Pareto front), and where the files are."""
    lines = []
    counts = trials["status"].value_counts().to_dict() if not trials.empty else {}
    reasons = trials["stop_reason"].value_counts().to_dict() if not trials.empty else {}
    early = [f"{reasons[r]} {what}" for r, what in (("stopped", "stopped early by ASHA"),
                                                    (STUDY_TIME_BUDGET, "stopped by the study's time budget"))
             if reasons.get(r)]
    early_text = f" ({', '.join(early)})" if early else ""
    failures = counts.get(STATUS_FAILED, 0)
    lines.append(f"{len(trials)} trials: {counts.get(STATUS_OK, 0)} ok{early_text}, {failures} failed")
    metrics = list(objectives)
    ok = trials[trials["status"] == STATUS_OK].dropna(subset=[m for m in metrics if m in trials]) \
        if not trials.empty else trials
    if not ok.empty and all(m in ok for m in metrics):
        if len(metrics) == 1:
            metric = metrics[0]
            best = ok.sort_values(metric, ascending=objectives[metric] == "min").head(top)
            lines.append(f"best by {metric} ({objectives[metric]}):")
        else:
            best = pareto.pareto_front(ok, objectives)  # sorted best-first by the first objective
            lines.append(f"Pareto front over {', '.join(f'{m} ({d})' for m, d in objectives.items())}:")
        short = abbreviations(searched)  # the console's names; trials.parquet has every column in full
        shown = ["trial_id", *metrics, "test_ndcg@10", "epochs_run", *[f"config.{k}" for k in searched]]
        table = best[[c for c in dict.fromkeys(shown) if c in best]].rename(
            columns=lambda c: short.get(c.removeprefix("config."), c.removeprefix("config.")))
        lines.append(table.to_string(index=False, float_format=lambda v: f"{v:.4g}", line_width=WIDTH))
        legend = ", ".join(f"{name}={key}" for key, name in short.items() if name != key)
        if legend:
            lines.append(fit(f"keys: {legend}"))
        lines.append("(test_ metrics are those of each trial's best-validation epoch; never used for selection)")
    failed = trials[trials["status"] == STATUS_FAILED] if not trials.empty else trials
    for _, row in failed.head(top).iterrows():
        lines.append(fit(f"failed {row['trial_id']}: {str(row['error']).splitlines()[0] if row['error'] else ''}"))
    lines += files_lines(paths)
    return "\n".join(lines)


def files_lines(paths: dict[str, Path]) -> list[str]:
    """``files in FOLDER:`` and one name per line (the folders ``trials/`` and ``tune/`` with a slash)."""
    folder = Path(next(iter(paths.values()))).parent if paths else Path(".")
    lines = [f"files in {folder}:"]
    for path in paths.values():
        path = Path(path)
        if not path.exists():  # e.g. trials/ of a study stopped before any trial reported
            continue
        name = str(path.relative_to(folder)) if path.is_relative_to(folder) else str(path)
        lines.append(f"  {name}/" if path.is_dir() else f"  {name}")
    return lines


def _error_message(trial: Any) -> str:
    """The original exception of a failed trial as ``Type: message`` (Ray wraps it in its own errors).

    Read from the trial's local error files: when the driver's callback runs, Tune has written them there but
    not yet synced them to the storage path that ``Trial.get_pickled_error`` reads.
    """
    import ray.cloudpickle

    error = None
    try:
        with open(trial.pickled_error_file, "rb") as handle:
            error = ray.cloudpickle.load(handle)
    except Exception:  # missing or not unpicklable on the driver: fall back to the text trace
        pass
    seen = 0
    while error is not None and getattr(error, "cause", None) is not None and seen < 5:
        error, seen = error.cause, seen + 1
    if error is not None:
        text = str(error).strip().splitlines()
        return f"{type(error).__name__}: {text[-1] if text else ''}"[:2000]
    try:
        trace = Path(trial.error_file).read_text().strip().splitlines()
    except (OSError, TypeError):
        trace = []
    return trace[-1][:2000] if trace else "unknown error (see the trial's error.txt under tune/)"


class TableWriter:
    """Rewrites a sweep's tables on a thread of its own, so that Tune's loop never waits for them.

    The loop that calls :class:`SweepRecorder` also starts the next trial, so a rewrite there (pandas, parquet,
    csv, fsync, a mirror upload) delays that start. :meth:`request` returns at once; requests made while a
    rewrite runs are served by one more rewrite of the state at that time. :meth:`close` waits for the last one.
    An error in a rewrite is raised by the next request or by close, as it was raised by the trial's end before.
    """

    def __init__(self, write: Callable[[], None]):
        self._write = write
        self._changed = threading.Condition()
        self._pending = self._busy = self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="sweep-tables", daemon=True)
        self._thread.start()

    def request(self) -> None:
        with self._changed:
            self._raise_error()
            self._pending = True
            self._changed.notify_all()

    def close(self) -> None:
        """Wait until every requested rewrite is written, then end the thread."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join()
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _serve(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending or self._closing)
                if not self._pending:
                    return
                self._pending, self._busy = False, True
            try:
                self._write()
            except BaseException as error:  # handed to the loop's thread, which raises it
                self._error = error
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()


class SweepRecorder(Callback):
    """Driver-side: keeps each trial's epoch history and writes its record the moment it ends.

    The record is written before the callback returns; the tables are rewritten from all records by a
    :class:`TableWriter` and are complete when the experiment ends (``on_experiment_end``).
    """

    def __init__(self, out_dir: str, context: dict[str, Any], mirror: Mirror | None = None,
                 clock: StudyClock | None = None):
        self.out_dir, self.context, self.mirror = out_dir, context, mirror
        self.clock = clock  # the study's time budget; a resumed study's recorder gets this session's clock
        self.history: dict[str, list[dict]] = {}
        self.last: dict[str, dict] = {}
        self.records: dict[str, dict] = {}
        self._start_session()

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks with the experiment (tuner.pkl): the thread, its lock and the rows are this
        # session's, rebuilt by setup() after a restore
        state = self.__dict__.copy()
        for name in ("_rows", "_lock", "_writer"):
            state.pop(name, None)
        return state

    def _start_session(self) -> None:
        self._rows: dict[str, dict[str, Any]] = {}  # each record's trials row, built once
        self._lock = threading.Lock()  # records and rows: changed by Tune's loop, read by the table writer
        self._writer: TableWriter | None = None

    def setup(self, **info: Any) -> None:
        # Also runs after Tuner.restore, which unpickles this callback: start from the records on disk.
        self._start_session()
        self.last = {}
        self.history = read_partial_histories(Path(self.out_dir) / RECORDS_DIR)
        self.records = read_records(Path(self.out_dir) / RECORDS_DIR)
        for trial_id, record in self.records.items():
            if trains_on(record):
                # it trains again, from its last checkpoint if it has one: keep the epochs it reported, as for a
                # trial that was running when the study was killed. A continuation killed in its turn left only
                # its own epochs in the partial history, so those go after the record's.
                history = record["history"]
                for row in self.history.get(trial_id, []):
                    history = append_history(history, row)
                self.history[trial_id] = history
        self._writer = TableWriter(self._write_tables)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.last[trial.trial_id] = dict(result)
        if not result.get("replayed"):
            row = json_safe(history_row(result))
            self.history[trial.trial_id] = append_history(self.history.get(trial.trial_id, []), row)
            records_dir = Path(self.out_dir) / RECORDS_DIR
            records_dir.mkdir(parents=True, exist_ok=True)
            with partial_history_path(records_dir, trial.trial_id).open("a") as out:
                out.write(json.dumps(row) + "\n")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record(trial, STATUS_OK, "")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record(trial, STATUS_FAILED, _error_message(trial))

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        try:
            if self.clock is not None and self.clock.spent:
                # the time budget ended the study under these trials (study.search.budget): each one's last
                # report holds its best epoch so far, which is a result; a --resume given more time continues them
                for trial in trials:
                    if trial.trial_id in self.last:
                        self._record(trial, STATUS_OK, "")
        finally:  # a record that fails to write must not leave the table thread running in the driver
            self.close()

    def close(self) -> None:
        """Wait for the last table rewrite and end its thread: the tables are complete when this returns."""
        if getattr(self, "_writer", None) is not None:
            writer, self._writer = self._writer, None
            writer.close()

    def _record(self, trial: Any, status: str, error: str) -> None:
        last = self.last.pop(trial.trial_id, None) or {}
        earlier = self.records.get(trial.trial_id)
        if not last and earlier is not None and status == STATUS_OK:
            return  # no new epoch since its record (a resumed trial the budget stopped again at once)
        if last.get("replayed") or (status == STATUS_FAILED and earlier is not None
                                    and earlier["status"] == STATUS_FAILED and not lost_process(earlier)):
            return  # recorded before an interruption and replayed now (a lost process trains again instead)
        if status == STATUS_FAILED and earlier is not None and earlier["status"] == STATUS_OK:
            # a failure never replaces a result: e.g. a study killed with SIGKILL saved its experiment while a
            # trial was still running, the trial then finished, and on --resume Tune fails to restore it from a
            # checkpoint that no longer exists; a budget-stopped trial whose continuation fails keeps its result
            return
        settings = {**self.context["base_settings"], **trial.config}
        report = {k: v for k, v in last.items() if k not in _TUNE_BOOKKEEPING}
        record = {
            "trial_id": trial.trial_id,
            SCHEMA_KEY: SCHEMA,
            "status": status,
            "error": error,
            "stop_reason": stop_reason(status, report, settings, scheduler_stop=bool(last.get("done")),
                                       study_budget_over=self.clock is not None and self.clock.spent),
            "config": dict(trial.config),
            "started_at": report.get("trial_started_at"),
            "finished_at": time.time(),
            "last_report": report,
            "history": self.history.pop(trial.trial_id, []),
        }
        write_record(Path(self.out_dir) / RECORDS_DIR, record)
        partial_history_path(Path(self.out_dir) / RECORDS_DIR, trial.trial_id).unlink(missing_ok=True)
        # rows of records read at setup (a resumed study) are built at the first trial's end, then one per trial
        rows = {trial_id: build_row(self.context, old) for trial_id, old in self.records.items()
                if trial_id not in self._rows and trial_id != trial.trial_id}
        rows[trial.trial_id] = build_row(self.context, record)  # a retried trial's new record replaces its row
        with self._lock:
            self.records[trial.trial_id] = record
            self._rows.update(rows)
        if self._writer is None:  # no writer: before setup() or after the experiment ended
            self._write_tables()
        else:
            self._writer.request()

    def _write_tables(self) -> None:
        with self._lock:
            records, rows = dict(self.records), dict(self._rows)
        write_tables(Path(self.out_dir), self.context, records, rows)
        if self.mirror is not None:
            self.mirror.push()  # throttled; the run ends with a full push


_TUNE_BOOKKEEPING = {"done", "training_iteration", "trial_id", "date", "timestamp", "time_this_iter_s",
                     "time_total_s", "hostname", "node_ip", "time_since_restore", "iterations_since_restore",
                     "checkpoint_dir_name", "config", "should_checkpoint"}

