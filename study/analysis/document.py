"""Turn one or several studies' results into a report: Pareto fronts, a paper-style table, significance tests.

    python -m study.report results/<study> [results/<study2> …] [--out DIR] [--objectives M:max,M:min,…]
        [--reference sasrec] [--proposed MODEL] [--hv-reference M=V,…] [--allow-mixed-protocols]

Data flow:

1. :func:`load_results` reads each study folder (``trials.parquet``, ``replicates.parquet`` from
   :mod:`study.replicate`, ``study.yaml``, ``environment.json``); :func:`collect_runs` keeps the successful runs
   and gives each a ``config_id``: the hash of its settings without the seed, so the runs of one configuration
   under several seeds group together.
2. A configuration is measured by its **replicates** when it has any (complete runs under new seeds, never
   stopped early), otherwise by its sweep trials (several when the study searched ``seed``).
   :func:`aggregate` gives one point per configuration: the mean over its seed runs, the std and n.
3. Pareto fronts over the objectives (default ``valid_ndcg@10:max, peak_mem_mb:min, infer_ms_p50:min``) —
   the 3-D non-dominated set globally and per model, the 2-D front of every pair — and hypervolumes against
   one reference point for all (:mod:`study.analysis.pareto`). Objectives are validation metrics and efficiency
   figures: ``test_`` metrics are reported, never selected on.
4. Each model's **chosen configuration**: the best mean validation metric (``--select-metric``, default the
   first ``valid_`` objective) among its replicated configurations, or among all when none is replicated.
   The results table gives its test metrics (mean ± std over seeds) and :mod:`study.analysis.significance` compares
   it with the reference model's, seed by seed.
5. ``report.md``, a self-contained ``report.html`` (plots embedded as base64), the plots as PNG and SVG, and a
   CSV + Parquet file of every table, in ``--out`` (default ``<study>/report``).

Bad input (a missing or empty folder, no successful trial, an absent metric, studies evaluated under
different protocols) is a :class:`~study.errors.UserError`: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import itertools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from study.analysis import pareto, significance
from study.analysis.runs import ENVIRONMENT_FILE, REPLICATES_FILE, STUDY_FILE, TRIALS_FILE
from study.errors import UserError, print_error
from study.storage import local_copy
from study.train.results import EFFICIENCY_METRICS

REPORT_DIR = "report"

TABLE_METRICS = tuple(f"test_{name}@{k}" for k in (10, 20) for name in ("hr", "ndcg", "mrr"))
# What makes metrics comparable across studies: the same data and the same ranking protocol. The training
# objective is not here: it is each model's own choice (SASRec's causal loss, BERT4Rec's cloze ...).
COMPARABILITY_KEYS = ("dataset", "dataset_hash", "eval_mode", "num_negatives", "negative_sampler", "mask_history")
SEED_KEYS = ("seed",)
MAX_FACET_KEYS = 6
DEFAULT_REFERENCE_MODEL = "sasrec"


# ---------------------------------------------------------------------------------------------------------------
# Loading


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

    @property
    def searched(self) -> list[str]:
        """The study's searched keys, from its resolved YAML (or, without one, the config keys that vary)."""
        search = self.study.get("search")
        if isinstance(search, dict) and search:
            return [k for k in search if k not in SEED_KEYS]
        configs = [c for c in self.trials.columns if c.startswith("config.") and c[len("config."):] not in SEED_KEYS]
        return [c[len("config."):] for c in configs if self.trials[c].astype(str).nunique() > 1]


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as error:  # pyarrow raises several types for a truncated or foreign file
        raise UserError(f"{path}: cannot read it as Parquet ({type(error).__name__}: {error})") from None


def load_results(path: str | Path) -> StudyResults:
    """Read a study folder written by ``python -m study.sweep``; a folder that is not one is a UserError."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such results folder")
    if not path.is_dir():
        raise UserError(f"{path}: not a folder; give a study's results folder, e.g. results/<study>")
    trials_path = path / TRIALS_FILE
    if not trials_path.is_file():
        what = "empty folder" if not any(path.iterdir()) else f"no {TRIALS_FILE} here"
        raise UserError(f"{path}: {what}; not a study's results folder (run python -m study.sweep first)")
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
    models = trials.loc[ok, "model"].astype(str).unique()
    name = str(study.get("name") or (trials["study"].iloc[0] if "study" in trials else path.name))
    return StudyResults(path=path, name=name, model=",".join(models), trials=trials, replicates=replicates,
                        study=study, environment=environment, replicate_environments=replicate_environments)


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


def parse_config(value: Any) -> dict[str, Any]:
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
    for metric in metrics:
        if metric not in runs:
            known = sorted(c for c in runs.columns if c.startswith(("valid_", "test_")) or c in EFFICIENCY_METRICS)
            raise UserError(f"{what} {metric!r} is not in the results; known: {', '.join(known)}")
        empty = [str(study) for study, values in runs.groupby("study", sort=False)[metric]
                 if pd.to_numeric(values, errors="coerce").isna().all()]
        if empty:
            hint = " (efficiency figures need measure_efficiency: true)" if metric in EFFICIENCY_METRICS else ""
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
    notes = []
    checks = [("device", any(m in EFFICIENCY_METRICS for m in objectives))]
    checks.append(("peak_mem_method", "peak_mem_mb" in objectives))
    for column, relevant in checks:
        if relevant and column in runs:
            values = sorted(set(runs[column].dropna().astype(str)))
            if len(values) > 1:
                notes.append(f"efficiency figures come from different {column} values ({', '.join(values)})")
    return notes


def metric_columns(runs: pd.DataFrame) -> list[str]:
    columns = [c for c in runs.columns
               if c.startswith(("valid_", "test_")) or c in EFFICIENCY_METRICS or c == "pop_ndcg@10"]
    return [c for c in columns if pd.api.types.is_numeric_dtype(runs[c])]


def aggregate(runs: pd.DataFrame, searched: dict[str, list[str]]) -> pd.DataFrame:
    """One row per (label, configuration): mean of every metric over its measured runs, ``<metric>_std``, n."""
    measured = runs[runs["measured"]]
    metrics = metric_columns(measured)
    rows = []
    for (label, cid), group in measured.groupby(["label", "config_id"], sort=False):
        per_seed = group.groupby("seed")[metrics].mean()  # a seed run twice counts once
        row: dict[str, Any] = {"label": label, "config_id": cid, "study": group["study"].iloc[0],
                               "model": group["model"].iloc[0], "source": group["source"].iloc[0],
                               "n_seeds": len(per_seed), "seeds": ",".join(str(int(s)) for s in sorted(per_seed.index)),
                               "trial_ids": ",".join(group["trial_id"].astype(str)),
                               "source_trial_id": str(group["source_trial_id"].iloc[0])}
        for key in searched.get(label, []):
            column = f"config.{key}"
            row[key] = group[column].iloc[0] if column in group else None
        for metric in metrics:
            row[metric] = per_seed[metric].mean()
            row[f"{metric}_std"] = per_seed[metric].std(ddof=1) if len(per_seed) > 1 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def selection_metric(objectives: dict[str, str], chosen: str | None) -> str:
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


def choose(points: pd.DataFrame, select: str) -> pd.DataFrame:
    """Each label's chosen configuration: best mean ``select`` among replicated ones (or all, if none are)."""
    chosen = []
    for _, group in points.groupby("label", sort=False):
        pool = group[group["source"] == "replicate"]
        pool = pool if not pool.empty else group
        chosen.append(pool.sort_values([select, "n_seeds", "config_id"], ascending=[False, False, True]).iloc[0])
    return pd.DataFrame(chosen).reset_index(drop=True)


# ---------------------------------------------------------------------------------------------------------------
# Analysis


@dataclass
class ParetoResult:
    points: pd.DataFrame  # every configuration with on_front_3d / on_model_front / on_front_<a>__<b> flags
    reference: dict[str, float]
    ideal: dict[str, float]
    reference_note: str
    hypervolumes: pd.DataFrame  # scope (global | label), configurations, on_front, hv, hv_share
    pairs: list[tuple[str, str]] = field(default_factory=list)


def pair_column(a: str, b: str) -> str:
    return f"on_front_{a}__{b}"


def analyse_pareto(points: pd.DataFrame, objectives: dict[str, str], hv_reference: dict[str, float] | None,
                   margin: float) -> ParetoResult:
    names, senses = list(objectives), list(objectives.values())
    complete = points.dropna(subset=names).copy()
    values = complete[names].to_numpy(dtype=float)
    points = points.copy()
    points["on_front"] = False
    points.loc[complete.index, "on_front"] = pareto.non_dominated_mask(values, senses)
    points["on_model_front"] = False
    for _, group in complete.groupby("label", sort=False):
        mask = pareto.non_dominated_mask(group[names].to_numpy(dtype=float), senses)
        points.loc[group.index, "on_model_front"] = mask
    pairs = list(itertools.combinations(names, 2))
    for a, b in pairs:
        column = pair_column(a, b)
        points[column] = False
        points.loc[complete.index, column] = pareto.non_dominated_mask(complete[[a, b]].to_numpy(dtype=float),
                                                                       [objectives[a], objectives[b]])
    derived = pareto.default_reference(values, senses, margin)
    reference = {n: float(v) for n, v in zip(names, derived)}
    given = hv_reference or {}
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise UserError(f"--hv-reference names {', '.join(unknown)}, which are not objectives ({', '.join(names)})")
    reference.update(given)
    ideal = {n: float(v) for n, v in zip(names, pareto.ideal_point(values, senses))}
    derived_names = [n for n in names if n not in given]
    note = ""
    if derived_names:
        note = (f"{', '.join(derived_names)}: the worst observed value over all {len(complete)} configurations, moved "
                f"{margin:.0%} of the observed range further out")
    if given:
        note += ("; " if note else "") + f"{', '.join(given)}: given with --hv-reference"
    ref = [reference[n] for n in names]
    ideal_values = [ideal[n] for n in names]
    rows = [{"scope": "all models", "configurations": len(complete), "on_front": int(points["on_front"].sum()),
             "hypervolume": pareto.hypervolume(values, senses, ref),
             "hv_share": pareto.normalised_hypervolume(values, senses, ref, ideal_values),
             "front": ", ".join(points.loc[points["on_front"], "name"])}]
    for label, group in complete.groupby("label", sort=False):
        group_values = group[names].to_numpy(dtype=float)
        members = points.loc[group.index]
        rows.append({"scope": label, "configurations": len(group), "on_front": int(members["on_model_front"].sum()),
                     "hypervolume": pareto.hypervolume(group_values, senses, ref),
                     "hv_share": pareto.normalised_hypervolume(group_values, senses, ref, ideal_values),
                     "front": ", ".join(members.loc[members["on_model_front"], "name"])})
    return ParetoResult(points=points, reference=reference, ideal=ideal, reference_note=note,
                        hypervolumes=pd.DataFrame(rows), pairs=pairs)


def chosen_runs(runs: pd.DataFrame, chosen: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The measured runs of each label's chosen configuration, one row per seed (repeated seeds averaged)."""
    out = {}
    for _, row in chosen.iterrows():
        group = runs[(runs["label"] == row["label"]) & (runs["config_id"] == row["config_id"]) & runs["measured"]]
        out[row["label"]] = group
    return out


def significance_table(per_label: dict[str, pd.DataFrame], reference: str, metrics: list[str],
                       alpha: float) -> pd.DataFrame:
    rows = []
    for metric in metrics:
        groups = {label: runs.groupby("seed")[metric].mean() for label, runs in per_label.items()}
        rows += significance.compare_many(groups, reference, metric)
    return significance.adjust(pd.DataFrame(rows), alpha)


def extra_table(per_label: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Model statistics from the ``extra`` column (ELASTIC: expert usage), mean ± std over the seed runs."""
    rows = []
    for label, runs in per_label.items():
        parsed = [parse_config(e) for e in runs["extra"]] if "extra" in runs else [{} for _ in range(len(runs))]
        flat = runs[[c for c in runs.columns if c.startswith("extra.")]].rename(columns=lambda c: c[len("extra."):])
        stats = pd.DataFrame(parsed, index=runs.index).combine_first(flat) if len(runs) else pd.DataFrame()
        stats = stats.apply(pd.to_numeric, errors="coerce") if not stats.empty else stats
        for key in stats.columns:
            values = stats[key].dropna()
            if values.empty:
                continue
            rows.append({"label": label, "statistic": key, "mean": values.mean(),
                         "std": values.std(ddof=1) if len(values) > 1 else float("nan"), "n": len(values)})
    return pd.DataFrame(rows, columns=["label", "statistic", "mean", "std", "n"])


def dataset_statistics(runs: pd.DataFrame) -> pd.DataFrame:
    """Users, items, interactions and lengths of each dataset, from the prepared copy in the local data cache."""
    from study.data import list_prepared

    known = {meta.get("content_hash"): meta for _, meta in list_prepared()}
    rows = []
    for (name, digest), group in runs.groupby(["dataset", "dataset_hash"], sort=False, dropna=False):
        meta = known.get(digest)
        row: dict[str, Any] = {"dataset": name, "content_hash": str(digest)[:12],
                               "studies": ", ".join(sorted(set(group["study"]))),
                               "synthetic": bool(group["synthetic"].any()) if "synthetic" in group else False}
        if meta:
            length = meta.get("length", {})
            row.update(users=meta.get("num_users"), items=meta.get("num_items"),
                       interactions=meta.get("num_interactions"), length_mean=length.get("mean"),
                       length_median=length.get("median"), length_max=length.get("max"), kcore=meta.get("kcore"),
                       max_len=meta.get("max_len"), split=meta.get("split"))
        rows.append(row)
    return pd.DataFrame(rows)


def environment_table(studies: list[StudyResults], runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    sessions = [(s.name, "sweep", s.environment) for s in studies]
    sessions += [(s.name, f"replicates {batch}", env)
                 for s in studies for batch, env in s.replicate_environments.items()]
    for name, part, env in sessions:
        hardware = env.get("hardware", {})
        packages = env.get("packages", {})
        gpus = ", ".join(g.get("name", "?") for g in hardware.get("gpus", []) or [])
        devices = ", ".join(sorted(set(runs.loc[runs["study"] == name, "device"].dropna().astype(str)))) \
            if "device" in runs else ""
        code = env.get("code", {})
        rows.append({"study": name, "runs": part, "accelerator": hardware.get("accelerator", "unknown"),
                     "devices": devices, "cpu": hardware.get("cpu_model"), "cpus": hardware.get("cpus_usable"),
                     "memory_gib": hardware.get("memory_gib"), "gpus": gpus or "none",
                     "torch": packages.get("torch"), "ray": packages.get("ray"), "optuna": packages.get("optuna"),
                     "commit": (str(code.get("commit") or "")[:10] + ("+dirty" if code.get("dirty") else "")) or None,
                     "recorded": env.get("recorded")})
    return pd.DataFrame(rows)


def study_table(studies: list[StudyResults]) -> pd.DataFrame:
    rows = []
    for s in studies:
        trials = s.trials
        stop = trials.get("stop_reason", pd.Series(dtype=str))
        reps = s.replicates
        rows.append({"study": s.name, "model": s.model, "label": s.label, "folder": str(s.path),
                     "trials": len(trials), "ok": int((trials["status"] == "ok").sum()),
                     "failed": int((trials["status"] != "ok").sum()), "stopped_early": int((stop == "stopped").sum()),
                     "replicates": len(reps), "replicates_ok": int((reps["status"] == "ok").sum()) if not reps.empty
                     else 0, "searched": ", ".join(s.searched)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------------
# Formatting


def fmt(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if value.is_integer() and abs(value) >= 1000:  # counts stored as floats (e.g. mean params)
            return f"{int(value):,}"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 10 ** -digits):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}f}" if abs(value) < 10 else f"{value:,.{max(0, digits - 3)}f}"
    return str(value)


def fmt_p(p: float) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def results_table(chosen: pd.DataFrame, metrics: list[str], sig: pd.DataFrame, reference: str | None,
                  proposed: str | None) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The paper table (strings) and its numbers; best mean in bold, ``*`` = significant vs the reference."""
    numbers = []
    for _, row in chosen.iterrows():
        for metric in metrics:
            numbers.append({"label": row["label"], "config": row["name"], "metric": metric, "mean": row[metric],
                            "std": row.get(f"{metric}_std"), "n_seeds": row["n_seeds"]})
    numbers = pd.DataFrame(numbers)
    marks = {}
    if not sig.empty:
        for _, s in sig.iterrows():
            if _is_true(s["significant"]):
                marks[(s["candidate"], s["metric"])] = "*"
    table = []
    for _, row in chosen.iterrows():
        cells: dict[str, str] = {"model": row["label"], "n": str(row["n_seeds"])}
        for metric in metrics:
            best = chosen[metric].max()
            mean, std = row[metric], row.get(f"{metric}_std")
            text = "–" if pd.isna(mean) else f"{mean:.4f}"  # a paper's fixed four decimals
            if not pd.isna(mean) and mean == best:
                text = f"**{text}**"
            if std is not None and not pd.isna(std):
                text += f" ± {std:.4f}"
            text += marks.get((row["label"], metric), "")
            cells[short(metric)] = text
        table.append(cells)
    notes = []
    improvement: dict[str, str] = {"model": "", "n": ""}
    if len(chosen) > 1:
        for metric in metrics:
            ranked = chosen.sort_values(metric, ascending=False)
            if proposed:
                mine = chosen[chosen["label"] == proposed]
                others = chosen[chosen["label"] != proposed]
                top, base = mine.iloc[0], others.sort_values(metric, ascending=False).iloc[0]
            else:
                top, base = ranked.iloc[0], ranked.iloc[1]
            gain = (top[metric] - base[metric]) / base[metric] if base[metric] else float("nan")
            improvement[short(metric)] = f"{gain:+.2%}" if not math.isnan(gain) else "–"
        if proposed:
            improvement["model"] = f"Improv. ({proposed} vs best other)"
            notes.append(f"Improv.: relative difference of {proposed}'s mean from the best other model's mean.")
        else:
            improvement["model"] = "Improv. (best vs runner-up)"
            notes.append("Improv.: relative difference of the best model's mean from the runner-up's, per metric "
                         "(name the proposed model with --proposed to compare it with the best baseline instead).")
        table.append(improvement)
    if reference and not sig.empty:
        notes.append(f"* differs from {reference} at Holm-adjusted p < alpha (two-sided t-test over seeds: paired when "
                     "both used the same seeds, Welch otherwise; see the significance table).")
    return pd.DataFrame(table), numbers, notes


def _is_true(value: Any) -> bool:
    """True for a set boolean flag; False for False and for missing (NA: no test ran)."""
    return not pd.isna(value) and bool(value)


def short(metric: str) -> str:
    """``test_ndcg@10`` → ``NDCG@10`` for table headers."""
    name = metric.removeprefix("test_").removeprefix("valid_")
    base, _, k = name.partition("@")
    return f"{base.upper()}@{k}" if k else name


# ---------------------------------------------------------------------------------------------------------------
# Plots


def _save(fig: Any, out: Path, stem: str) -> Path:
    """PNG + SVG through the shared helper; the PNG is the one the HTML embeds."""
    from study.analysis.plots import save_figure

    return next(p for p in save_figure(fig, out / stem) if p.suffix == ".png")


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def plot_pairs(result: ParetoResult, objectives: dict[str, str], out: Path) -> list[tuple[Path, str]]:
    """A scatter per objective pair, coloured by model, with the global 2-D front drawn and its points named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    points = result.points
    labels = list(dict.fromkeys(points["label"]))
    palette = dict(zip(labels, sns.color_palette("colorblind", len(labels))))
    paths = []
    for a, b in result.pairs:
        data = points.dropna(subset=[a, b])
        fig, ax = plt.subplots(figsize=(6.4, 4.6))
        sns.scatterplot(data=data, x=a, y=b, hue="label", style="label", palette=palette, s=60, ax=ax, zorder=3)
        # The attainment boundary: after a front point the best reachable value of y stays until the next
        # point's x (x minimised: 'post'), or is already the next point's (x maximised: 'pre').
        where = "pre" if objectives[a] == "max" else "post"
        if len(labels) > 1:
            for label in labels:
                group = data[data["label"] == label]
                mask = pareto.non_dominated_mask(group[[a, b]].to_numpy(float), [objectives[a], objectives[b]])
                front = group[mask].sort_values(a)
                ax.step(front[a], front[b], where=where, color=palette[label], lw=1, ls="--", alpha=0.7, zorder=2)
        front = data[data[pair_column(a, b)]].sort_values(a)
        ax.step(front[a], front[b], where=where, color="black", lw=1.6, zorder=4, label="Pareto front (all models)")
        ax.scatter(front[a], front[b], facecolors="none", edgecolors="black", s=140, lw=1.2, zorder=5)
        for _, row in front.iterrows():
            ax.annotate(row["name"], (row[a], row[b]), textcoords="offset points", xytext=(6, 6), fontsize=8,
                        zorder=6)
        ax.set_xlabel(f"{a} ({'higher' if objectives[a] == 'max' else 'lower'} is better)")
        ax.set_ylabel(f"{b} ({'higher' if objectives[b] == 'max' else 'lower'} is better)")
        ax.set_title(f"{b} vs {a}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        paths.append((_save(fig, out, f"pareto_{_safe(a)}__{_safe(b)}"), f"{b} against {a}: every configuration, "
                      "the front over all models (black, named) and each model's own front (dashed)"))
    return paths


def plot_hyperparameters(result: ParetoResult, objectives: dict[str, str], searched: dict[str, list[str]],
                         study_specs: dict[str, dict], out: Path) -> list[tuple[Path, str]]:
    """Per model: each searched hyperparameter (columns) against each objective (rows); front points ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    paths = []
    for label, group in result.points.groupby("label", sort=False):
        keys = [k for k in searched.get(label, []) if k in group and group[k].notna().any()][:MAX_FACET_KEYS]
        if len(group) < 2 or not keys:
            continue
        names = list(objectives)
        fig, axes = plt.subplots(len(names), len(keys), figsize=(2.9 * len(keys) + 0.6, 2.3 * len(names) + 0.4),
                                 squeeze=False)
        spec = study_specs.get(label, {})
        for col, key in enumerate(keys):
            values = group[key]
            numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
            categorical = not numeric or values.nunique() <= 6
            log = isinstance(spec.get(key), dict) and ("loguniform" in spec[key] or spec[key].get("log"))
            for row, metric in enumerate(names):
                ax = axes[row][col]
                data = group.assign(**{key: values.map(_plain) if categorical else values,
                                       "on front": group["on_model_front"]})
                if categorical:
                    order = [_plain(v) for v in sorted(values.dropna().unique(), key=_sort_key)]
                    sns.stripplot(data=data, x=key, y=metric, hue="on front", order=order, ax=ax, size=6, jitter=0.15,
                                  palette={True: "black", False: "tab:blue"}, legend=row == 0 and col == 0)
                else:
                    sns.scatterplot(data=data, x=key, y=metric, hue="on front", ax=ax, s=30,
                                    palette={True: "black", False: "tab:blue"}, legend=row == 0 and col == 0)
                    if log:
                        ax.set_xscale("log")
                ax.set_xlabel(key if row == len(names) - 1 else "")
                ax.set_ylabel(metric if col == 0 else "")
                ax.grid(alpha=0.3)
        fig.suptitle(f"{label}: hyperparameters against objectives\n(means over seeds; black = on {label}'s front)",
                     fontsize=10)
        fig.tight_layout()
        paths.append((_save(fig, out, f"hyperparameters_{_safe(label)}"),
                      f"{label}: searched hyperparameters against the objectives"))
    return paths


def _sort_key(value: Any) -> tuple:
    return (0, float(value), "") if isinstance(value, (int, float, np.number)) else (1, 0.0, str(value))


# ---------------------------------------------------------------------------------------------------------------
# Document: one list of blocks rendered as Markdown and as self-contained HTML


class Document:
    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("heading", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("para", text))

    def warning(self, text: str) -> None:
        self.blocks.append(("warning", text))

    def bullets(self, items: list[str]) -> None:
        self.blocks.append(("bullets", items))

    def table(self, frame: pd.DataFrame) -> None:
        self.blocks.append(("table", frame))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def image(self, path: Path, alt: str) -> None:
        self.blocks.append(("image", (path, alt)))

    def markdown(self, base: Path) -> str:
        out = []
        for kind, value in self.blocks:
            if kind == "heading":
                out.append("#" * value[0] + " " + value[1])
            elif kind == "para":
                out.append(value)
            elif kind == "warning":
                out.append(f"> **⚠ {value}**")
            elif kind == "bullets":
                out.append("\n".join(f"- {item}" for item in value))
            elif kind == "table":
                out.append(_md_table(value))
            elif kind == "code":
                out.append(f"```\n{value.rstrip()}\n```")
            elif kind == "image":
                path, alt = value
                out.append(f"![{alt}]({path.relative_to(base).as_posix()})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        body = []
        for kind, value in self.blocks:
            if kind == "heading":
                body.append(f"<h{value[0]}>{_inline(value[1])}</h{value[0]}>")
            elif kind == "para":
                body.append(f"<p>{_inline(value)}</p>")
            elif kind == "warning":
                body.append(f'<p class="warning">⚠ {_inline(value)}</p>')
            elif kind == "bullets":
                body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in value) + "</ul>")
            elif kind == "table":
                head = "".join(f"<th>{_inline(str(c))}</th>" for c in value.columns)
                rows = "".join("<tr>" + "".join(f"<td>{_inline(str(v))}</td>" for v in row) + "</tr>"
                               for row in value.itertuples(index=False))
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
            elif kind == "code":
                body.append(f"<pre>{html.escape(value)}</pre>")
            elif kind == "image":
                path, alt = value
                data = base64.b64encode(path.read_bytes()).decode()
                body.append(f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
                            f"<figcaption>{html.escape(alt)}</figcaption></figure>")
        style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
                 "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
                 "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
                 "td:first-child,th:first-child{text-align:left}"
                 "pre{background:#f6f6f6;padding:0.8em;overflow-x:auto;font-size:0.85em}"
                 ".warning{background:#fff3cd;border:2px solid #d39e00;padding:0.8em;font-weight:bold}"
                 "img{max-width:100%}figure{margin:1em 0}figcaption{font-size:0.85em;color:#555}")
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
                f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _inline(text: str) -> str:
    """Escape, then render the little Markdown the report uses: **bold** and `code`."""
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _md_table(frame: pd.DataFrame) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(cell(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def _formatted(frame: pd.DataFrame, digits: int = 4, plain: Iterable[str] = ()) -> pd.DataFrame:
    """Display strings; ``plain`` columns (hyperparameter values) are shown as given, not rounded."""
    if frame.empty:
        return frame
    plain = set(plain)
    return pd.DataFrame({c: [_plain(v) if c in plain else fmt(v, digits) for v in frame[c]] for c in frame.columns})


def _plain(value: Any) -> str:
    """A hyperparameter value as written in a study file: 16, not 16.0 (pandas turns ints into floats beside NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def write_table(frame: pd.DataFrame, out: Path, stem: str) -> None:
    """CSV and Parquet of a table; object columns of mixed types (config values) are stored as text."""
    frame = frame.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            kinds = {type(v) for v in frame[column].dropna()}
            if len(kinds) > 1 or (kinds and not kinds <= {str}):
                frame[column] = frame[column].map(lambda v: None if v is None else str(v))
    frame.to_csv(out / f"{stem}.csv", index=False)
    frame.to_parquet(out / f"{stem}.parquet", index=False)


# ---------------------------------------------------------------------------------------------------------------
# The report


@dataclass
class ReportOptions:
    objectives: dict[str, str] = field(default_factory=lambda: dict(pareto.DEFAULT_OBJECTIVES))
    reference_model: str | None = None  # None: sasrec when present
    proposed: str | None = None
    select_metric: str | None = None
    metrics: tuple[str, ...] = TABLE_METRICS
    hv_reference: dict[str, float] | None = None
    margin: float = pareto.REFERENCE_MARGIN
    alpha: float = 0.05
    allow_mixed_protocols: bool = False
    plots: bool = True


def check_objectives(objectives: dict[str, str]) -> None:
    tests = [m for m in objectives if m.startswith("test_")]
    if tests:
        raise UserError(f"objective {tests[0]}: fronts select configurations, and selection uses validation "
                        "metrics (valid_…) and efficiency figures, never test metrics")


def default_out(paths: list[Path]) -> Path:
    if len(paths) == 1:
        return paths[0] / REPORT_DIR
    names = "+".join(p.resolve().name for p in paths)
    return paths[0].resolve().parent / f"report-{_safe(names)[:100]}"


def build_report(paths: list[str | Path], out: str | Path | None = None,
                 options: ReportOptions | None = None) -> dict[str, Any]:
    """Analyse the studies in ``paths`` and write the report into ``out``; returns the tables and file paths."""
    options = options or ReportOptions()
    if not paths:
        raise UserError("no results folder given")
    check_objectives(options.objectives)
    select = selection_metric(options.objectives, options.select_metric)
    studies = [load_results(local_copy(p)) for p in paths]
    assign_labels(studies)
    runs = collect_runs(studies)
    check_metrics(runs, options.objectives, "objective")
    check_metrics(runs, [select], "selection metric")
    check_metrics(runs, options.metrics, "table metric")
    protocol_notes = check_protocols(runs, options.allow_mixed_protocols)
    labels = [s.label for s in studies]
    reference = options.reference_model
    if reference is not None and reference not in labels:
        raise UserError(f"--reference {reference}: no such model among the studies ({', '.join(labels)})")
    if reference is None and DEFAULT_REFERENCE_MODEL in labels:
        reference = DEFAULT_REFERENCE_MODEL
    if options.proposed is not None and options.proposed not in labels:
        raise UserError(f"--proposed {options.proposed}: no such model among the studies ({', '.join(labels)})")

    searched = {s.label: s.searched for s in studies}
    points = name_configs(aggregate(runs, searched), select)
    result = analyse_pareto(points, options.objectives, options.hv_reference, options.margin)
    points = result.points
    chosen = choose(points, select)
    chosen = chosen.set_index("label").loc[labels].reset_index()  # rows in the order the studies were given
    per_label = chosen_runs(runs, chosen)
    sig = significance_table(per_label, reference, list(options.metrics), options.alpha) \
        if reference is not None and len(labels) > 1 else pd.DataFrame()
    table, numbers, table_notes = results_table(chosen, list(options.metrics), sig, reference, options.proposed)
    extras = extra_table(per_label)
    datasets = dataset_statistics(runs)
    environment = environment_table(studies, runs)
    studies_frame = study_table(studies)

    out_dir = Path(out) if out is not None else default_out([Path(p) for p in paths])
    out_dir.mkdir(parents=True, exist_ok=True)
    figures: list[tuple[Path, str]] = []
    hparam_figures: list[tuple[Path, str]] = []
    if options.plots:
        figures = plot_pairs(result, options.objectives, out_dir)
        specs = {s.label: s.study.get("search") or {} for s in studies}
        hparam_figures = plot_hyperparameters(result, options.objectives, searched, specs, out_dir)

    synthetic = bool(runs["synthetic"].astype(bool).any()) if "synthetic" in runs else False
    efficiency_notes = efficiency_differences(runs, options.objectives)
    names = list(options.objectives)
    searched_union = list(dict.fromkeys(k for s in studies for k in s.searched))
    point_columns = ["name", "label", "config_id", *names, "n_seeds", "source", "on_front", "on_model_front",
                     "test_ndcg@10", *[k for k in searched_union if k in points]]
    front = points[points["on_front"]].sort_values(names[0], ascending=options.objectives[names[0]] == "min")

    tables = {
        "studies": studies_frame, "datasets": datasets, "environment": environment,
        "configurations": points, "selected": chosen, "results": numbers, "results_formatted": table,
        "pareto_front": front[[c for c in point_columns if c in front]],
        "hypervolume": result.hypervolumes,
        "hv_reference": pd.DataFrame([{"objective": n, "sense": options.objectives[n], "reference": result.reference[n],
                                       "ideal": result.ideal[n]} for n in names]),
        "significance": sig, "extra": extras,
    }
    pairs_rows = []
    for a, b in result.pairs:
        on_front = points[points[pair_column(a, b)]]
        for _, row in on_front.sort_values(a, ascending=options.objectives[a] == "min").iterrows():
            pairs_rows.append({"x": a, "y": b, "name": row["name"], "label": row["label"],
                               "config_id": row["config_id"], "x_value": row[a], "y_value": row[b]})
    tables["pareto_2d"] = pd.DataFrame(pairs_rows, columns=["x", "y", "name", "label", "config_id", "x_value",
                                                            "y_value"])
    for stem, frame in tables.items():
        write_table(frame, out_dir, stem)

    doc = compose(studies=studies, runs=runs, options=options, select=select, reference=reference,
                  synthetic=synthetic, protocol_notes=protocol_notes, efficiency_notes=efficiency_notes,
                  tables=tables, table_notes=table_notes,
                  result=result, figures=figures, hparam_figures=hparam_figures, point_columns=point_columns)
    title = "Study report: " + ", ".join(s.name for s in studies)
    (out_dir / "report.md").write_text(doc.markdown(out_dir))
    (out_dir / "report.html").write_text(doc.html(title))
    return {"out": out_dir, "tables": tables, "figures": [p for p, _ in figures + hparam_figures],
            "reference": reference, "select_metric": select}


def compose(*, studies: list[StudyResults], runs: pd.DataFrame, options: ReportOptions, select: str,
            reference: str | None, synthetic: bool, protocol_notes: list[str], efficiency_notes: list[str],
            tables: dict[str, pd.DataFrame],
            table_notes: list[str], result: ParetoResult, figures: list[tuple[Path, str]],
            hparam_figures: list[tuple[Path, str]],
            point_columns: list[str]) -> Document:
    doc = Document()
    names = list(options.objectives)
    doc.heading(1, "Study report: " + ", ".join(s.name for s in studies))
    if synthetic:
        doc.warning("SYNTHETIC DATA. These studies ran on generated sequences: the numbers test the pipeline and "
                    "compare costs; they are not evidence about recommendation accuracy on real data.")
    if protocol_notes:
        doc.warning("MIXED PROTOCOLS (--allow-mixed-protocols): " + " | ".join(protocol_notes) + ". Metrics from "
                    "different protocols are not comparable; read each row in its own context.")
    if efficiency_notes:
        doc.warning("EFFICIENCY FIGURES DIFFER IN HOW THEY WERE MEASURED: " + "; ".join(efficiency_notes) + ". Memory "
                    "and latency compare only between runs measured the same way; read the fronts with care.")
    doc.para(f"Configurations are selected on validation (`{select}`); every test figure is that of the trial's "
             "best-validation epoch and is reported, never used for selection. A configuration's value is its mean "
             "over seeds: over its replicates when it has any (python -m study.replicate), else over its sweep trials.")

    doc.heading(2, "Studies and protocol")
    doc.table(_formatted(tables["studies"].drop(columns=["folder"])))
    protocol = runs.drop_duplicates("study").set_index("study")
    rows = []
    for s in studies:
        p = protocol.loc[s.name]
        rows.append({"study": s.name, "dataset": p.get("dataset"), "ranking": p.get("eval_mode"),
                     "negatives": f"{p.get('num_negatives')} ({p.get('negative_sampler')})"
                     if p.get("eval_mode") == "sampled" else "all items",
                     "mask history": p.get("mask_history"),
                     "training objective": ", ".join(sorted(set(runs.loc[runs["study"] == s.name, "objective"]
                                                                .astype(str)))) if "objective" in runs else "",
                     "max epochs": (s.study.get("budget") or {}).get("max_epochs"),
                     "scheduler": (s.study.get("scheduler") or {}).get("type", "none") if s.study else "",
                     "sampler": s.study.get("sampler")})
    doc.table(_formatted(pd.DataFrame(rows)))
    doc.para("Each study's resolved configuration (search space, budget, resources) is in the appendix.")

    doc.heading(2, "Dataset")
    datasets = tables["datasets"]
    doc.table(_formatted(datasets, 4))
    if "users" not in datasets or datasets["users"].isna().any():
        doc.para("Statistics are read from the prepared copy in this machine's data cache (`$SEQREC_DATA`); a "
                 "dataset without them was not found there (prepare it with python -m study.data prepare).")

    doc.heading(2, "Environment")
    environment = tables["environment"]
    doc.table(_formatted(environment))
    accelerators = set(environment["accelerator"].astype(str))
    doc.para("Efficiency figures (memory, latency, throughput) were measured on "
             + (" and ".join(sorted(accelerators)) if accelerators else "an unknown device")
             + "; they compare configurations measured on the same machine, not across machines.")

    doc.heading(2, "Results")
    doc.para(f"Test metrics of each model's chosen configuration (best mean `{select}`), mean ± std over n seeds; "
             "best mean in bold.")
    doc.table(tables["results_formatted"])
    if table_notes:
        doc.bullets(table_notes)
    selected = tables["selected"]
    doc.para("Chosen configurations:")
    shown = ["label", "name", "config_id", "source", "n_seeds", "seeds", select, *EFFICIENCY_METRICS[:3]]
    keys = list(dict.fromkeys(k for s in studies for k in s.searched))
    doc.table(_formatted(selected[[c for c in shown + keys if c in selected]], plain=keys))

    doc.heading(2, "Significance")
    sig = tables["significance"]
    if reference is None:
        doc.para(f"No tests: the reference model ({DEFAULT_REFERENCE_MODEL} by default) is not among the studies; "
                 "name one with --reference.")
    elif sig.empty:
        doc.para("No tests: a single model has nothing to be compared with.")
    else:
        untested = sig[sig["test"] == "none"]
        if not untested.empty:
            doc.warning(f"{len(untested)} of {len(sig)} comparisons have no p-value: fewer than "
                        f"{significance.MIN_SEEDS} seeds on a side. Replicate the chosen configurations first: "
                        "python -m study.replicate results/<study> --seeds 5 --select top:1")
        doc.para(f"Each model's chosen configuration against {reference}'s, per metric: two-sided t-test over seeds "
                 "(paired when both sides ran the same seeds, Welch's otherwise), a rank test as robustness check "
                 "(Wilcoxon signed-rank when paired, Mann–Whitney U otherwise), Cohen's d_z (paired) or d (pooled "
                 "SD), and the 95 % confidence interval of the mean difference (model − reference). p-values are "
                 f"Holm–Bonferroni adjusted over all {len(sig)} comparisons of this report (the rank-test p-values as "
                 f"a family of their own); * = adjusted t-test p < {options.alpha}.")
        doc.table(_significance_display(sig))

    doc.heading(2, "Pareto fronts")
    objectives_text = ", ".join(f"`{n}` ({'↑' if options.objectives[n] == 'max' else '↓'})" for n in names)
    doc.para(f"Objectives: {objectives_text}. Each point is a configuration (mean over its seeds). The "
             f"{len(names)}-D non-dominated set over all models:")
    front = tables["pareto_front"]
    doc.table(_formatted(front, plain=keys))
    reference_text = ", ".join(f"`{n}` = {fmt(result.reference[n])}" for n in names)
    doc.para(f"Hypervolume reference point: {reference_text} ({result.reference_note}). `hv_share` is the "
             "hypervolume divided by the box between the ideal point (best observed value of each objective) and "
             "the reference: comparable across models because all share that point.")
    doc.table(_formatted(tables["hypervolume"], 4))
    if result.pairs:
        pairs = tables["pareto_2d"]
        doc.para("2-D fronts of every objective pair (all models):")
        listed = [{"pair": f"{a} / {b}", "front (best first along the pair's first objective)":
                   ", ".join(pairs[(pairs["x"] == a) & (pairs["y"] == b)]["name"])} for a, b in result.pairs]
        doc.table(pd.DataFrame(listed))
    for path, caption in figures:
        doc.image(path, caption)
    if hparam_figures:
        doc.heading(3, "Hyperparameters against objectives")
        for path, caption in hparam_figures:
            doc.image(path, caption)

    extras = tables["extra"]
    if not extras.empty:
        doc.heading(2, "Model statistics")
        title = "From each chosen configuration's `extra` column, mean ± std over its seeds"
        if extras["statistic"].astype(str).str.startswith("expert").any():
            title += " (ELASTIC: expert usage of the validation pass at the best epoch)"
        doc.para(title + ".")
        doc.table(_formatted(extras))

    doc.heading(2, "Appendix: study configurations")
    for s in studies:
        if s.study:
            shown = {k: s.study[k] for k in ("model", "dataset", "protocol", "fixed", "search", "objectives", "budget",
                                             "scheduler", "resources", "sampler", "seeds") if k in s.study}
            doc.para(f"`{s.name}` (resolved `{STUDY_FILE}`):")
            doc.code(yaml.safe_dump(shown, sort_keys=False, default_flow_style=None, width=110))
        else:
            doc.para(f"`{s.name}`: no `{STUDY_FILE}` in {s.path}.")

    doc.heading(2, "Files")
    doc.para("Every table above is beside this report as CSV and Parquet (`results`, `selected`, `configurations`, "
             "`pareto_front`, `pareto_2d`, `hypervolume`, `hv_reference`, `significance`, `extra`, `studies`, "
             "`datasets`, `environment`); plots as PNG and SVG.")
    return doc


def _significance_display(sig: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, s in sig.iterrows():
        n = f"{s['n_pairs']} pairs" if s["test"] == "paired-t" else f"{s['n_candidate']} / {s['n_reference']}"
        ci = f"[{fmt(s['ci_low'])}, {fmt(s['ci_high'])}]" if not pd.isna(s["ci_low"]) else "–"
        rows.append({"model": s["candidate"], "metric": short(s["metric"]), "test": s["test"], "n": n,
                     "mean diff": fmt(s["mean_diff"]), "95% CI": ci,
                     "t (df)": f"{s['t']:.3f} ({s['df']:.4g})" if not pd.isna(s["t"]) else "–",
                     "p": fmt_p(s["p"]), "p Holm": fmt_p(s["p_holm"]) + ("*" if _is_true(s["significant"]) else ""),
                     "effect": f"{s['effect_kind']} = {s['effect']:.3f}" if not pd.isna(s["effect"]) else "–",
                     "rank test p (Holm)": f"{fmt_p(s['robust_p'])} ({fmt_p(s['robust_p_holm'])})"
                     if s["robust_test"] else "–", "note": s["note"] or ""})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------------
# Command line


def parse_hv_reference(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    values = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.rpartition("=")
        try:
            values[name] = float(value)
        except ValueError:
            raise UserError(f"--hv-reference {part!r}: expected METRIC=NUMBER") from None
        if not sep or not name:
            raise UserError(f"--hv-reference {part!r}: expected METRIC=NUMBER")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m study.report",
        description="Pareto fronts, a paper-style results table and significance tests over one or several "
                    "studies (e.g. one per model); writes report.md, report.html, plots and CSV/Parquet tables.")
    parser.add_argument("studies", nargs="+", help="results folders written by python -m study.sweep, or the URIs "
                                                   "they were mirrored to (s3://…: fetched into results/ first)")
    parser.add_argument("--out", help="output folder (default: <study>/report, or report-<a>+<b> beside the studies)")
    parser.add_argument("--objectives", default=pareto.format_objectives(pareto.DEFAULT_OBJECTIVES),
                        help="Pareto objectives as METRIC:max|min,… (default %(default)s); validation metrics and "
                             "efficiency figures only")
    parser.add_argument("--select-metric", help="validation metric that chooses each model's configuration "
                                                "(default: the first valid_ objective)")
    parser.add_argument("--metrics", default=",".join(TABLE_METRICS),
                        help="metrics of the results table and the tests (default %(default)s)")
    parser.add_argument("--reference", help=f"reference model of the significance tests (default: "
                                            f"{DEFAULT_REFERENCE_MODEL} when present)")
    parser.add_argument("--proposed", help="the model whose relative improvement over the best other model the "
                                           "results table reports (default: best vs runner-up)")
    parser.add_argument("--hv-reference", help="hypervolume reference point as METRIC=VALUE,… (default: the worst "
                                               "observed value of each objective, moved out by --margin of its range)")
    parser.add_argument("--margin", type=float, default=pareto.REFERENCE_MARGIN,
                        help="fraction of the observed range added beyond the worst value (default %(default)s)")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level after Holm (default 0.05)")
    parser.add_argument("--allow-mixed-protocols", action="store_true",
                        help="report studies evaluated under different data or ranking protocols side by side")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if not 0 < args.alpha < 1:
            raise UserError(f"--alpha must lie in (0, 1), got {args.alpha}")
        if args.margin < 0:
            raise UserError(f"--margin must be >= 0, got {args.margin}")
        metrics = tuple(m.strip() for m in args.metrics.split(",") if m.strip())
        if not metrics:
            raise UserError("--metrics is empty")
        other = [m for m in metrics if not m.startswith(("test_", "valid_"))]
        if other:
            raise UserError(f"--metrics {other[0]}: the results table holds accuracy metrics (test_… or valid_…); "
                            "efficiency figures are in the chosen-configurations and Pareto tables")
        options = ReportOptions(objectives=pareto.parse_objectives(args.objectives), reference_model=args.reference,
                                proposed=args.proposed, select_metric=args.select_metric, metrics=metrics,
                                hv_reference=parse_hv_reference(args.hv_reference), margin=args.margin,
                                alpha=args.alpha, allow_mixed_protocols=args.allow_mixed_protocols,
                                plots=not args.no_plots)
        outcome = build_report(args.studies, args.out, options)
    except UserError as error:
        return print_error(error)
    out = outcome["out"]
    print(f"report: {out / 'report.md'}\n        {out / 'report.html'}")
    print(f"tables and plots: {out}")
    return 0

