"""Reading a results folder back: the files are named by :mod:`study.layout`, the one contract of a results folder.

This module reads a folder back (:func:`load_results` → :class:`StudyResults`), gathers the
successful runs of several studies (:func:`collect_runs`, one ``config_id`` per configuration: its settings without
the seed) and checks what the report and ``study.replicate`` may select on (:func:`check_metrics`,
:func:`check_objectives`, :func:`selection_metric`).

Importing this module loads no pandas or torch (each function imports what it needs): :func:`check_folder` lets
``python -m study.report`` refuse a folder that is no study's within a fraction of a second.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from study.errors import UserError
from study.layout import (  # noqa: F401 (the names readers look up here too)
    CLOCK_FILE,
    ENVIRONMENT_FILE,
    HISTORY_FILE,
    LOCK_FILE,
    OPTUNA_FILE,
    PLAN_FILE,
    RECORDS_DIR,
    REPLICATES_CSV_FILE,
    REPLICATES_DIR,
    REPLICATES_FILE,
    STUDY_FILE,
    TRIALS_CSV_FILE,
    TRIALS_FILE,
    TUNE_DIR,
    table_paths,
)
from study.schema import SCHEMA, SCHEMA_KEY, UNSTAMPED, upgrade_settings
from study.train.settings import RANKING, keys_with

if TYPE_CHECKING:
    import pandas as pd

    from study.analysis.progress import Unfinished


# What makes metrics comparable across studies: the same data and the same ranking protocol. The training
# objective is not here: it is each model's own choice (SASRec's causal loss, BERT4Rec's cloze ...).
COMPARABILITY_KEYS = ("dataset", "dataset_hash", *keys_with(RANKING))
SEED_KEYS = ("seed",)


@dataclass
class StudyResults:
    """One results folder: every trial row, the replicate rows, the resolved study and its environment."""

    path: Path
    name: str
    model: str
    trials: pd.DataFrame
    replicates: pd.DataFrame
    study: dict[str, Any]
    environment: dict[str, Any]
    label: str = ""
    replicate_environments: dict[str, dict[str, Any]] = field(default_factory=dict)  # batch name → environment
    unfinished: list[Unfinished] = field(default_factory=list)  # trials with epochs but no record yet

    @property
    def searched(self) -> list[str]:
        """The study's searched keys, from its resolved YAML (or, without one, the config keys that vary)."""
        search = self.study.get("search")
        if isinstance(search, dict) and search:
            return [k for k in search if k not in SEED_KEYS]
        configs = [c for c in self.trials.columns if c.startswith("config.") and c[len("config."):] not in SEED_KEYS]
        return [c[len("config."):] for c in configs if self.trials[c].astype(str).nunique() > 1]


def _read_parquet(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        return pd.read_parquet(path)
    except Exception as error:  # pyarrow raises several types for a truncated or foreign file
        raise UserError(f"{path}: cannot read it as Parquet ({type(error).__name__}: {error})") from None


def check_folder(path: str | Path) -> Path:
    """``path`` if it holds a study's trials table, else a UserError that says what it is instead.

    Only the folder's listing is read, so a wrong path is refused before anything heavy loads. A folder without
    ``trials.parquet`` whose ``trials/`` holds files is a sweep none of whose trials has finished yet: its error
    (:func:`study.analysis.progress.still_running`) says which trials run and how far they got.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such results folder")
    if not path.is_dir():
        raise UserError(f"{path}: not a folder; give a study's results folder, e.g. results/<study>")
    if (path / TRIALS_FILE).is_file():
        return path
    records = path / RECORDS_DIR
    if records.is_dir() and any(records.iterdir()):
        from study.analysis.progress import still_running

        raise still_running(path)
    what = "empty folder" if not any(path.iterdir()) else f"no {TRIALS_FILE} here"
    raise UserError(f"{path}: {what}; not a study's results folder (run python -m study.sweep first)")


def load_results(path: str | Path) -> StudyResults:
    """Read a study folder written by ``python -m study.sweep``; a folder that is not one is a UserError.

    A sweep still running is read as far as it got: its finished trials, and in ``unfinished`` the trials that have
    epochs but no record yet.
    """
    import pandas as pd

    from study.analysis.progress import unfinished_trials

    path = check_folder(path)
    trials_path = path / TRIALS_FILE
    trials = _read_parquet(trials_path)
    if trials.empty:
        raise UserError(f"{trials_path}: no trials recorded yet")
    for column in ("status", "model", "config"):
        if column not in trials:
            raise UserError(f"{trials_path}: no '{column}' column; not a sweep's trials table")
    ok = trials["status"] == "ok"
    if not ok.any():
        errors = trials.get("error", pd.Series(dtype=str)).dropna().astype(str)
        first = next((e for e in errors if e), "")
        hint = f" (first error: {first[:200]})" if first else ""
        raise UserError(f"{path}: none of its {len(trials)} trials succeeded{hint}")
    replicates = _read_parquet(path / REPLICATES_FILE) if (path / REPLICATES_FILE).is_file() else pd.DataFrame()
    study: dict[str, Any] = {}
    if (path / STUDY_FILE).is_file():
        try:
            study = yaml.safe_load((path / STUDY_FILE).read_text()) or {}
        except yaml.YAMLError as error:
            raise UserError(f"{path / STUDY_FILE}: malformed YAML ({error})") from None
    environment: dict[str, Any] = {}
    if (path / ENVIRONMENT_FILE).is_file():
        try:
            environment = json.loads((path / ENVIRONMENT_FILE).read_text())
        except json.JSONDecodeError as error:
            raise UserError(f"{path / ENVIRONMENT_FILE}: malformed JSON ({error})") from None
    replicate_environments = {}
    for batch_env in sorted(path.glob(f"replicates/*/{ENVIRONMENT_FILE}")):
        try:
            replicate_environments[batch_env.parent.name] = json.loads(batch_env.read_text())
        except json.JSONDecodeError:
            continue  # the batch's rows still count; only its machine description is unknown
    trials, replicates = upgrade_rows(trials), upgrade_rows(replicates)
    models = trials.loc[ok, "model"].astype(str).unique()
    name = str(study.get("name") or (trials["study"].iloc[0] if "study" in trials else path.name))
    return StudyResults(path=path, name=name, model=",".join(models), trials=trials, replicates=replicates,
                        study=study, environment=environment, replicate_environments=replicate_environments,
                        unfinished=unfinished_trials(path))


def assign_labels(studies: list[StudyResults]) -> None:
    """Label each study by its model, or ``model@study`` where two studies share a model."""
    counts: dict[str, int] = {}
    for s in studies:
        counts[s.model] = counts.get(s.model, 0) + 1
    names = [s.name for s in studies]
    if len(set(names)) < len(names):
        raise UserError(f"the same study is given twice ({', '.join(names)})")
    for s in studies:
        s.label = s.model if counts[s.model] == 1 else f"{s.model}@{s.name}"


def short_labels(labels: Iterable[str]) -> dict[str, str]:
    """Each label as a plot shows it: a ``model@study`` label without what its study's name repeats.

    The ``@`` labels' common study-name prefix (up to its last ``-`` or ``_``) goes, and so does ``model@`` where
    the rest begins with the model's name: beside other ``repro-ml100k-`` studies ``bert4rec@repro-ml100k-bert4rec``
    is ``bert4rec`` and ``lisa@repro-ml100k-lisa-base`` is ``lisa-base``, while ``sasrec@repro-ml100k-baseline``
    is ``sasrec@baseline``. A label without ``@`` stays, and a shortening that would make two labels read the same
    is not made (those keep their full labels).
    """
    labels = list(dict.fromkeys(labels))
    pairs = {label: label.split("@", 1) for label in labels if "@" in label}
    studies = [study for _, study in pairs.values()]
    common = os.path.commonprefix(studies) if len(studies) > 1 else ""
    prefix = common[:max(common.rfind("-"), common.rfind("_")) + 1]
    short = {label: label for label in labels}
    for label, (model, study) in pairs.items():
        rest = study[len(prefix):]
        if rest:
            short[label] = rest if rest == model or rest.startswith((f"{model}-", f"{model}_")) else f"{model}@{rest}"
    counts: dict[str, int] = {}
    for name in short.values():
        counts[name] = counts.get(name, 0) + 1
    return {label: name if counts[name] == 1 else label for label, name in short.items()}


def upgrade_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (a trials or replicates table) with the ``config`` of every row of an earlier schema upgraded to
    today's keys (:func:`study.schema.upgrade_settings`), so that configurations compare across schemas."""
    if rows.empty or "config" not in rows or "model" not in rows:
        return rows
    schemas = rows[SCHEMA_KEY] if SCHEMA_KEY in rows else [None] * len(rows)
    configs = []
    for config, model, schema in zip(rows["config"], rows["model"], schemas):
        schema = UNSTAMPED if schema is None or schema != schema else int(schema)  # NaN: a row of an older table
        if schema >= SCHEMA or not isinstance(config, str):
            configs.append(config)
        else:
            configs.append(json.dumps(upgrade_settings(str(model), parse_config(config), schema), sort_keys=True,
                                      default=str))
    return rows.assign(config=configs)


def parse_config(value: Any) -> dict[str, Any]:
    """A trial's ``config`` cell (JSON text, a dict, or missing) as a dict; anything unreadable is empty."""
    if isinstance(value, dict):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return {}
    try:
        parsed = json.loads(value)
    except (TypeError, json.JSONDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def config_id(config: Any) -> str:
    """Identity of a configuration: its settings without the seed (8 hex digits)."""
    settings = {k: v for k, v in parse_config(config).items() if k not in SEED_KEYS}
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:8]


def collect_runs(studies: list[StudyResults]) -> pd.DataFrame:
    """Every successful run (sweep trial or replicate) with ``label``, ``config_id``, ``source`` and ``measured``.

    ``measured`` marks the runs that stand for their configuration: its replicates when it has any, else its
    sweep trials. A sweep trial may have been stopped early by ASHA or the study's time budget; replicates run
    their full budget, so mixing the two would compare unequal training.
    """
    import pandas as pd

    frames = []
    for s in studies:
        sweep = s.trials[s.trials["status"] == "ok"].copy()
        sweep["source"] = "sweep"
        sweep["source_trial_id"] = sweep.get("trial_id")
        parts = [sweep]
        if not s.replicates.empty and "status" in s.replicates:
            reps = s.replicates[s.replicates["status"] == "ok"].copy()
            reps["source"] = "replicate"
            parts.append(reps)
        runs = pd.concat(parts, ignore_index=True)
        runs["label"], runs["study"], runs["study_path"] = s.label, s.name, str(s.path)
        runs["config_id"] = [config_id(c) for c in runs["config"]]
        replicated = set(runs.loc[runs["source"] == "replicate", "config_id"])
        runs["measured"] = [(src == "replicate") == (cid in replicated)
                            for src, cid in zip(runs["source"], runs["config_id"])]
        frames.append(runs)
    return pd.concat(frames, ignore_index=True)


def check_metrics(runs: pd.DataFrame, metrics: Iterable[str], what: str) -> None:
    """Every metric must be a column with values in every study; otherwise one clear error."""
    import pandas as pd

    from study.train.results import EFFICIENCY_METRICS, ENERGY_METRICS

    for metric in metrics:
        if metric not in runs:
            known = sorted(c for c in runs.columns if c.startswith(("valid_", "test_")) or c in EFFICIENCY_METRICS)
            raise UserError(f"{what} {metric!r} is not in the results; known: {', '.join(known)}")
        empty = [str(study) for study, values in runs.groupby("study", sort=False)[metric]
                 if pd.to_numeric(values, errors="coerce").isna().all()]
        if empty:
            hint = " (efficiency figures need measure_efficiency: true)" if metric in EFFICIENCY_METRICS else ""
            if metric in ENERGY_METRICS:
                hint = (" (energy needs a device with an energy counter, NVML or RAPL: its rows say energy_method: "
                        "unavailable)")
            raise UserError(f"{what} {metric!r} has no values in study {', '.join(empty)}{hint}")


def check_protocols(runs: pd.DataFrame, allow_mixed: bool) -> list[str]:
    """Differences in data or ranking protocol between the studies: an error, or (allowed) warnings."""
    problems = []
    for key in COMPARABILITY_KEYS:
        if key not in runs:
            continue
        values = runs[key].astype(str)
        per_value = {v: sorted(set(runs.loc[values == v, "study"])) for v in values.unique()}
        if len(per_value) > 1:
            shown = "; ".join(f"{v or '(none)'} in {', '.join(s)}" for v, s in per_value.items())
            problems.append(f"{key}: {shown}")
    if problems and not allow_mixed:
        raise UserError("the studies differ in protocol (" + " | ".join(problems) + "): their metrics are not "
                        "comparable; pass --allow-mixed-protocols to report them side by side anyway")
    return problems


def efficiency_differences(runs: pd.DataFrame, objectives: dict[str, str]) -> list[str]:
    """Efficiency objectives measured on different devices or by different methods do not compare."""
    from study.train.results import EFFICIENCY_METRICS, ENERGY_METRICS

    notes = []
    checks = [("device", any(m in EFFICIENCY_METRICS for m in objectives))]
    checks.append(("peak_mem_method", "peak_mem_mb" in objectives))
    checks.append(("energy_method", any(m in ENERGY_METRICS for m in objectives)))
    for column, relevant in checks:
        if relevant and column in runs:
            values = sorted(set(runs[column].dropna().astype(str)))
            if len(values) > 1:
                notes.append(f"efficiency figures come from different {column} values ({', '.join(values)})")
    return notes


def selection_metric(objectives: dict[str, str], chosen: str | None) -> str:
    """The validation metric that ranks configurations: ``chosen``, else the first ``valid_`` objective."""
    if chosen:
        if not chosen.startswith("valid_"):
            raise UserError(f"--select-metric {chosen}: configurations are chosen on a validation metric (valid_…), "
                            "never on test")
        return chosen
    return next((m for m in objectives if m.startswith("valid_")), "valid_ndcg@10")


def name_configs(points: pd.DataFrame, select: str) -> pd.DataFrame:
    """Readable names: ``<label>-<rank>`` with rank 1 the best mean ``select`` within the label."""
    points = points.sort_values(["label", select, "n_seeds", "config_id"], ascending=[True, False, False, True],
                                kind="stable").copy()
    points["name"] = points["label"] + "-" + (points.groupby("label").cumcount() + 1).astype(str)
    return points


def check_objectives(objectives: dict[str, str]) -> None:
    """Fronts select configurations, so their objectives must not be test metrics."""
    tests = [m for m in objectives if m.startswith("test_")]
    if tests:
        raise UserError(f"objective {tests[0]}: fronts select configurations, and selection uses validation "
                        "metrics (valid_…) and efficiency figures, never test metrics")
