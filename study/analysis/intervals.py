"""The confidence interval of a claim's statistic over seeds, and what those seeds can detect.

The statistic of a study claim is candidate − w × reference (w = 1, or a ratio claim's bound), per seed:

- **the same seeds on both sides** (n >= 2): the t interval of the mean of the per-seed differences c_i − w·r_i,
  n − 1 degrees of freedom (the paired t-test's interval);
- **otherwise** (n >= 2 per side): Welch's interval of mean(c) − w·mean(r), with the Welch–Satterthwaite df;
- **one sample**, our mean against a published value: the t interval of our mean, n − 1 df.

With fewer than 2 seeds on a side, or no spread at all across them (every seed gave the same difference: no variance
estimate, so no interval), the ends are NaN and a verdict reads it as inconclusive.

A ratio claim also shows the ratio's own interval, Fieller's (1954): the ratios θ for which the interval of
c − θ·r holds 0, the roots of a quadratic in θ (unpaired: at the df of the estimated ratio). A bound lies below
that interval exactly when the interval of c − bound·r lies above 0, so it says what the verdict reads.

:meth:`Estimate.mde` is the smallest true value of the statistic its test detects (two-sided α = 0.05, power 0.8,
:func:`~study.analysis.significance.detectable_difference`), and :meth:`Estimate.seeds_for` the seeds that would
detect a given one (:func:`~study.analysis.significance.seeds_needed`); both from the observed spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from study.analysis.significance import MIN_SEEDS, ZERO_SPREAD, detectable_difference, seeds_needed

LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """A statistic over seeds: ``test`` (paired | welch | one-sample | none), ``n`` pairs or candidate seeds,
    ``value`` with its ``level`` interval [``low``, ``high``], standard error ``se``, ``df``, ``spread`` (sd of the
    per-seed statistic, or √(s_c² + w²·s_r²) unpaired) and the two-sided ``p`` of the statistic being 0."""

    test: str
    n: int
    n_reference: int
    mean_candidate: float
    mean_reference: float
    value: float
    low: float = math.nan
    high: float = math.nan
    level: float = LEVEL
    se: float = math.nan
    df: float = math.nan
    spread: float = math.nan
    p: float = math.nan

    @property
    def paired(self) -> bool:
        return self.test != "welch"

    def mde(self) -> float:
        """The smallest true value of the statistic its test detects (α = 0.05, power 0.8)."""
        return detectable_difference(self.se, self.df)

    def seeds_for(self, effect: float) -> float:
        """Seeds (per side, unpaired) whose test would detect a true value ``effect`` (α = 0.05, power 0.8)."""
        return seeds_needed(effect, self.spread, self.paired)


def _values(series: pd.Series) -> pd.Series:
    values = pd.Series(series, dtype=float).dropna()
    if values.index.has_duplicates:
        raise ValueError("each seed may appear once per side")
    return values


def _finish(base: dict, value: float, se: float, df: float, spread: float, level: float, scale: float) -> Estimate:
    """The estimate with its interval, or without one where there is no spread (see the module)."""
    if not spread > ZERO_SPREAD * scale:
        return Estimate(**base, value=value, level=level)
    half = stats.t.ppf(0.5 + level / 2, df) * se
    p = float(2 * stats.t.sf(abs(value / se), df))
    return Estimate(**base, value=value, low=value - half, high=value + half, level=level, se=se, df=df,
                    spread=spread, p=p)


def estimate(candidate: pd.Series, reference: pd.Series, weight: float = 1.0, level: float = LEVEL) -> Estimate:
    """candidate − ``weight`` × reference over seeds (indexed by seed), paired where both ran the same seeds."""
    c, r = _values(candidate), _values(reference)
    base = {"n": len(c), "n_reference": len(r), "mean_candidate": float(c.mean()) if len(c) else math.nan,
            "mean_reference": float(r.mean()) if len(r) else math.nan}
    value = base["mean_candidate"] - weight * base["mean_reference"]
    if min(len(c), len(r)) < MIN_SEEDS:
        return Estimate("none", **base, value=value, level=level)
    scale = max(float(c.abs().max()), float(r.abs().max()))
    if set(c.index) == set(r.index):
        diff = (c - weight * r.loc[c.index]).to_numpy()
        sd = float(diff.std(ddof=1))
        return _finish({"test": "paired", **base}, value, sd / math.sqrt(len(diff)), len(diff) - 1, sd, level, scale)
    vc, vr = float(c.var(ddof=1)) / len(c), weight ** 2 * float(r.var(ddof=1)) / len(r)
    se = math.sqrt(vc + vr)
    df = (vc + vr) ** 2 / (vc ** 2 / (len(c) - 1) + vr ** 2 / (len(r) - 1)) if se > 0 else math.nan
    spread = math.sqrt(float(c.var(ddof=1)) + weight ** 2 * float(r.var(ddof=1)))
    return _finish({"test": "welch", **base}, value, se, df, spread, level, scale)


def estimate_mean(values: pd.Series, level: float = LEVEL) -> Estimate:
    """Our mean over seeds, for a published value to be set against it."""
    v = _values(values)
    mean = float(v.mean()) if len(v) else math.nan
    base = {"n": len(v), "n_reference": 0, "mean_candidate": mean, "mean_reference": math.nan}
    if len(v) < MIN_SEEDS:
        return Estimate("none", **base, value=mean, level=level)
    sd = float(v.std(ddof=1))
    return _finish({"test": "one-sample", **base}, mean, sd / math.sqrt(len(v)), len(v) - 1, sd, level,
                   float(v.abs().max()))


def fieller(candidate: pd.Series, reference: pd.Series, level: float = LEVEL) -> tuple[float, float]:
    """Fieller's interval of mean(candidate) / mean(reference); NaN ends where it is unbounded (the reference's
    mean is not separated from 0) or where there is no interval (see :func:`estimate`)."""
    c, r = _values(candidate), _values(reference)
    ratio = estimate(c, r, weight=float(c.mean() / r.mean()) if len(r) and r.mean() else math.nan, level=level)
    if math.isnan(ratio.low):
        return math.nan, math.nan
    q = stats.t.ppf(0.5 + level / 2, ratio.df) ** 2
    mc, mr = c.mean(), r.mean()
    if ratio.paired:
        cov = np.cov(c.to_numpy(), r.loc[c.index].to_numpy(), ddof=1) / len(c)
        vcc, vrr, vcr = cov[0, 0], cov[1, 1], cov[0, 1]
    else:
        vcc, vrr, vcr = c.var(ddof=1) / len(c), r.var(ddof=1) / len(r), 0.0
    a, b, k = mr ** 2 - q * vrr, mc * mr - q * vcr, mc ** 2 - q * vcc
    discriminant = b ** 2 - a * k
    if a <= 0 or discriminant < 0:
        return math.nan, math.nan
    root = math.sqrt(discriminant)
    return float((b - root) / a), float((b + root) / a)
