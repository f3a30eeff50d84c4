"""A published claim, as the platform tests it: one :class:`Claim` for accuracy and efficiency claims alike.

A claim sets a *candidate* against a *reference* (a study, a model of a scaling study, or a published table row)
on one or more metrics. Its ``kind`` is the rule that decides it (:meth:`Claim.holds`):

- ``better``: the candidate is above the reference and the seeds' t-test separates them at p < 0.05 after Holm's
  correction (over every ``better`` line of a dataset: :mod:`study.analysis.verdicts`);
- ``ratio``: candidate ≥ ``bound`` × reference; ``within``: |candidate − reference| ≤ ``bound``;
- ``match``: candidate ≥ (1 − ``bound``) × the published value (within ``bound`` of it, or above it);
  ``beat``: candidate > the published value; ``diagnostic``: no verdict, the ratio is shown beside the row;
- ``max_ratio``: candidate / reference ≤ ``bound``; ``min_factor``: reference / candidate ≥ ``bound`` (a scaling
  study's memory or time at one cell).

``ratio``, ``within``, ``match`` and ``beat`` read the means alone, with no test: they are statements about size, as
the papers make them. This module imports nothing heavy, so that study-file readers can build claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

STUDY_KINDS = ("better", "ratio", "within")  # against a reference study, over seeds
PUBLISHED_KINDS = ("match", "beat", "diagnostic")  # against a published row
EFFICIENCY_KINDS = ("max_ratio", "min_factor")  # against a reference model, at one measured cell
CAMPAIGN_KINDS = STUDY_KINDS + PUBLISHED_KINDS  # what a campaign file may state
SIGNIFICANCE = 0.05


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

    @property
    def against_published(self) -> bool:
        return self.kind in PUBLISHED_KINDS

    @property
    def where(self) -> dict[str, Any]:
        """The measured cell of an efficiency claim, as a mapping."""
        return dict(self.cell)

    def holds(self, candidate: float, reference: float, diff: float | None = None,
              p_holm: float = math.nan) -> bool | None:
        """Whether the claim holds given the candidate's and reference's values (for a published row, the published
        value) on one metric; ``diff`` is the mean difference where it is not ``candidate − reference`` (paired
        seeds), ``p_holm`` the corrected p of a ``better`` claim. None: a diagnostic, which has no verdict."""
        diff = candidate - reference if diff is None else diff
        rules = {
            "better": lambda: diff > 0 and p_holm < SIGNIFICANCE,
            "ratio": lambda: (candidate / reference if reference else math.nan) >= self.bound,
            "within": lambda: abs(diff) <= self.bound,
            "match": lambda: candidate / reference >= 1 - self.bound,
            "beat": lambda: candidate > reference,
            "max_ratio": lambda: candidate / reference <= self.bound,
            "min_factor": lambda: reference / candidate >= self.bound,
        }
        return rules[self.kind]() if self.kind in rules else None
