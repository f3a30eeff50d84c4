"""A published claim, as the platform tests it: one :class:`Claim` for accuracy and efficiency claims alike.

A claim sets a *candidate* against a *reference* (a study, a model of a scaling study, or a published table row)
on one or more metrics. An accuracy claim is a :class:`Region` for a statistic measured over seeds
(:meth:`Claim.region`); :mod:`study.analysis.verdicts` sets the statistic's confidence interval against it:

- ``better``: the difference candidate − reference lies above 0;
- ``ratio``: candidate ≥ ``bound`` × reference, read as candidate − ``bound`` × reference ≥ 0 (the sign of that
  difference decides the ratio claim; its interval is the one the verdict reads);
- ``within``: |candidate − reference| ≤ ``bound``;
- ``match``: our mean ≥ (1 − ``bound``) × the published value (within ``bound`` of it, or above it);
  ``beat``: our mean > the published value; ``diagnostic``: no verdict, the ratio is shown beside the row.

The verdict is three-valued: **holds** when the interval lies inside the region, **contradicted** when it lies
entirely outside it, **inconclusive** otherwise (too few seeds to see an effect of that size is no evidence against
it). Efficiency claims are single measurements, with no interval: ``max_ratio`` (candidate / reference ≤
``bound``) and ``min_factor`` (reference / candidate ≥ ``bound``) at one cell of a scaling study
(:meth:`Claim.holds`), each holds or is contradicted.

``paper_effect`` is the effect the paper reports, relative: candidate / reference − 1 at the paper's numbers on
the judged metric (``metrics[0]``), e.g. 0.073 for HSTU's 0.1720 against SASRec's 0.1603; times our reference's mean
it is the difference whose detection the seeds-needed figure is for. ``role`` marks a claim checked against the
baseline trained the same way (``primary``) or against another one (``secondary``). This module imports nothing
heavy, so that study-file readers can build claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

STUDY_KINDS = ("better", "ratio", "within")  # against a reference study, over seeds
PUBLISHED_KINDS = ("match", "beat", "diagnostic")  # against a published row
EFFICIENCY_KINDS = ("max_ratio", "min_factor")  # against a reference model, at one measured cell
CAMPAIGN_KINDS = STUDY_KINDS + PUBLISHED_KINDS  # what a campaign file may state
ROLES = ("primary", "secondary")
SIGNIFICANCE = 0.05
HOLDS, CONTRADICTED, INCONCLUSIVE = "holds", "contradicted", "inconclusive"


@dataclass(frozen=True)
class Region:
    """Where a claim puts its statistic: between ``low`` and ``high``; ``open_low`` excludes ``low`` itself (a gain
    must be above 0, not at it). ``text`` says it for a reader, e.g. ``Δ > 0``."""

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    text: str = ""

    def verdict(self, low: float, high: float) -> str:
        """:data:`HOLDS` when the interval [low, high] lies inside the region, :data:`CONTRADICTED` when it lies
        entirely outside it, :data:`INCONCLUSIVE` otherwise and when there is no interval (NaN ends)."""
        if math.isnan(low) or math.isnan(high):
            return INCONCLUSIVE
        if (low > self.low if self.open_low else low >= self.low) and high <= self.high:
            return HOLDS
        if (high <= self.low if self.open_low else high < self.low) or low > self.high:
            return CONTRADICTED
        return INCONCLUSIVE


def combine(verdicts: list[str]) -> str:
    """A claim over several metrics: contradicted when one metric contradicts it, holds when every metric holds."""
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    return HOLDS if verdicts and all(v == HOLDS for v in verdicts) else INCONCLUSIVE


@dataclass(frozen=True)
class Claim:
    """One claim: ``candidate`` against ``reference`` or against ``published`` (a table row of ``dataset``).

    ``published`` holds (metric, published value) pairs in the order the row is cited; the claim is judged on
    ``metrics[0]``. ``cell`` holds where an efficiency claim is measured (mode, length, batch_size) as pairs.
    ``text`` is what the claim says; for a published row, the rule (the candidate's name comes first).
    """

    text: str
    source: str
    candidate: str
    kind: str
    reference: str = ""
    bound: float = 0.0
    metrics: tuple[str, ...] = ("test_ndcg@10",)
    dataset: str = ""
    published: tuple[tuple[str, float], ...] = ()
    cell: tuple[tuple[str, Any], ...] = ()
    paper_effect: float | None = None
    role: str = ""

    @property
    def against_published(self) -> bool:
        return self.kind in PUBLISHED_KINDS

    @property
    def where(self) -> dict[str, Any]:
        """The measured cell of an efficiency claim, as a mapping."""
        return dict(self.cell)

    @property
    def weight(self) -> float:
        """The multiple of the reference the statistic subtracts: ``bound`` for a ratio claim, else 1."""
        return self.bound if self.kind == "ratio" else 1.0

    def region(self, published: float = math.nan) -> Region | None:
        """Where the statistic must lie for the claim to hold: of candidate − :attr:`weight` × reference for a study
        claim, of our mean for a published row (``published``: its value of the judged metric). None: a
        diagnostic, or an efficiency claim, which has no interval."""
        regions = {
            "better": lambda: Region(0.0, open_low=True, text="Δ > 0"),
            "ratio": lambda: Region(0.0, text=f"ratio ≥ {self.bound:g}"),
            "within": lambda: Region(-self.bound, self.bound, text=f"|Δ| ≤ {self.bound:g}"),
            "match": lambda: Region((1 - self.bound) * published, text=f"ratio ≥ {1 - self.bound:g}"),
            "beat": lambda: Region(published, open_low=True, text="ratio > 1"),
        }
        return regions[self.kind]() if self.kind in regions else None

    def holds(self, candidate: float, reference: float) -> bool:
        """Whether an efficiency claim holds given the candidate's and the reference's measured values."""
        rules = {
            "max_ratio": lambda: candidate / reference <= self.bound,
            "min_factor": lambda: reference / candidate >= self.bound,
        }
        if self.kind not in rules:
            raise ValueError(f"a {self.kind} claim is read from an interval (Claim.region), not from two values")
        return rules[self.kind]()
