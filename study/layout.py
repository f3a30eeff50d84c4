"""The one contract of a results folder, ``results/<study>/``: what each file is called.

The sweep (:mod:`study.search`) and ``study.replicate`` write these files, and the analysis (:mod:`study.analysis`,
``study.report``, ``study.export``) reads them; every one of them names the files through this module, which
imports nothing heavier than :mod:`pathlib`, so a writer never loads the reader and a command can look at a folder
before it loads pandas, torch or Ray.

    study.yaml              the study as resolved, with every default (``--resume`` and replicates rerun it)
    environment.json        machine, versions, Ray cluster, git revision (earlier sessions under previous_sessions)
    optuna.db               the Optuna study (SQLite): optuna-dashboard opens it
    trials/<id>.json        one durable record per trial, written as soon as the trial ends
    trials/<id>.history.jsonl   the epochs of a trial still running, one line each (removed once it is recorded)
    trials.parquet          one row per trial (schema of :mod:`study.train.results` plus the sweep's columns)
    trials.csv              the same table as CSV
    history.parquet         one row per trial and epoch
    models/<id>/            each trial's best-validation model, on a local run (:mod:`study.train.state`)
    tune/                   Ray Tune's own experiment state (``--resume``), trial checkpoints, TensorBoard files
    tune/<trial>/checkpoint_NNNNNN/   a trial's checkpoints, named by Tune (at most ``checkpoint.keep``)
    search_generator.pkl    Tune's trial generator as the study began: a resume falls back to it when a kill cut
                            Tune's saved copy (:mod:`study.search.generator`)
    clock.json              the seconds of the study's time budget spent so far, over every session
    sweep.lock              held by the sweep writing the folder: host, process id, start time
    replicates/NNN/         one ``study.replicate`` batch: plan.json, trials/, tables
    replicates.parquet      every replicate row of every batch (and replicates.csv)
"""

from __future__ import annotations

from pathlib import Path

STUDY_FILE = "study.yaml"
ENVIRONMENT_FILE = "environment.json"
OPTUNA_FILE = "optuna.db"
RECORDS_DIR = "trials"
PARTIAL_HISTORY_SUFFIX = ".history.jsonl"
TRIALS_FILE = "trials.parquet"
TRIALS_CSV_FILE = "trials.csv"
HISTORY_FILE = "history.parquet"
MODELS_DIR = "models"
TUNE_DIR = "tune"
GENERATOR_FILE = "search_generator.pkl"
CHECKPOINT_PREFIX = "checkpoint_"
CLOCK_FILE = "clock.json"
LOCK_FILE = "sweep.lock"
REPLICATES_DIR = "replicates"
REPLICATES_FILE = "replicates.parquet"
REPLICATES_CSV_FILE = "replicates.csv"
PLAN_FILE = "plan.json"


def table_paths(out_dir: Path) -> dict[str, Path]:
    """Where the trial tables of a sweep (or of one replicate batch) live."""
    out_dir = Path(out_dir)
    return {"trials": out_dir / TRIALS_FILE, "trials_csv": out_dir / TRIALS_CSV_FILE,
            "history": out_dir / HISTORY_FILE}


def record_path(records_dir: Path, trial_id: str) -> Path:
    """A trial's durable record in ``trials/``."""
    return Path(records_dir) / f"{trial_id}.json"


def partial_history_path(records_dir: Path, trial_id: str) -> Path:
    """The epochs of a trial still running, in ``trials/``."""
    return Path(records_dir) / f"{trial_id}{PARTIAL_HISTORY_SUFFIX}"
