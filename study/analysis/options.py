"""What a report is asked for: :class:`ReportOptions` and the defaults its command line shows.

This module imports no numpy, pandas, torch, Ray or matplotlib, so ``python -m study.report`` parses its arguments
and refuses a wrong folder before any of those load. The objectives' defaults and their parsing live here for that
reason (:mod:`study.analysis.pareto` re-exports them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from study.errors import UserError

DEFAULT_REFERENCE_MODEL = "sasrec"
TABLE_METRICS = tuple(f"test_{name}@{k}" for k in (10, 20) for name in ("hr", "ndcg", "mrr"))

SENSES = ("max", "min")
DEFAULT_OBJECTIVES = {"valid_ndcg@10": "max", "peak_mem_mb": "min", "infer_ms_p50": "min"}
# Fraction of an objective's observed range by which the default reference point lies beyond the worst value.
REFERENCE_MARGIN = 0.1


def parse_objectives(text: str) -> dict[str, str]:
    """``"valid_ndcg@10:max,peak_mem_mb:min"`` → ``{"valid_ndcg@10": "max", "peak_mem_mb": "min"}``."""
    objectives: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, sense = part.rpartition(":")
        if not sep or not name or sense not in SENSES:
            raise UserError(f"objective {part!r}: expected METRIC:max or METRIC:min (e.g. valid_ndcg@10:max)")
        if name in objectives:
            raise UserError(f"objective {name} is given twice")
        objectives[name] = sense
    if not objectives:
        raise UserError(f"no objectives in {text!r}; e.g. valid_ndcg@10:max,peak_mem_mb:min")
    return objectives


def format_objectives(objectives: Mapping[str, str]) -> str:
    return ",".join(f"{name}:{sense}" for name, sense in objectives.items())


@dataclass
class ReportOptions:
    """What the command line chooses: objectives, models compared, table metrics, hypervolume reference, plots."""

    objectives: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_OBJECTIVES))
    reference_model: str | None = None  # None: sasrec when present
    proposed: str | None = None
    select_metric: str | None = None
    metrics: tuple[str, ...] = TABLE_METRICS
    hv_reference: dict[str, float] | None = None
    margin: float = REFERENCE_MARGIN
    alpha: float = 0.05
    allow_mixed_protocols: bool = False
    plots: bool = True
