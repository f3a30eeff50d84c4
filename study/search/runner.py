"""Running a validated :class:`~study.spec.study_file.Study` on Ray Tune with Optuna, ASHA and Ray Data: orchestration.

Data flow (driver → trials → driver):

1. the dataset is prepared once on the driver (``study.data.prepare``) for the longest ``max_len`` any trial may
   use; the trial data (:class:`~study.train.trainer.TrialData`: training windows and evaluation arrays) goes to
   every trial through the object store once (``tune.with_parameters``), so a trial on another node never needs the
   driver's disk nor runs a dataset recipe, and a one-process trial shuffles it exactly as ``study.train`` does;
   data-parallel trials get the training windows as a materialized Ray Dataset, split into one shard per worker;
2. Optuna suggests each trial's searched keys and ASHA stops weak trials (:mod:`study.search.searcher`);
3. each trial trains one configuration and reports every epoch (:mod:`study.search.trial`; data-parallel under
   ``resources.workers_per_trial > 1``: :mod:`study.search.data_parallel`);
4. the driver's :class:`~study.search.recorder.SweepRecorder` writes a durable record the moment a trial ends,
   and rebuilds the tables (:mod:`study.search.recorder`).

Selection uses validation only: a ``valid_…`` objective is read at the trial's best-validation epoch
(``best_valid_…`` in the reports); ``test_…`` figures are recorded, never optimised.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import models
from study.cluster import check_fits, is_client, start_ray
from study.errors import UserError
from study.layout import (
    ENVIRONMENT_FILE,
    LOCK_FILE,
    MODELS_DIR,
    OPTUNA_FILE,
    RECORDS_DIR,
    STUDY_FILE,
    TUNE_DIR,
    table_paths,
)
from study.search.budget import (
    StudyClock,
    StudyEstimate,
    budget_grows,
    check_work_left,
    continue_note,
    estimate_study,
    fit_line,
)
from study.search.console import TuneMessages
from study.search.dashboards import OptunaDashboard
from study.search.lock import study_lock
from study.search.recorder import build_row, summary, write_tables
from study.search.records import atomic_write_text, read_records
from study.search.searcher import close_orphans
from study.search.trial import TrialPlan
from study.search.tuner import make_trainable, make_tuner, remove_unkept_checkpoints, restore_tuner
from study.search.windows import (
    STREAM_SAMPLE_ROWS,
    STREAM_SHUFFLE_ROWS,
    STREAM_SPARE_CPUS,
    materialized_dataset,
    streamed_dataset,
    training_windows,
)
from study.spec.checks import energy_line
from study.spec.resolved import Study
from study.storage import Mirror
from study.train.results import json_safe
from study.train.trainer import TrialData

__all__ = ["run_study"]


def _prepare_data(study: Study) -> tuple[Path, TrialData]:
    from study.data import prepare

    dataset = study.dataset
    max_len = max(study.max_len_candidates())
    try:
        path = prepare(dataset["name"], source=dataset["source"], max_len=max_len, kcore=dataset["kcore"],
                       progress=True, **dataset["options"])
        # a streaming study holds only a sample of the training windows, for the cost and memory probes
        return path, TrialData.from_prepared(path, max_len, STREAM_SAMPLE_ROWS if dataset["stream"] else None)
    except UserError as error:
        where = f"{study.source}: " if study.source else ""
        raise UserError(f"{where}dataset '{dataset['name']}': {error}") from None



def _concurrency(study: Study) -> int:
    """Trials at once: as many as the connected cluster fits (a UserError up front if none does, e.g. no GPU)."""
    spare = STREAM_SPARE_CPUS if study.dataset["stream"] else 0.0
    fits = check_fits(study.resources.cpu, study.resources.gpu, study.resources.workers_per_trial, spare_cpu=spare)
    wanted = study.resources.max_concurrent
    return fits if wanted == "auto" else min(int(wanted), fits)


def _row_context(study: Study, meta: dict[str, Any]) -> dict[str, Any]:
    defaults = models.model_class(study.model).config_class().to_dict()
    defaults.pop("num_items", None)
    return {"study": study.name, "model": study.model, "model_defaults": defaults,
            "dataset_meta": {k: meta.get(k) for k in ("name", "content_hash", "synthetic")},
            "base_settings": _base_settings(study), "study_time_budget_s": study.budget.time_budget_s}


def _base_settings(study: Study) -> dict[str, Any]:
    """The settings every trial shares; a trial uses as many threads as CPUs it holds (at least one)."""
    settings = study.settings()
    settings.setdefault("num_threads", max(1, math.floor(study.resources.cpu)))
    return settings


def _study_file_text(study: Study) -> str:
    """The resolved study, headed by where it came from and by what a shortened budget changed in it."""
    adapted = f"# adapted: {study.adaptation}\n" if study.adaptation else ""
    return f"# resolved from {study.source}\n{adapted}{study.to_yaml()}"


def setting_changes(key: str, stored: Any, given: Any) -> list[str]:
    """``key.sub: stored -> given`` for each setting under ``key`` that differs (``key`` alone when it is no
    mapping), so a refused resume names what the command changed: ``budget.time_budget_s: 400 -> 170``."""
    if isinstance(stored, dict) and isinstance(given, dict):
        return [line for sub in sorted(set(stored) | set(given), key=str) if stored.get(sub) != given.get(sub)
                for line in setting_changes(f"{key}.{sub}", stored.get(sub), given.get(sub))]
    return [f"{key}: {stored!r} -> {given!r}"]


def _check_resume(study: Study, out: Path, resume: bool) -> None:
    import yaml
    from ray.tune import Tuner

    tune_path = out / TUNE_DIR
    restorable = tune_path.exists() and Tuner.can_restore(str(tune_path))
    if resume:
        if not restorable:
            raise UserError(f"nothing to resume in {out}: no Ray Tune experiment state there; run without --resume")
        stored = yaml.safe_load((out / STUDY_FILE).read_text()) if (out / STUDY_FILE).exists() else {}
        current = study.to_dict()
        more = budget_grows(stored.get("budget"), current.get("budget"))
        # the sampler's defaults follow the number of samples, but a resumed study keeps the sampler it had
        changed = sorted(k for k in set(stored) | set(current) if k != "storage" and stored.get(k) != current.get(k)
                         and not (more and k in ("budget", "searcher")))
        if changed:
            differences = "; ".join(line for key in changed for line in setting_changes(key, stored.get(key),
                                                                                       current.get(key)))
            raise UserError(f"{out / STUDY_FILE} differs from this study in: {differences}. --resume continues "
                            "the same study (start a new one under another name or storage), and may only give it "
                            "more time or samples (budget.time_budget_s, budget.num_samples)")
        check_work_left(study, out)
        if stored.get("budget") != current.get("budget"):
            atomic_write_text(out / STUDY_FILE, f"# resolved from {study.source}\n# resumed with budget "
                              f"{current['budget']}\n" + yaml.safe_dump({**stored, "budget": current["budget"]},
                                                                        sort_keys=False))
    elif restorable or (out / RECORDS_DIR).exists():
        raise UserError(f"{out} already holds study '{study.name}'; pass --resume to continue it, or choose another "
                        "name or storage to start a new one")
    elif (out / OPTUNA_FILE).exists():
        # left by a start that never got as far as a trial: reusing it would feed its stale trials to the sampler
        (out / OPTUNA_FILE).unlink()


def _write_environment(out: Path) -> None:
    import ray

    from study.environment import collect

    env = collect(ray.cluster_resources())
    path = out / ENVIRONMENT_FILE
    if path.exists():  # a resumed study keeps what the earlier sessions ran on
        try:
            previous = json.loads(path.read_text())
            env["previous_sessions"] = previous.pop("previous_sessions", []) + [previous]
        except (OSError, json.JSONDecodeError):
            pass
    atomic_write_text(path, json.dumps(json_safe(env), indent=2) + "\n")



def run_study(study: Study, *, resume: bool = False, dashboard: bool = False, address: str = "local",
              num_cpus: int | None = None, quiet: bool = False, points: list[dict[str, Any]] | None = None,
              storage: Path | None = None) -> dict[str, Any]:
    """Run (or resume) a study; returns the output paths and the trials table.

    ``points`` (with ``storage``, a folder of their own inside the study's folder) runs exactly these trial
    configs instead of searching: the same trainable, resources and recorder, but no Optuna, no ASHA and no study
    time budget, so every point trains its full budget. :mod:`study.replicate` reruns chosen configurations under
    new seeds this way.

    With ``study.storage_uri`` the study's folder is mirrored there (:mod:`study.storage`). With a ``ray://``
    address the Tune driver runs on the cluster's head node (see :func:`_run_on_head`), which needs such a URI.
    """
    out = Path(storage).resolve() if storage is not None else study.storage  # Tune wants an absolute path
    with study_lock(out, study.name):  # before anything reads or writes the folder
        try:
            return _run_locked(study, out, resume=resume, dashboard=dashboard, address=address, num_cpus=num_cpus,
                               quiet=quiet, points=points, storage=storage)
        finally:
            with contextlib.suppress(OSError):  # a start that failed before writing anything leaves no folder
                if [p.name for p in out.iterdir()] == [LOCK_FILE]:
                    (out / LOCK_FILE).unlink()
                    out.rmdir()


def _run_locked(study: Study, out: Path, *, resume: bool, dashboard: bool, address: str, num_cpus: int | None,
                quiet: bool, points: list[dict[str, Any]] | None, storage: Path | None) -> dict[str, Any]:
    mirror = Mirror(study.storage, study.storage_uri)
    if mirror.uri and storage is None:
        if resume:
            fetched = mirror.pull()
            if fetched:
                print(f"fetched {fetched} file(s) of the study from {mirror.uri}")
        elif mirror.holds(STUDY_FILE):
            raise UserError(f"{mirror.uri} already holds study '{study.name}'; pass --resume to continue it, or "
                            "choose another name or storage to start a new one")
    _check_resume(study, out, resume)
    path, base_data = _prepare_data(study)  # before Ray: a missing dataset fails fast, with the recipe's advice
    estimate = None
    if points is None:  # measured before Ray starts, so that no trial shares the cores with it
        estimate = estimate_study(study, base_data)
        if not quiet:
            print(estimate.text, flush=True)
    if is_client(address):
        if not mirror.uri:
            raise UserError(f"with --address {address} the study is driven from the cluster's head node, which "
                            f"cannot write to this machine's {study.storage}: set storage: to a URI both reach "
                            "(s3://bucket/prefix, gs://bucket/prefix, or file:///path on a shared file system)")
        return _run_on_head(study, mirror, out, base_data, training_windows(path, study.dataset["stream"]),
                            resume=resume, dashboard=dashboard, address=address, quiet=quiet, points=points,
                            estimate=estimate)
    started_ray = start_ray(address, dashboard=dashboard, num_cpus=num_cpus, quiet=quiet)
    try:
        fit = _drive(study, out, mirror, base_data, training_windows(path, study.dataset["stream"]), resume=resume,
                     quiet=quiet, points=points, dashboard=dashboard, on_cluster=address != "local", estimate=estimate)
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    return _outcome(study, out, mirror, fit, points)


def _drive(study: Study, out: Path, mirror: Mirror, base_data: TrialData, train_table: Any, *, resume: bool,
           quiet: bool, points: list[dict[str, Any]] | None, dashboard: bool = False,
           on_cluster: bool = False, estimate: StudyEstimate | None = None) -> dict[str, Any]:
    """Runs the trials on the connected Ray and writes ``out`` (records, tables); returns the fit's timing and
    whether the time budget ended it.

    With ``dashboard`` a search also gets optuna-dashboard on its ``optuna.db`` while the trials run. The phases:
    claim the study folder, plan the trials, build (or restore) the Tuner, fit, write the tables.
    """
    concurrency = _claim(study, out, mirror, resume)
    train_ds, shuffle_rows = _training_dataset(study, train_table)
    storage_url = f"sqlite:///{out / OPTUNA_FILE}"
    clock = StudyClock(out, 0 if points is not None else study.budget.time_budget_s).start_session()
    checkpoint_every, max_failures = study.checkpoint.resolve(on_cluster, estimate.checkpoint_every()
                                                              if estimate else 0)
    if estimate is not None and not quiet:
        line = fit_line(study, estimate.epoch_s, concurrency)
        if line:
            print(line, flush=True)
    if not quiet and not on_cluster:  # a cluster's trials run on its nodes, whose counters this machine cannot see
        line = energy_line(study, concurrency)
        if line:
            print(line, flush=True)
    plan = _trial_plan(study, out, shuffle_rows, resume=resume, on_cluster=on_cluster,
                       checkpoint_every=checkpoint_every)
    trainable = make_trainable(study, plan, base_data, train_ds)
    # The study is read from its own records, never from Tune's ResultGrid, whose per-trial files may be missing
    # (a trial killed mid-write) or looked up under a study folder's earlier path; its warnings would only confuse
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    if resume:
        tuner = restore_tuner(study, out, mirror, trainable, storage_url, clock, quiet, estimate, concurrency)
    else:
        tuner = make_tuner(study, out, mirror, trainable, storage_url, clock,
                           row_context=_row_context(study, base_data.meta), base_settings=_base_settings(study),
                           points=points, quiet=quiet, estimate=estimate, concurrency=concurrency,
                           max_failures=max_failures)
    board = OptunaDashboard(storage_url).start() if dashboard and points is None else None
    if board is not None:
        print(board.line(), flush=True)
    fit_started = time.time()
    results = _fit(tuner, clock, mirror, board)
    fit_wall = time.time() - fit_started
    _write_results(study, out, mirror, base_data.meta, storage_url, points)
    # housekeeping once the results are safe: each trial keeps only the checkpoints the study asks for
    remove_unkept_checkpoints(results)
    return {"fit_wall_s": fit_wall, "fit_started_at": fit_started, "meta": base_data.meta,
            "budget_spent": clock.spent}


def _claim(study: Study, out: Path, mirror: Mirror, resume: bool) -> int:
    """The study folder written (study file, environment) and claimed in storage before the first trial; returns
    how many trials run at once."""
    out.mkdir(parents=True, exist_ok=True)
    if not resume:  # (a resume that raises the budget rewrites it in _check_resume)
        atomic_write_text(out / STUDY_FILE, _study_file_text(study))
    concurrency = _concurrency(study)  # before anything is scheduled: a request no node can meet would hang
    _write_environment(out)
    mirror.push(force=True)  # the study is claimed in storage before its first trial
    return concurrency


def _training_dataset(study: Study, train_table: Any) -> tuple[Any, int]:
    """The Ray Dataset of training windows for the trials that read one (``None`` otherwise), and the rows a
    trial's shuffle mixes at once."""
    # Ray Data shards the windows of data-parallel trials and streams them to the trials of a streaming study; a
    # one-process trial otherwise shuffles the windows it already holds
    stream = study.dataset["stream"]
    if stream:
        train_ds, shuffle_rows = streamed_dataset(train_table), STREAM_SHUFFLE_ROWS
    else:
        train_ds = materialized_dataset(train_table) if study.resources.workers_per_trial > 1 else None
        shuffle_rows = max(1, train_table.num_rows)
    return train_ds, shuffle_rows


def _trial_plan(study: Study, out: Path, shuffle_rows: int, *, resume: bool, on_cluster: bool,
                checkpoint_every: int) -> TrialPlan:
    """What every trial is given: its settings, resources, checkpoints, where it records, and (on a resume) the
    records of the trials that already ended."""
    return TrialPlan(model=study.model, base_settings=_base_settings(study),
                     threads=max(1, math.floor(study.resources.cpu)),
                     measure_efficiency=bool(study.settings().get("measure_efficiency", True)),
                     records_dir=str(out / RECORDS_DIR), shuffle_rows=shuffle_rows, stream=study.dataset["stream"],
                     recorded=read_records(out / RECORDS_DIR) if resume else None,
                     workers=study.resources.workers_per_trial, cpu=study.resources.cpu,
                     gpu=study.resources.gpu, checkpoint_every=checkpoint_every, checkpoint_keep=study.checkpoint.keep,
                     models_dir=None if on_cluster else str(out / MODELS_DIR))


def _fit(tuner: Any, clock: StudyClock, mirror: Mirror, board: OptunaDashboard | None) -> Any:
    """The trials' run. A Ctrl-C or a crash first pushes what finished to storage, so that ``--resume`` works from
    anywhere; the clock is saved and the dashboard stopped however the run ends. Returns Tune's result grid."""
    try:
        with TuneMessages() as tune_messages:
            results = tuner.fit()
        # Tune caught a Ctrl-C (or the clock's signal), saved its state and returned as if the study ended
        if tune_messages.interrupted and not clock.spent:
            raise KeyboardInterrupt
    except BaseException:  # Ctrl-C or a crash: what finished goes to storage, for a --resume anywhere
        with contextlib.suppress(Exception):
            mirror.push(force=True)
        raise
    finally:
        clock.save()
        if board is not None:
            board.stop()
    return results


def _write_results(study: Study, out: Path, mirror: Mirror, meta: dict[str, Any], storage_url: str,
                   points: list[dict[str, Any]] | None) -> None:
    """The tables, rebuilt from the trials' records, and pushed to storage. A search's Optuna trials that Tune
    never finished are closed first, and each record learns its Optuna trial number."""
    records = read_records(out / RECORDS_DIR)
    numbers = close_orphans(storage_url, study.name, records, list(study.objectives)) if points is None else {}
    for trial_id, number in numbers.items():
        if trial_id in records:
            records[trial_id]["optuna_number"] = number
    write_tables(out, _row_context(study, meta), records)
    mirror.push(force=True)


def _outcome(study: Study, out: Path, mirror: Mirror, fit: dict[str, Any],
             points: list[dict[str, Any]] | None) -> dict[str, Any]:
    import pandas as pd

    paths = table_paths(out)
    paths.update(study=out / STUDY_FILE, environment=out / ENVIRONMENT_FILE)
    if points is None:
        paths["optuna"] = out / OPTUNA_FILE
    paths.update(records=out / RECORDS_DIR, tune=out / TUNE_DIR)
    trials = pd.read_parquet(paths["trials"])
    text = summary(trials, study.objectives, list(study.search), paths)
    note = continue_note(study.name, out, study.budget.time_budget_s) if fit.get("budget_spent") else None
    if note:
        text += "\n" + note
    if mirror.uri:
        text += f"\nmirrored to {mirror.uri}"
    return {"paths": paths, "trials": trials, "fit_wall_s": fit["fit_wall_s"], "fit_started_at": fit["fit_started_at"],
            "summary": text, "storage_uri": mirror.uri}


def _run_on_head(study: Study, mirror: Mirror, out: Path, base_data: TrialData, train_table: Any, *, resume: bool,
                 dashboard: bool, address: str, quiet: bool, points: list[dict[str, Any]] | None,
                 estimate: StudyEstimate | None = None) -> dict[str, Any]:
    """Ray Client (``ray://``): drive the study from a task on the head node, then fetch its results here.

    Under Ray Client, Tune would run its loop on the head node anyway (callbacks, the Optuna searcher and its
    SQLite file included), where this machine's paths mean nothing. So the whole driver runs there, in a
    working copy of its own that it mirrors to the study's URI; this machine sends it the prepared data (the
    head needs neither the raw files nor internet access) and finally pulls the URI into its own working copy.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    relative = out.relative_to(study.storage).as_posix() if out != study.storage else ""
    started_ray = start_ray(address, dashboard=dashboard, quiet=quiet)
    try:
        # the head: long-lived, and usually kept free of trials; any node would do (soft), the URI holds the study
        head = next((node["NodeID"] for node in ray.nodes()
                     if node["Alive"] and "node:__internal_head__" in node["Resources"]), None)
        driver = ray.remote(num_cpus=0, max_retries=0)(_head_driver)
        if head is not None:
            driver = driver.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=True))
        running = driver.remote(study, mirror.uri, relative, base_data, train_table, resume=resume, quiet=quiet,
                                points=points, estimate=estimate)
        try:
            fit = ray.get(running)
        except KeyboardInterrupt:  # the driver runs on the head: stop it too, or it would go on without us
            ray.cancel(running, force=True)
            raise
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, UserError):  # e.g. a GPU asked of a cluster without one: an error line, exit 2
            raise UserError(str(error.cause)) from None
        raise
    finally:
        if started_ray:
            ray.shutdown()
    fetched = mirror.pull(overwrite=True)
    print(f"fetched {fetched} file(s) of the study from {mirror.uri} into {study.storage}")
    return _outcome(study, out, mirror, fit, points)


def _head_driver(study: Study, uri: str, relative: str, base_data: TrialData, train_table: Any, *, resume: bool,
                 quiet: bool, points: list[dict[str, Any]] | None,
                 estimate: StudyEstimate | None = None) -> dict[str, Any]:
    """The study's driver inside a Ray task on the head node (see :func:`_run_on_head`)."""
    import dataclasses
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix=f"seqrec-study-{study.name}-"))
    try:
        mirror = Mirror(root, uri)
        if resume or relative:  # a replicate batch lives inside the study's folder, next to what it reads
            mirror.pull()
        here = dataclasses.replace(study, storage=root)
        return _drive(here, root / relative if relative else root, mirror, base_data, train_table, resume=resume,
                      quiet=quiet, points=points, on_cluster=True, estimate=estimate)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def build_rows(study: Study, meta: dict[str, Any], records: dict[str, dict]) -> list[dict[str, Any]]:
    """Rows of every record (used by tests and benchmarks to inspect a study without re-reading parquet)."""
    context = _row_context(study, meta)
    return [build_row(context, record) for record in records.values()]
