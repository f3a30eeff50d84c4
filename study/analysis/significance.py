"""Is a difference between two models real? Tests over seeds, Holm's correction, effect sizes and intervals.

One comparison = one metric of a candidate model's chosen configuration against the reference model's, each
measured under several seeds (``pandas.Series`` indexed by seed):

* **the same seeds on both sides** (n >= 2): paired t-test (``scipy.stats.ttest_rel``) on the per-seed
  differences; effect size Cohen's d_z = mean(diff) / sd(diff); robustness check: Wilcoxon signed-rank test
  (``scipy.stats.wilcoxon``) on the same differences;
* **otherwise** (n >= 2 per side): Welch's t-test (``scipy.stats.ttest_ind(equal_var=False)``); effect size
  Cohen's d with the pooled standard deviation; robustness check: the Wilcoxon rank-sum test in its
  Mann–Whitney U form (``scipy.stats.mannwhitneyu``), the signed-rank test needing pairs;
* **fewer than 2 seeds on a side**: no test and no p-value (a t-test needs a variance estimate on each side);
  the row says why.

With fewer than :data:`POWERED_SEEDS` seeds on a side a test has little power: each row carries ``mde``, the
smallest standardized effect (|d_z| paired, |d| unpaired) that a two-sided t-test at ``alpha`` detects with
probability ``power`` at that n (:func:`minimum_detectable_effect`, from the noncentral t distribution), and
its effect size is marked unreliable; from :data:`POWERED_SEEDS` seeds on, the effect size gets an approximate
confidence interval (normal approximation of its standard error, Hedges & Olkin 1985). The same question in the
metric's own units: ``mde_diff``, the smallest true difference the test detects with that power
(:func:`detectable_difference`), and ``seeds_needed``, the seeds per side that would detect the observed difference
(:func:`seeds_needed`); both at alpha 0.05 before any correction, from the observed spread.

Every test is two-sided. The 95 % confidence interval of the mean difference (candidate − reference) comes
from the t result's ``confidence_interval()``. :func:`holm` adjusts a family of p-values (Holm–Bonferroni
step-down, which controls the family-wise error rate); a report adjusts all its t-test p-values together and,
as a separate family, all its robustness p-values. scipy has no Holm (``false_discovery_control`` is
Benjamini–Hochberg, a different error rate), so the adjustment is implemented here; it is arithmetic on the
p-values, not a test. :func:`adjust` then reads each comparison three ways: ``higher`` or ``lower`` where the
Holm-adjusted p is below alpha (the difference lies on that side of 0), ``inconclusive`` where it is not. "No
different" is never a reading: no interval can show a difference of exactly 0.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

MIN_SEEDS = 2
# A spread below this fraction of the values' magnitude is rounding noise (e.g. 3/1090 - 2/1090 vs 4/1090 - 3/1090).
ZERO_SPREAD = 1e-12
NO_TEST_NOTE = f"no test: fewer than {MIN_SEEDS} seeds on a side"
# Below this many seeds per side a test detects only very large effects (d > 2 at n = 4 pairs), and an effect size
# estimated from so few values is too variable to read: the report says so instead of printing it as evidence.
POWERED_SEEDS = 5
TARGET_POWER = 0.8


def holm(pvalues: Sequence[float | None]) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values, in the input order; missing (None/NaN) entries stay NaN.

    With the m available p-values sorted ascending, p_(1) <= … <= p_(m), the adjusted value of p_(i) is
    max_{j <= i} min(1, (m − j + 1) · p_(j)); rejecting where adjusted <= alpha is Holm's step-down procedure.
    """
    p = np.array([np.nan if v is None else float(v) for v in pvalues], dtype=float)
    adjusted = np.full(p.shape, np.nan)
    present = np.flatnonzero(~np.isnan(p))
    m = len(present)
    if m == 0:
        return adjusted
    if ((p[present] < 0) | (p[present] > 1)).any():
        raise ValueError(f"p-values must lie in [0, 1], got {p[present].tolist()}")
    order = present[np.argsort(p[present], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def _finite(value: Any) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return float("nan")
    return value if np.isfinite(value) else float("nan")


def compare(candidate: pd.Series, reference: pd.Series, confidence: float = 0.95) -> dict[str, Any]:
    """Test ``candidate`` against ``reference`` (values indexed by seed); one flat row of results.

    Keys: ``test`` (paired-t | welch-t | none), ``n_candidate``, ``n_reference``, ``n_pairs``, the two means
    and standard deviations, ``mean_diff`` (candidate − reference), ``ci_low``/``ci_high`` (``confidence``),
    ``t``, ``df``, ``p``, ``effect`` with ``effect_kind`` (dz | d), ``robust_test`` (wilcoxon-signed-rank |
    mann-whitney-u), ``robust_p``, and ``note`` (why a figure is missing).
    """
    a = pd.Series(candidate, dtype=float).dropna()
    b = pd.Series(reference, dtype=float).dropna()
    if a.index.has_duplicates or b.index.has_duplicates:
        raise ValueError("each seed may appear once per side")
    paired = len(a) >= MIN_SEEDS and set(a.index) == set(b.index)
    row: dict[str, Any] = {
        "test": "none", "n_candidate": len(a), "n_reference": len(b), "n_pairs": len(a) if paired else 0,
        "mean_candidate": _finite(a.mean()) if len(a) else float("nan"),
        "std_candidate": _finite(a.std(ddof=1)) if len(a) > 1 else float("nan"),
        "mean_reference": _finite(b.mean()) if len(b) else float("nan"),
        "std_reference": _finite(b.std(ddof=1)) if len(b) > 1 else float("nan"),
        "mean_diff": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "t": float("nan"),
        "df": float("nan"), "p": float("nan"), "effect": float("nan"), "effect_kind": "",
        "robust_test": "", "robust_p": float("nan"), "note": "",
        "mde": minimum_detectable_effect(len(a), len(b), paired), "effect_reliable": False,
        "effect_ci_low": float("nan"), "effect_ci_high": float("nan"), "mde_diff": float("nan"),
        "seeds_needed": float("nan"),
    }
    if len(a) and len(b):
        row["mean_diff"] = row["mean_candidate"] - row["mean_reference"]
    if len(a) < MIN_SEEDS or len(b) < MIN_SEEDS:
        row["note"] = NO_TEST_NOTE
        return row
    notes = []
    with warnings.catch_warnings():
        # zero-variance samples make scipy warn and return NaN; the note below says it in words
        warnings.simplefilter("ignore", RuntimeWarning)
        if paired:
            seeds = sorted(a.index)
            x, y = a.loc[seeds].to_numpy(), b.loc[seeds].to_numpy()
            result = stats.ttest_rel(x, y)
            diff = x - y
            sd = diff.std(ddof=1)
            degenerate = _no_spread(sd, x, y)
            row.update(test="paired-t", effect=float("nan") if degenerate else _finite(diff.mean() / sd),
                       effect_kind="dz", robust_test="wilcoxon-signed-rank")
            se, spread = sd / math.sqrt(len(diff)), sd
            try:
                row["robust_p"] = _finite(stats.wilcoxon(x, y, alternative="two-sided").pvalue)
            except ValueError as error:  # e.g. every difference is zero
                notes.append(f"wilcoxon: {error}")
        else:
            x, y = a.to_numpy(), b.to_numpy()
            result = stats.ttest_ind(x, y, equal_var=False)
            degenerate = _no_spread(max(x.std(ddof=1), y.std(ddof=1)), x, y)
            pooled = np.sqrt(((len(x) - 1) * x.var(ddof=1) + (len(y) - 1) * y.var(ddof=1)) / (len(x) + len(y) - 2))
            row.update(test="welch-t", effect=float("nan") if degenerate else _finite((x.mean() - y.mean()) / pooled),
                       effect_kind="d", robust_test="mann-whitney-u")
            se = math.sqrt(x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y))
            spread = math.sqrt(x.var(ddof=1) + y.var(ddof=1))
            row["robust_p"] = _finite(stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)
            if set(a.index) & set(b.index):
                notes.append("seeds differ between the sides: unpaired test")
        interval = result.confidence_interval(confidence_level=confidence)
        row["df"] = _finite(result.df)
        if degenerate:
            # Every seed gave the same difference (common with few seeds and hit counts): scipy then returns
            # t = ±inf and p = 0, or NaN, which would read as certainty; no variance means no test.
            notes.append("no variance across seeds: the t statistic is undefined, no p-value")
        else:
            row.update(t=_finite(result.statistic), p=_finite(result.pvalue), ci_low=_finite(interval.low),
                       ci_high=_finite(interval.high), mde_diff=detectable_difference(se, row["df"]),
                       seeds_needed=seeds_needed(row["mean_diff"], spread, paired))
    row["effect_reliable"] = min(len(a), len(b)) >= POWERED_SEEDS and not np.isnan(row["effect"])
    if row["effect_reliable"]:
        row["effect_ci_low"], row["effect_ci_high"] = effect_interval(row["effect"], len(a), len(b), paired,
                                                                      confidence)
    row["note"] = "; ".join(notes)
    return row


def minimum_detectable_effect(n_candidate: int, n_reference: int, paired: bool, alpha: float = 0.05,
                              power: float = TARGET_POWER) -> float:
    """The smallest standardized effect a two-sided t-test at ``alpha`` detects with probability ``power``.

    Paired (n pairs): effect d_z, df = n − 1, noncentrality d_z·√n. Unpaired: effect d, df = n₁ + n₂ − 2 and
    noncentrality d·√(n₁n₂/(n₁+n₂)) (the pooled-variance test; Welch's differs little at equal spreads).
    NaN where no test can run.
    """
    if min(n_candidate, n_reference) < MIN_SEEDS:
        return float("nan")
    if paired:
        df, scale = n_candidate - 1, math.sqrt(n_candidate)
    else:
        df, scale = n_candidate + n_reference - 2, math.sqrt(n_candidate * n_reference / (n_candidate + n_reference))
    critical = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(effect: float) -> float:
        noncentrality = effect * scale
        # the lower tail as the upper tail of the mirrored distribution: nct.cdf far in the tail can return NaN
        return stats.nct.sf(critical, df, noncentrality) + stats.nct.sf(critical, df, -noncentrality) - power

    upper = 1.0
    while shortfall(upper) < 0:
        upper *= 2
    return float(optimize.brentq(shortfall, 0.0, upper, xtol=1e-6))


def detectable_difference(se: float, df: float, alpha: float = 0.05, power: float = TARGET_POWER) -> float:
    """The smallest true difference a two-sided t-test at ``alpha`` detects with probability ``power``, in the
    units of the tested statistic: (t_{1−α/2, df} + t_{power, df}) · se.

    ``se`` is the statistic's standard error (sd/√n of paired differences or of one sample; √(s₁²/n₁ + s₂²/n₂)
    for Welch's test). The sum of two central t quantiles is the usual closed-form power approximation (it
    neglects the far tail and the noncentral t's skew, a few per cent at n = 5). NaN without a spread or df.
    """
    if not (se > 0 and df >= 1) or not math.isfinite(se):
        return float("nan")
    return float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * se)


def seeds_needed(effect: float, spread: float, paired: bool = True, alpha: float = 0.05,
                 power: float = TARGET_POWER, most: int = 1_000_000) -> float:
    """The fewest seeds whose test detects a true difference ``effect`` (by :func:`detectable_difference`).

    Paired, or one sample against a fixed value: ``spread`` is the sd of the per-seed differences (or values), the
    test's se = spread/√n with n − 1 df. Unpaired: n seeds per side, ``spread`` = √(s₁² + s₂²), se = spread/√n with
    2n − 2 df. NaN without an effect or a spread; inf beyond ``most`` seeds.
    """
    effect = abs(effect)
    if not (effect > 0 and spread > 0) or not math.isfinite(effect / spread):
        return float("nan")

    def detects(n: int) -> bool:
        return detectable_difference(spread / math.sqrt(n), n - 1 if paired else 2 * n - 2, alpha, power) <= effect

    # the normal-quantile n is a lower bound (t quantiles exceed z's); count up from it
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    n = max(MIN_SEEDS, math.floor((z * spread / effect) ** 2))
    if n > most:
        return float("inf")
    while not detects(n):
        n += 1
    return float(n)


def effect_interval(effect: float, n_candidate: int, n_reference: int, paired: bool,
                    confidence: float = 0.95) -> tuple[float, float]:
    """Approximate confidence interval of Cohen's d_z (paired) or d: effect ± z·SE, with SE² = 1/n + d²/(2n)
    paired and (n₁+n₂)/(n₁n₂) + d²/(2(n₁+n₂)) unpaired (Hedges & Olkin 1985)."""
    if paired:
        variance = 1 / n_candidate + effect ** 2 / (2 * n_candidate)
    else:
        total = n_candidate + n_reference
        variance = total / (n_candidate * n_reference) + effect ** 2 / (2 * total)
    half = stats.norm.ppf(0.5 + confidence / 2) * math.sqrt(variance)
    return float(effect - half), float(effect + half)


def _no_spread(spread: float, x: np.ndarray, y: np.ndarray) -> bool:
    scale = max(float(np.abs(x).max()), float(np.abs(y).max()))
    return not spread > ZERO_SPREAD * scale


def compare_many(groups: dict[str, pd.Series], reference: str, metric: str, confidence: float = 0.95) -> list[dict]:
    """``compare`` every group but ``reference`` against it on one metric; rows carry ``candidate``/``metric``."""
    rows = []
    for name, values in groups.items():
        if name == reference:
            continue
        rows.append({"candidate": name, "reference": reference, "metric": metric,
                     **compare(values, groups[reference], confidence)})
    return rows


def adjust(table: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Add Holm-adjusted ``p_holm`` / ``robust_p_holm`` over all the rows of ``table``, and ``significant``.

    ``significant`` is True where the Holm-adjusted t-test p-value is below ``alpha``, False where it is not,
    and missing (NA) where no test could run; ``reading`` says the same in words: ``higher`` / ``lower`` (the
    candidate against the reference), ``inconclusive``, or empty where no test could run.
    """
    table = table.copy()
    if table.empty:
        for column in ("p_holm", "robust_p_holm"):
            table[column] = pd.Series(dtype=float)
        table["significant"] = pd.Series(dtype="boolean")
        table["reading"] = pd.Series(dtype=str)
        return table
    table["p_holm"] = holm(table["p"].tolist())
    table["robust_p_holm"] = holm(table["robust_p"].tolist())
    significant = pd.array([pd.NA if np.isnan(p) else bool(p < alpha) for p in table["p_holm"]], dtype="boolean")
    table["significant"] = significant
    table["reading"] = [_reading(flag, diff) for flag, diff in zip(significant, table["mean_diff"])]
    return table


def _reading(significant: Any, diff: float) -> str:
    if pd.isna(significant):
        return ""
    return ("higher" if diff > 0 else "lower") if significant else "inconclusive"
