"""What a scaling study's cells say: growth exponents (log-log fits), ratios against the reference model, the
summary table and the paper claims checked against the measurements."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from study.analysis.claims import CONTRADICTED, HOLDS, Claim
from study.spec.scaling_file import EXPECTED_GROWTH, METRICS

if TYPE_CHECKING:
    from study.spec.scaling_file import ScalingStudy


@dataclass
class Growth:
    """Least-squares slope of log(value) against log(N): value ∝ N^exponent."""

    exponent: float
    r2: float
    points: int

    def describe(self) -> str:
        if not math.isfinite(self.exponent):
            return f"n/a ({self.points} point{'s' if self.points != 1 else ''})"
        r2 = f"{self.r2:.3f}" if math.isfinite(self.r2) else "n/a"
        return f"{self.exponent:.2f} (R² {r2}, {self.points} pts)"


def fit_growth(lengths: Any, values: Any) -> Growth:
    """Fit value = c·N^k on log-log axes; points that are missing or not positive are left out.

    R² is that of the log-log line (1 = an exact power law). With two points the fit is exact by construction,
    which is why the number of points is reported beside it.
    """
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(values, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    x, y = np.log(x[keep]), np.log(y[keep])
    if len(x) < 2 or np.ptp(x) == 0:
        return Growth(float("nan"), float("nan"), int(len(x)))
    slope, intercept = np.polyfit(x, y, 1)
    residual = ((y - (slope * x + intercept)) ** 2).sum()
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1.0 - residual / total if total > 0 else float("nan")
    return Growth(float(slope), float(r2), int(len(x)))


def ratio_frame(frame: Any, reference: str) -> Any:
    """Every successful cell divided by the reference model's cell of the same mode, batch and length."""
    import pandas as pd

    ok = frame[frame["status"] == "ok"]
    keys = ["mode", "batch", "length"]
    ref = ok[ok["label"] == reference][keys + ["peak_mem_mb", "time_ms_median"]]
    merged = ok.merge(ref, on=keys, suffixes=("", "_ref"))
    if merged.empty:
        return pd.DataFrame(columns=[*keys, "label", "memory_ratio", "time_ratio"])
    memory = merged["peak_mem_mb"] / merged["peak_mem_mb_ref"]
    merged["memory_ratio"] = memory.where((merged["peak_mem_mb"] > 0) & (merged["peak_mem_mb_ref"] > 0))
    merged["time_ratio"] = merged["time_ms_median"] / merged["time_ms_median_ref"]
    return merged


def _cell(frame: Any, label: str, mode: str, batch: str, length: int) -> Any:
    rows = frame[(frame["label"] == label) & (frame["mode"] == mode) & (frame["batch"] == batch)
                 & (frame["length"] == length)]
    return rows.iloc[0] if len(rows) else None


def _failures(rows: Any) -> str:
    """'oom at N=8192; N=16384 skipped' for one series."""
    notes, skipped = [], []
    for _, row in rows.sort_values("length").iterrows():
        if row["status"] == "skipped":
            skipped.append(str(row["length"]))
        elif row["status"] != "ok":
            notes.append(f"{row['status']} at N={row['length']}")
    if skipped:
        notes.append(f"N={','.join(skipped)} skipped")
    return "; ".join(notes)


def summarise(frame: Any, study: ScalingStudy) -> Any:
    """One row per series: fitted time and memory exponents, values and ratios at compare_length, failures."""
    import pandas as pd

    rows = []
    for entry in study.models:
        for mode in study.modes:
            for batch in study.batch_keys():
                series = frame[(frame["label"] == entry.label) & (frame["mode"] == mode) & (frame["batch"] == batch)]
                ok = series[(series["status"] == "ok") & (series["length"] >= study.fit_min_length)]
                time_fit = fit_growth(ok["length"], ok["time_ms_median"])
                memory_fit = fit_growth(ok["length"], ok["peak_mem_mb"])
                here = _cell(frame, entry.label, mode, batch, study.compare_length)
                ref = _cell(frame, study.reference, mode, batch, study.compare_length)
                here_ok = here is not None and here["status"] == "ok"
                both_ok = here_ok and ref is not None and ref["status"] == "ok"
                row = {
                    "label": entry.label, "model": entry.model, "mode": mode, "batch": batch,
                    "time_exponent": time_fit.exponent, "time_r2": time_fit.r2, "time_points": time_fit.points,
                    "memory_exponent": memory_fit.exponent, "memory_r2": memory_fit.r2,
                    "memory_points": memory_fit.points,
                    "compare_length": study.compare_length,
                    "time_ms": here["time_ms_median"] if here_ok else float("nan"),
                    "memory_mb": here["peak_mem_mb"] if here_ok else float("nan"),
                    "speedup_vs_reference": ref["time_ms_median"] / here["time_ms_median"] if both_ok else float("nan"),
                    "memory_vs_reference": (here["peak_mem_mb"] / ref["peak_mem_mb"]
                                            if both_ok and ref["peak_mem_mb"] > 0 else float("nan")),
                    "expected_growth": entry.expected_growth or "",
                    "failures": _failures(series),
                }
                rows.append(row)
    return pd.DataFrame(rows)


def expectation(row: Any) -> str:
    """'met' / 'missed (time 1.31)' against the entry's expected_growth, or '' when none is declared."""
    growth = row["expected_growth"]
    if not growth:
        return ""
    low, high = EXPECTED_GROWTH[growth]
    missed, unknown = [], []
    for metric in ("time", "memory"):
        value = row[f"{metric}_exponent"]
        if not math.isfinite(value):
            unknown.append(metric)
        elif not low <= value <= high:
            missed.append(f"{metric} {value:.2f}")
    bound = f"≤ {high}" if growth == "linear" else f"{low}–{high}"
    if missed:
        return f"{growth} ({bound}): **missed** ({', '.join(missed)})"
    if unknown:
        return f"{growth} ({bound}): not fitted ({', '.join(unknown)})"
    return f"{growth} ({bound}): met"


@dataclass
class ClaimResult:
    claim: Claim
    batch: str
    verdict: str  # holds | contradicted (one measurement each side: no interval) | not tested
    line: str


def format_value(value: float, unit: str = "") -> str:
    """A measured figure for the report: 3 decimals below 10, 1 below 1000, thousands separated; nan is n/a."""
    if not math.isfinite(value):
        return "n/a"
    digits = 3 if abs(value) < 10 else (1 if abs(value) < 1000 else 0)
    return f"{value:,.{digits}f}{unit}"


def check_claims(frame: Any, study: ScalingStudy) -> list[ClaimResult]:
    """Each claim against the measured cells: holds or contradicted with the numbers, or why it could not be
    tested. A cell is one measurement per model, with no interval, so there is no third verdict."""
    results = []
    for claim in study.claims:
        metric, cell = claim.metrics[0], claim.where
        column = METRICS[metric]
        unit = " MB" if metric == "memory" else " ms"
        bound = (f"model/reference ≤ {claim.bound:g}×" if claim.kind == "max_ratio"
                 else f"reference/model ≥ {claim.bound:g}×")
        head = f"{claim.source}: {claim.text}" if claim.source else claim.text
        batches = [str(cell["batch_size"])] if cell.get("batch_size") else study.batch_keys()
        for batch in batches:
            where = f"{cell['mode']}, batch {batch}, N = {cell['length']}"
            here = _cell(frame, claim.candidate, cell["mode"], batch, cell["length"])
            ref = _cell(frame, claim.reference, cell["mode"], batch, cell["length"])
            problems = [f"{label} {row['status']}" + (f" ({row['error']})" if row["status"] != "skipped" else "")
                        for label, row in ((claim.candidate, here), (claim.reference, ref))
                        if row is not None and row["status"] != "ok"]
            if here is None or ref is None or problems:
                reason = "; ".join(problems) if problems else \
                    f"N = {cell['length']} is not in this grid (lengths {study.lengths[0]}–{study.lengths[-1]})"
                hint = _largest_common(frame, claim, batch)
                results.append(ClaimResult(claim, batch, "not tested",
                                           f"**not tested**: {head} [{where}; needs {bound}]: {reason}.{hint}"))
                continue
            value, reference = float(here[column]), float(ref[column])
            if value <= 0 or reference <= 0:
                results.append(ClaimResult(claim, batch, "not tested",
                                           f"**not tested**: {head} [{where}]: a measured {metric} is not "
                                           f"positive ({claim.candidate} {format_value(value, unit)}, "
                                           f"{claim.reference} {format_value(reference, unit)})."))
                continue
            ratio, factor = value / reference, reference / value
            holds = claim.holds(value, reference)
            if metric == "memory":
                change = f"{abs(1 - ratio):.0%} {'less' if ratio <= 1 else 'more'} memory"
            else:
                change = f"speed-up {factor:.2f}×"
            measured = (f"{claim.candidate} {format_value(value, unit)} vs {claim.reference} "
                        f"{format_value(reference, unit)}: model/reference {ratio:.3f}×, "
                        f"reference/model {factor:.2f}× ({change})")
            verdict = HOLDS if holds else CONTRADICTED
            results.append(ClaimResult(claim, batch, verdict,
                                       f"**{verdict}**: {head} [{where}; needs {bound}]: {measured}."))
    return results


def _largest_common(frame: Any, claim: Claim, batch: str) -> str:
    """For an untestable claim, the same ratio at the largest length where both models ran, for orientation."""
    column = METRICS[claim.metrics[0]]
    ok = frame[(frame["status"] == "ok") & (frame["mode"] == claim.where["mode"]) & (frame["batch"] == batch)]
    here = ok[ok["label"] == claim.candidate].set_index("length")[column]
    ref = ok[ok["label"] == claim.reference].set_index("length")[column]
    common = sorted(set(here.index) & set(ref.index))
    if not common or here[common[-1]] <= 0 or ref[common[-1]] <= 0:
        return ""
    n = common[-1]
    return (f" At the largest length both ran (N = {n}): {ref[n] / here[n]:.2f}× "
            f"({here[n] / ref[n]:.3f}× of the reference).")
