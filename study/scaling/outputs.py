"""A scaling study's results folder: ``cells.parquet`` / ``cells.csv`` (one row per cell, failures included),
``summary.csv``, log-log and ratio plots (PNG + SVG) and ``scaling.md``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from study.scaling.analysis import ClaimResult, Growth, check_claims, expectation, format_value, ratio_frame, summarise

if TYPE_CHECKING:
    from study.scaling.cells import RealBatch
    from study.spec.scaling_file import Cell, ScalingStudy


def write_plots(frame: Any, study: ScalingStudy, out: Path) -> list[Path]:
    """memory.*, time.* (log-log against N), energy.* where a cell's energy was measured, and memory_ratio.*,
    time_ratio.* (against the reference)."""
    from study.analysis import plots

    ok = frame[frame["status"] == "ok"].copy()
    if ok.empty:
        return []
    labels = [e.label for e in study.models]
    palette = plots.palette_for(labels)  # a model keeps its colour in every figure, reference left out or not
    facets = {"col": "mode", "col_order": [m for m in study.modes if m in set(ok["mode"])], "palette": palette}
    if len(study.batch_keys()) > 1:
        facets.update(row="batch", row_order=study.batch_keys())
    paths = []
    for column, stem, ylabel in (("peak_mem_mb", "memory", "peak memory (MB)"),
                                 ("time_ms_median", "time", "median time (ms)"),
                                 ("energy_j_per_run", "energy", "energy per run (J)")):
        data = ok[ok[column] > 0]  # NaN (energy not measured) compares False: no figure without a value
        if data.empty:
            continue
        figure = plots.loglog_lines(data, x="length", y=column, hue="label", xlabel="sequence length N",
                                    ylabel=ylabel, hue_order=[x for x in labels if x in set(data["label"])],
                                    title=f"{study.name}: {ylabel} against N", **facets)
        paths += plots.save_figure(figure, out / stem)
    ratios = ratio_frame(frame, study.reference)
    ratios = ratios[ratios["label"] != study.reference]
    for column, stem, ylabel in (("memory_ratio", "memory_ratio", f"peak memory / {study.reference}"),
                                 ("time_ratio", "time_ratio", f"time / {study.reference}")):
        data = ratios[ratios[column].notna() & (ratios[column] > 0)]
        if data.empty:
            continue
        figure = plots.ratio_lines(data, x="length", y=column, hue="label", xlabel="sequence length N",
                                   ylabel=ylabel, hue_order=[x for x in labels if x in set(data["label"])],
                                   title=f"{study.name}: {ylabel} (below 1 = cheaper than the reference)", **facets)
        paths += plots.save_figure(figure, out / stem)
    return paths


def write_markdown(frame: Any, summary: Any, claims: list[ClaimResult], study: ScalingStudy, env: dict[str, Any],
                   sequences: str) -> str:
    """scaling.md: the analogue of ELASTIC's Figure 3 as a table, the claims, the cells and the environment."""
    import models

    lines = [f"# Scaling study `{study.name}`", "", *_setup_lines(frame, study, env, sequences), "",
             *_growth_table(summary, study), "", "## Paper claims", ""]
    if claims:
        lines += [f"- {result.line}" for result in claims]
        lines += ["", "The papers measured GPUs (ELASTIC: unspecified; LISA: V100, attention module only; Cotten4Rec: "
                  "V100, whole training step); these figures are whole models on the device above, so a miss says "
                  "what this configuration does here, not that the paper is wrong."]
    else:
        lines.append("No claims configured.")
    failed = frame[~frame["status"].isin(("ok", "skipped"))]
    if len(failed):
        lines += ["", "## Cells that did not finish", ""]
        lines += [f"- {row['label']} {row['mode']} N={row['length']} batch {row['batch']}: {row['status']}: "
                  f"{row['error']}" for _, row in failed.iterrows()]
    energy = energy_lines(frame)
    lines += energy
    unused = sorted(set(models.available()) - {e.model for e in study.models})
    if unused:
        lines += ["", f"Registered models not in this grid: {', '.join(unused)}."]
    lines += ["", "Files: cells.parquet / cells.csv (every cell), summary.csv (this table), memory.*, time.*, "
              f"{'energy.*, ' if energy else ''}memory_ratio.*, time_ratio.* (PNG + SVG), environment.json.", ""]
    return "\n".join(lines)


def _setup_lines(frame: Any, study: ScalingStudy, env: dict[str, Any], sequences: str) -> list[str]:
    """What was measured and how: the grid, the sequences, the step timed, the measurement and the machine."""
    hardware = env.get("hardware", {})
    gpus = hardware.get("gpus") or []
    device = ", ".join(g["name"] for g in gpus) if gpus else f"CPU: {hardware.get('cpu_model', '?')}"
    counts = frame["status"].value_counts().to_dict()
    by_objective: dict[str, list[str]] = {}
    for entry in study.models:
        by_objective.setdefault(entry.train["objective"], []).append(entry.label)
    methods = frame["mem_method"].dropna()
    method = methods.iloc[0].split(", first")[0] if len(methods) else "n/a"
    limit_mb = study.measure["memory_limit_mb"]
    limit = f"{limit_mb:g} MB" if limit_mb else "none"
    run = env.get("scaling_run", {})
    loads = run.get("load_average_1min", {})
    load = ""
    if loads.get("start") is not None:
        load = (f"; load average {loads['start']:g} at the start, {loads['end']:g} at the end (above the core "
                "count, other jobs shared the CPU and the timings are noisy)"
                if max(loads["start"], loads["end"] or 0) > (hardware.get("cpus_usable") or 1)
                else f"; load average {loads['start']:g} at the start, {loads['end']:g} at the end")
    objectives = "; ".join(f"{objective} ({', '.join(labels)})" for objective, labels in by_objective.items()) \
        if len(by_objective) > 1 else next(iter(by_objective), "?")
    return [
        f"Peak memory and latency against sequence length N ∈ {{{', '.join(map(str, study.lengths))}}}, batch "
        f"{', '.join(study.batch_keys())}, modes {', '.join(study.modes)}; {len(frame)} cells "
        f"({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}).",
        "",
        f"- **Sequences**: {sequences}",
        f"- **Catalogue**: {int(frame['num_items'].iloc[0]):,} items (scores and loss run over all of them).",
        f"- **Train** = one step (forward + backward + Adam) with objective {objectives}; **inference** = "
        f"encoder + scores over all items + top-{study.measure['top_k']} for the batch.",
        f"- **Measurement**: each cell a Ray task measuring in a fresh process of its own; peak memory of the "
        f"first run ({method}); {study.measure['warmup']} warm-up run(s) including that one, then "
        f"{study.measure['repeats']} timed (median, p95); memory limit {limit}, timeout "
        f"{study.measure['timeout_s']:g} s per cell.",
        f"- **Device**: {device}; {hardware.get('cpus_usable', '?')} usable cores; threads per cell "
        f"{int(study.resources['cpu'])}, {run.get('cells_at_a_time', '?')} cell(s) at a time{load}; torch "
        f"{env.get('torch', {}).get('version', '?')}, ray {env.get('packages', {}).get('ray', '?')}.",
    ]


def _growth_table(summary: Any, study: ScalingStudy) -> list[str]:
    """The growth exponents of time and memory in N and each model's ratios to the reference at the compared N."""
    n = study.compare_length
    lines = [
        f"## Growth exponents (fit over N ≥ {study.fit_min_length}) and ratios at N = {n} "
        f"(reference: {study.reference})",
        "",
        "Exponent = slope of log(value) against log(N) (1 = linear, 2 = quadratic); R² of that line. Speed-up = "
        "reference time / model time; memory = model memory / reference memory.",
        "",
        f"| model | mode | batch | time exponent | memory exponent | time @{n} | memory @{n} | speed-up vs "
        f"{study.reference} | memory vs {study.reference} | expected | failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, row in summary.iterrows():
        time_fit = Growth(row["time_exponent"], row["time_r2"], row["time_points"])
        memory_fit = Growth(row["memory_exponent"], row["memory_r2"], row["memory_points"])
        speedup = f"{row['speedup_vs_reference']:.2f}×" if math.isfinite(row["speedup_vs_reference"]) else "n/a"
        memory = f"{row['memory_vs_reference']:.3f}×" if math.isfinite(row["memory_vs_reference"]) else "n/a"
        lines.append(f"| {row['label']} | {row['mode']} | {row['batch']} | {time_fit.describe()} | "
                     f"{memory_fit.describe()} | {format_value(row['time_ms'], ' ms')} | "
                     f"{format_value(row['memory_mb'], ' MB')} | {speedup} | {memory} | {expectation(row)} | "
                     f"{row['failures'] or ''} |")
    return lines


def energy_lines(frame: Any) -> list[str]:
    """scaling.md's energy section: joules per run against N, one row per model, mode and batch; nothing where no
    cell's energy was measured (no NVML device, no readable RAPL: ``energy_method`` unavailable)."""
    measured = frame[(frame["status"] == "ok") & (frame["energy_j_per_run"] > 0)]
    if measured.empty:
        return []
    methods = ", ".join(sorted(set(measured["energy_method"].astype(str))))
    lengths = sorted(set(measured["length"]))
    lines = ["", "## Energy", "",
             f"Joules of one run (a training step or an inference batch), read from the device's counter ({methods}) "
             "over back-to-back runs of at least a second; the counter measures the whole device, idle power and "
             "any other work on it included.", "",
             "| model | mode | batch | " + " | ".join(f"N={n}" for n in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    for (label, mode, batch), rows in measured.groupby(["label", "mode", "batch"], sort=False):
        by_length = dict(zip(rows["length"], rows["energy_j_per_run"]))
        lines.append(f"| {label} | {mode} | {batch} | "
                     + " | ".join(_joules(by_length.get(n, float("nan"))) for n in lengths) + " |")
    return lines


def _joules(value: float) -> str:
    return f"{value:.3g} J" if math.isfinite(value) else "n/a"  # a GPU's inference batch can take millijoules


def cell_rows(study: ScalingStudy, cells: list[Cell], outcomes: list[dict], batches: dict, meta: dict,
          num_items: int, specs: list[dict]) -> Any:
    import pandas as pd

    by_cell = {o["cell"]: o for o in outcomes}
    rows = []
    for cell, spec in zip(cells, specs):
        outcome = by_cell.get(cell.index, {"status": "not run", "error": "the study was interrupted"})
        batch = batches[(cell.length, cell.batch_size)]
        entry = study.entry(cell.label)
        row = {
            "study": study.name, "cell": cell.index, "label": cell.label, "model": cell.model, "mode": cell.mode,
            "length": cell.length, "batch": cell.batch_key, "batch_size": cell.batch_size,
            "tokens": cell.length * cell.batch_size, "num_items": num_items, "objective": entry.train["objective"],
            "status": outcome["status"], "error": outcome.get("error", ""),
            "time_ms_median": outcome.get("time_ms_median", float("nan")),
            "time_ms_p95": outcome.get("time_ms_p95", float("nan")),
            "time_ms_min": outcome.get("time_ms_min", float("nan")), "runs": outcome.get("runs", 0),
            "peak_mem_mb": outcome.get("peak_mem_mb", float("nan")), "mem_method": outcome.get("mem_method"),
            "energy_j_per_run": outcome.get("energy_j_per_run", float("nan")),
            "energy_method": outcome.get("energy_method", "unavailable"),
            "memory_limit": outcome.get("memory_limit", ""), "params": outcome.get("params", 0),
            "device": spec["device"], "device_name": outcome.get("device_name", ""), "node": outcome.get("node", ""),
            "threads": outcome.get("threads", spec["threads"]), "niceness": outcome.get("niceness"),
            "kernel_path": outcome.get("kernel_path", ""),
            "dataset": meta.get("name", ""), "dataset_hash": meta.get("content_hash", ""),
            "synthetic": bool(meta.get("synthetic", False)), "sequences": batch.description,
            "tiled_rows": batch.tiled_rows, "wall_s": outcome.get("wall_s", float("nan")),
            "config": json.dumps(entry.config, sort_keys=True),
        }
        rows.append(row)
    return pd.DataFrame(rows)


def sequence_summary(batches: dict[tuple[int, int], RealBatch], meta: dict) -> str:
    lengths = meta.get("length") or {}  # the prepared dataset's sequence-length statistics
    tiled = {key: b.tiled_rows for key, b in batches.items()}
    worst = max(tiled, key=lambda key: (key[0], key[1]))
    name = meta.get("name", "?")
    kind = "synthetic (generated) histories" if meta.get("synthetic") else "real user histories"
    detail = ""
    if isinstance(lengths, dict) and "median" in lengths:
        detail = f" (median history {lengths['median']:g} items)"
    return (f"{kind} from {name}{detail}, {meta.get('num_users', '?'):,} users, {meta.get('num_items', '?'):,} items; "
            f"each row is one user's most recent N + 1 items, tiled (repeated end to end) when the history is "
            f"shorter: at N = {worst[0]}, {tiled[worst]} of {worst[1]} rows are tiled. The same users fill every "
            f"model's batch at a given (N, batch).")


def write_outputs(frame: Any, study: ScalingStudy, env: dict[str, Any], sequences: str) -> dict[str, Any]:
    """Parquet + CSV of the cells, the summary, the plots and scaling.md in ``study.storage``."""
    out = study.storage
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / "cells.parquet", index=False)
    frame.to_csv(out / "cells.csv", index=False)
    summary = summarise(frame, study)
    summary.to_csv(out / "summary.csv", index=False)
    claims = check_claims(frame, study)
    plots = write_plots(frame, study, out)
    markdown = write_markdown(frame, summary, claims, study, env, sequences)
    (out / "scaling.md").write_text(markdown)
    counts = frame["status"].value_counts().to_dict()
    lines = [f"scaling study {study.name}: {len(frame)} cells ("
             + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f"); results in {out}"]
    lines += [f"  {r.verdict}: {r.claim.source} {r.claim.text} (batch {r.batch})" for r in claims]
    return {"out": out, "frame": frame, "summary": summary, "claims": claims, "plots": plots,
            "markdown": out / "scaling.md", "text": "\n".join(lines)}
