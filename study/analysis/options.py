"""What a report is asked for: :class:`ReportOptions` and the defaults its command line shows.

This module imports no pandas, torch, Ray or matplotlib (only :mod:`study.analysis.pareto`, which needs numpy), so
``python -m study.report`` parses its arguments and refuses a wrong folder before any of those load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from study.analysis import pareto

DEFAULT_REFERENCE_MODEL = "sasrec"
TABLE_METRICS = tuple(f"test_{name}@{k}" for k in (10, 20) for name in ("hr", "ndcg", "mrr"))


@dataclass
class ReportOptions:
    """What the command line chooses: objectives, models compared, table metrics, hypervolume reference, plots."""

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
