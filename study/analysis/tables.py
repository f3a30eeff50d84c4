"""The report's tables: one point per configuration (the mean over its seeds), fronts, tests, and their display.

* :func:`aggregate`: the measured runs of each (label, configuration) → one row, ``<metric>`` the mean over seeds,
  ``<metric>_std`` and ``n_seeds``; :func:`choose` picks each label's configuration on a validation metric;
* :func:`analyse_pareto`: front flags (global, per model, per objective pair) and hypervolumes, through
  :mod:`study.analysis.pareto`; :func:`pareto_pairs_table` lists the 2-D fronts;
* :func:`significance_table`, :func:`results_table` (the paper-style table), :func:`extra_table`, and the
  descriptive tables of the studies, datasets and environments;
* :func:`fmt`, :func:`formatted`, :func:`plain_value`: how numbers are shown (files keep full precision).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from study.analysis import pareto, significance
from study.analysis.runs import StudyResults, parse_config
from study.errors import UserError
from study.train.results import EFFICIENCY_METRICS

# Report tables and plot labels show at most this many significant digits; the CSV and Parquet files keep all.
SIGNIFICANT_DIGITS = 4
# Settings shown beside every configuration even when the study fixed them: they change what a metric means
# (max_len: how much history the model sees), and studies compared in one report may differ in them.
CONFIGURATION_COLUMNS = ("max_len",)
# Marks a mean, or an improvement resting on one, measured on fewer seeds than a test needs (see results_table).
UNTESTED_MARK = "†"


def metric_columns(runs: pd.DataFrame) -> list[str]:
    """The numeric metric columns of the runs: validation, test, efficiency and popularity figures."""
    columns = [c for c in runs.columns
               if c.startswith(("valid_", "test_")) or c in EFFICIENCY_METRICS or c == "pop_ndcg@10"]
    return [c for c in columns if pd.api.types.is_numeric_dtype(runs[c])]


def aggregate(runs: pd.DataFrame, searched: dict[str, list[str]]) -> pd.DataFrame:
    """One row per (label, configuration): mean of every metric over its measured runs, ``<metric>_std``, n.

    Each row carries every study's shown keys (:func:`configuration_keys`), not only its own searched ones: a key
    another study searched and this one fixed (in its study file, or by the model's default) holds the value it
    ran with, from its ``config.<key>`` column; only a key its model lacks stays empty.
    """
    measured = runs[runs["measured"]]
    metrics = metric_columns(measured)
    shown = configuration_keys([key for keys in searched.values() for key in keys])
    rows = []
    for (label, cid), group in measured.groupby(["label", "config_id"], sort=False):
        per_seed = group.groupby("seed")[metrics].mean()  # a seed run twice counts once
        row: dict[str, Any] = {"label": label, "config_id": cid, "study": group["study"].iloc[0],
                               "model": group["model"].iloc[0], "source": group["source"].iloc[0],
                               "n_seeds": len(per_seed), "seeds": ",".join(str(int(s)) for s in sorted(per_seed.index)),
                               "trial_ids": ",".join(group["trial_id"].astype(str)),
                               "source_trial_id": str(group["source_trial_id"].iloc[0])}
        for key in shown:
            column = f"config.{key}"
            if column in group or key in searched.get(label, []):
                row[key] = group[column].iloc[0] if column in group else None
        for metric in metrics:
            row[metric] = per_seed[metric].mean()
            row[f"{metric}_std"] = per_seed[metric].std(ddof=1) if len(per_seed) > 1 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def configuration_keys(searched: list[str]) -> list[str]:
    """The settings a configuration is shown with: :data:`CONFIGURATION_COLUMNS`, then the searched keys."""
    return list(dict.fromkeys([*CONFIGURATION_COLUMNS, *searched]))


def choose(points: pd.DataFrame, select: str) -> pd.DataFrame:
    """Each label's chosen configuration: best mean ``select`` among replicated ones (or all, if none are)."""
    chosen = []
    for _, group in points.groupby("label", sort=False):
        pool = group[group["source"] == "replicate"]
        pool = pool if not pool.empty else group
        chosen.append(pool.sort_values([select, "n_seeds", "config_id"], ascending=[False, False, True]).iloc[0])
    return pd.DataFrame(chosen).reset_index(drop=True)


@dataclass
class ParetoResult:
    points: pd.DataFrame  # every configuration with on_front_3d / on_model_front / on_front_<a>__<b> flags
    reference: dict[str, float]
    ideal: dict[str, float]
    reference_note: str
    hypervolumes: pd.DataFrame  # scope (global | label), configurations, on_front, hv, hv_share
    pairs: list[tuple[str, str]] = field(default_factory=list)


def pair_column(a: str, b: str) -> str:
    """The flag column of the 2-D front of objectives ``a`` and ``b``."""
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


def pareto_pairs_table(result: ParetoResult, objectives: dict[str, str]) -> pd.DataFrame:
    """The 2-D front of every objective pair, best first along the pair's first objective."""
    points = result.points
    rows = []
    for a, b in result.pairs:
        on_front = points[points[pair_column(a, b)]]
        for _, row in on_front.sort_values(a, ascending=objectives[a] == "min").iterrows():
            rows.append({"x": a, "y": b, "name": row["name"], "label": row["label"],
                         "config_id": row["config_id"], "x_value": row[a], "y_value": row[b]})
    return pd.DataFrame(rows, columns=["x", "y", "name", "label", "config_id", "x_value", "y_value"])


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
                       split=meta.get("split"))  # max_len is a configuration setting: shown with the configurations
        rows.append(row)
    return pd.DataFrame(rows)


def _environments(studies: list[StudyResults]) -> list[tuple[str, str, dict[str, Any]]]:
    """(study, which runs, environment) of every sweep and replicate batch."""
    sessions = [(s.name, "sweep", s.environment) for s in studies]
    return sessions + [(s.name, f"replicates {batch}", env)
                       for s in studies for batch, env in s.replicate_environments.items()]


def sessions_of(env: dict[str, Any]) -> list[dict[str, Any]]:
    """Every session that ran part of a study, first to last: each ``--resume`` collects the environment anew and
    keeps the earlier ones under ``previous_sessions``."""
    earlier = env.get("previous_sessions") or []
    return [*(e for e in earlier if isinstance(e, dict)), {k: v for k, v in env.items() if k != "previous_sessions"}]


def _machine(env: dict[str, Any]) -> str:
    hardware = env.get("hardware", {})
    gpus = ", ".join(g.get("name", "?") for g in hardware.get("gpus", []) or [])
    return f"{hardware.get('accelerator', 'unknown')} ({gpus or _cpu(hardware) or '?'})"


def _cpu(hardware: dict[str, Any]) -> str | None:
    """The CPU model and the kernels torch ran on it (:mod:`study.environment`: they change a seed's results);
    environments recorded before the kernels were have the model alone."""
    model, kernels = hardware.get("cpu_model"), hardware.get("cpu_kernels")
    return f"{model or '?'}, {kernels}" if kernels else model


def environment_table(studies: list[StudyResults], runs: pd.DataFrame) -> pd.DataFrame:
    """One row per sweep and replicate batch: the machine and versions of its last session, when its first session
    started (when it ran: a ``--resume`` records its own time, see :func:`sessions_of`) and how many there were."""
    rows = []
    for name, part, env in _environments(studies):
        hardware = env.get("hardware", {})
        packages = env.get("packages", {})
        gpus = ", ".join(g.get("name", "?") for g in hardware.get("gpus", []) or [])
        devices = ", ".join(sorted(set(runs.loc[runs["study"] == name, "device"].dropna().astype(str)))) \
            if "device" in runs else ""
        code = env.get("code", {})
        sessions = sessions_of(env)
        rows.append({"study": name, "runs": part, "accelerator": hardware.get("accelerator", "unknown"),
                     "devices": devices, "cpu": _cpu(hardware), "cpus": hardware.get("cpus_usable"),
                     "memory_gib": hardware.get("memory_gib"), "gpus": gpus or "none",
                     "torch": packages.get("torch"), "ray": packages.get("ray"), "optuna": packages.get("optuna"),
                     "commit": (str(code.get("commit") or "")[:10] + ("+dirty" if code.get("dirty") else "")) or None,
                     "started": sessions[0].get("recorded"), "sessions": len(sessions)})
    return pd.DataFrame(rows)


def resumed_notes(studies: list[StudyResults]) -> list[str]:
    """A line per sweep or replicate batch that ran in several sessions: when each started, and whether the
    sessions ran on different machines (the environment table shows the last one's)."""
    notes = []
    for name, part, env in _environments(studies):
        sessions = sessions_of(env)
        if len(sessions) < 2:
            continue
        times = [str(s.get("recorded") or "?") for s in sessions]
        note = (f"`{name}` ({part}) ran in {len(sessions)} sessions: started {times[0]}, resumed "
                f"{', '.join(times[1:])}; its row shows the last session's machine")
        machines = list(dict.fromkeys(_machine(s) for s in sessions))
        if len(machines) > 1:
            note += f" (the sessions ran on {'; '.join(machines)})"
        notes.append(note + ".")
    return notes


def study_table(studies: list[StudyResults]) -> pd.DataFrame:
    rows = []
    for s in studies:
        trials = s.trials
        stop = trials.get("stop_reason", pd.Series(dtype=str))
        reps = s.replicates
        rows.append({"study": s.name, "model": s.model, "label": s.label, "folder": str(s.path),
                     "trials": len(trials), "ok": int((trials["status"] == "ok").sum()),
                     "failed": int((trials["status"] != "ok").sum()), "stopped_early": int((stop == "stopped").sum()),
                     "unfinished": len(s.unfinished),
                     "replicates": len(reps), "replicates_ok": int((reps["status"] == "ok").sum()) if not reps.empty
                     else 0, "searched": ", ".join(s.searched)})
    return pd.DataFrame(rows)


def fmt(value: Any, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A number for display, rounded to ``digits`` significant digits: ``0.1235``, ``12.35``, ``1,235``,
    ``1,235,000``; scientific below 1e-4 and from 1e9. Integers (counts) are shown exactly."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if value == 0 or not math.isfinite(value):
            return str(value) if value else "0"
        rounded = float(f"{value:.{digits}g}")
        magnitude = math.floor(math.log10(abs(rounded)))
        if magnitude < -4 or magnitude >= 9:
            return f"{value:.{digits - 1}e}"
        if magnitude >= digits - 1:
            return f"{rounded:,.0f}"
        return f"{rounded:.{digits - 1 - magnitude}f}"
    return str(value)


def fmt_p(p: float) -> str:
    """A p-value for display; below 1e-4 as ``<0.0001``."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    return "<0.0001" if p < 1e-4 else fmt(float(p))


def fmt_metric(value: float) -> str:
    """An accuracy metric as papers print it: four decimals (at most 4 significant digits below 1)."""
    if pd.isna(value):
        return "–"
    return f"{value:.4f}" if abs(value) < 1 else fmt(float(value))


def results_table(chosen: pd.DataFrame, metrics: list[str], sig: pd.DataFrame, reference: str | None,
                  proposed: str | None) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The paper table (strings) and its numbers; best mean in bold, ``*`` = significant vs the reference.

    A row measured on fewer than :data:`~study.analysis.significance.MIN_SEEDS` seeds has no spread and no test, so
    the table says so itself (:data:`UNTESTED_MARK` on its n, on an improvement that rests on it, and a note)
    instead of dressing a single run as a result: its best mean is not bold.
    """
    numbers = pd.DataFrame([{"label": row["label"], "config": row["name"], "metric": metric, "mean": row[metric],
                             "std": row.get(f"{metric}_std"), "n_seeds": row["n_seeds"]}
                            for _, row in chosen.iterrows() for metric in metrics])
    marks = {(s["candidate"], s["metric"]): "*" for _, s in sig.iterrows() if is_set(s["significant"])} \
        if not sig.empty else {}
    untested = chosen["n_seeds"] < significance.MIN_SEEDS
    table = []
    for (_, row), single in zip(chosen.iterrows(), untested):
        cells: dict[str, str] = {"model": row["label"], "n": f"{row['n_seeds']}{UNTESTED_MARK if single else ''}"}
        for metric in metrics:
            mean, std = row[metric], row.get(f"{metric}_std")
            text = fmt_metric(mean)
            if not pd.isna(mean) and mean == chosen[metric].max() and not single:
                text = f"**{text}**"
            if std is not None and not pd.isna(std):
                text += f" ± {fmt_metric(std)}"
            cells[short(metric)] = text + marks.get((row["label"], metric), "")
        table.append(cells)
    notes = []
    if len(chosen) > 1:
        improvement, note = _improvement_row(chosen, metrics, proposed)
        table.append(improvement)
        notes.append(note)
    if untested.any():
        notes.append(f"{UNTESTED_MARK} n = {'/'.join(sorted({str(n) for n in chosen.loc[untested, 'n_seeds']}))}: "
                     f"fewer than {significance.MIN_SEEDS} seeds, so no spread and no test; the best mean of such a "
                     "row is not bold, and an improvement resting on it may be the noise of one seed (replicate: "
                     "python -m study.replicate results/<study> --seeds 5 --select top:1).")
    if reference and not sig.empty:
        notes.append(f"* differs from {reference} at Holm-adjusted p < alpha (two-sided t-test over seeds: paired when "
                     "both used the same seeds, Welch otherwise; see the significance table).")
    return pd.DataFrame(table), numbers, notes


def _improvement_row(chosen: pd.DataFrame, metrics: list[str], proposed: str | None) -> tuple[dict[str, str], str]:
    """The ``Improv.`` row (relative difference per metric) and its note; a side of fewer than MIN_SEEDS seeds
    marks the cell with :data:`UNTESTED_MARK`."""
    improvement: dict[str, str] = {"model": "", "n": ""}
    for metric in metrics:
        if proposed:
            top = chosen[chosen["label"] == proposed].iloc[0]
            base = chosen[chosen["label"] != proposed].sort_values(metric, ascending=False).iloc[0]
        else:
            ranked = chosen.sort_values(metric, ascending=False)
            top, base = ranked.iloc[0], ranked.iloc[1]
        gain = (top[metric] - base[metric]) / base[metric] if base[metric] else float("nan")
        sign = "-" if gain < 0 else "+"
        single = min(top["n_seeds"], base["n_seeds"]) < significance.MIN_SEEDS
        improvement[short(metric)] = "–" if math.isnan(gain) else \
            f"{sign}{fmt(abs(gain) * 100)}%{UNTESTED_MARK if single else ''}"
    if proposed:
        improvement["model"] = f"Improv. ({proposed} vs best other)"
        return improvement, f"Improv.: relative difference of {proposed}'s mean from the best other model's mean."
    improvement["model"] = "Improv. (best vs runner-up)"
    return improvement, ("Improv.: relative difference of the best model's mean from the runner-up's, per metric "
                         "(name the proposed model with --proposed to compare it with the best baseline instead).")


def is_set(value: Any) -> bool:
    """True for a set boolean flag; False for False and for missing (NA: no test ran)."""
    return not pd.isna(value) and bool(value)


def short(metric: str) -> str:
    """``test_ndcg@10`` → ``NDCG@10`` for table headers; ``test_sampled_ndcg@10`` (against the sampled test
    negatives, :mod:`study.train.results`) → ``sampled NDCG@10``."""
    name = metric.removeprefix("test_").removeprefix("valid_")
    sampled = name.startswith("sampled_")
    base, _, k = name.removeprefix("sampled_").partition("@")
    if not k:
        return name
    return f"{'sampled ' if sampled else ''}{base.upper()}@{k}"


def formatted(frame: pd.DataFrame, digits: int = SIGNIFICANT_DIGITS, plain: Iterable[str] = ()) -> pd.DataFrame:
    """Display strings; ``plain`` columns (hyperparameter values) as a study file writes them (:func:`plain_value`)."""
    if frame.empty:
        return frame
    plain = set(plain)
    return pd.DataFrame({c: [plain_value(v) if c in plain else fmt(v, digits) for v in frame[c]]
                         for c in frame.columns})


def plain_value(value: Any) -> str:
    """A hyperparameter value as a study file writes it: 16, not 16.0 (pandas turns ints into floats beside NaN);
    a sampled float to 4 significant digits (0.0003162, not 0.00031622776601683794)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return str(int(value)) if value.is_integer() else f"{value:.{SIGNIFICANT_DIGITS}g}"
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
