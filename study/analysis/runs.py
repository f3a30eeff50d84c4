"""The one contract of a results folder, ``results/<study>/``: what each file is called and holds.

A sweep (:mod:`study.search`) writes these files, ``study.replicate`` adds replicate batches, and the analysis
(:mod:`study.report`) reads them; every one of them names the files through this module.

    study.yaml          the study as resolved, with every default (``--resume`` and replicates rerun it)
    environment.json    machine, versions, Ray cluster, git revision
    optuna.db           the Optuna study (SQLite): optuna-dashboard opens it
    trials/<id>.json    one durable record per trial, written as soon as the trial ends
    trials.parquet      one row per trial (schema of :mod:`study.train.results` plus the sweep's columns)
    trials.csv          the same table as CSV
    history.parquet     one row per trial and epoch
    tune/               Ray Tune's own experiment state (``--resume``) and TensorBoard event files
    replicates/NNN/     one ``study.replicate`` batch: plan.json, trials/, tables
    replicates.parquet  every replicate row of every batch
"""

from __future__ import annotations

from pathlib import Path

STUDY_FILE = "study.yaml"
ENVIRONMENT_FILE = "environment.json"
OPTUNA_FILE = "optuna.db"
RECORDS_DIR = "trials"
TRIALS_FILE = "trials.parquet"
TRIALS_CSV_FILE = "trials.csv"
HISTORY_FILE = "history.parquet"
TUNE_DIR = "tune"
REPLICATES_DIR = "replicates"
REPLICATES_FILE = "replicates.parquet"
PLAN_FILE = "plan.json"


def table_paths(out_dir: Path) -> dict[str, Path]:
    """Where the trial tables of a sweep (or of one replicate batch) live."""
    out_dir = Path(out_dir)
    return {"trials": out_dir / TRIALS_FILE, "trials_csv": out_dir / TRIALS_CSV_FILE,
            "history": out_dir / HISTORY_FILE}
