"""Non-dominated sets and hypervolume over a study's objectives (accuracy ↑, memory ↓, latency ↓, energy ↓ …).

Objectives are a mapping ``{column: "max" | "min"}``, e.g. ``{"valid_ndcg@10": "max", "peak_mem_mb": "min"}``.
Internally every objective is turned into one to minimise (``max`` columns are negated), so "a dominates b"
always reads: a is no worse on every objective and strictly better on at least one.

* :func:`non_dominated_mask` / :func:`pareto_front`: the points no other point dominates. Ties and duplicates
  stay on the front together (two equal points do not dominate each other). A point with a missing (NaN)
  objective is never on the front and never dominates anything: it has no complete position to compare.
* :func:`hypervolume`: the volume dominated by a set of points and bounded by a reference point (the
  standard Lebesgue measure of the union of the boxes ``[p, reference]``), exact, by recursive slicing with
  a sweep-line base case in 2-D. Points that do not strictly improve on the reference in every objective
  add nothing.
* :func:`default_reference`: the worst observed value of each objective pushed out by
  ``REFERENCE_MARGIN`` (10 %) of its observed range, so the front's extreme points still enclose volume.
  Hypervolumes are only comparable under the same reference point: a report computes one reference over all
  the points it compares and prints it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from study.analysis.options import (  # noqa: F401 (the objectives' names and parsing, kept light there)
    DEFAULT_OBJECTIVES,
    REFERENCE_MARGIN,
    SENSES,
    format_objectives,
    parse_objectives,
)

if TYPE_CHECKING:  # only annotations: the command line reads the defaults below before pandas loads
    import pandas as pd

_BLOCK = 512  # rows compared at once in the dominance check: bounds memory at _BLOCK x n x d booleans


def _signs(senses: Sequence[str]) -> np.ndarray:
    bad = [s for s in senses if s not in SENSES]
    if bad:
        raise ValueError(f"objective senses must be max or min, got {bad}")
    return np.array([-1.0 if s == "max" else 1.0 for s in senses])


def to_minimisation(values: np.ndarray, senses: Sequence[str]) -> np.ndarray:
    """``values`` (n, d) with every ``max`` column negated, so that smaller is better everywhere."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 2 or values.shape[1] != len(senses):
        raise ValueError(f"values must be (n, {len(senses)}), got shape {values.shape}")
    return values * _signs(senses)


def non_dominated_mask(values: np.ndarray, senses: Sequence[str]) -> np.ndarray:
    """Boolean mask of the rows of ``values`` (n, d) that no other row dominates."""
    v = to_minimisation(values, senses)
    complete = ~np.isnan(v).any(axis=1)
    mask = np.zeros(len(v), dtype=bool)
    pts = v[complete]
    if len(pts) == 0:
        return mask
    dominated = np.zeros(len(pts), dtype=bool)
    for start in range(0, len(pts), _BLOCK):
        block = pts[start:start + _BLOCK]
        no_worse = (pts[None, :, :] <= block[:, None, :]).all(axis=2)  # [i, j]: pts[j] no worse than block[i]
        better = (pts[None, :, :] < block[:, None, :]).any(axis=2)
        dominated[start:start + len(block)] = (no_worse & better).any(axis=1)
    mask[np.flatnonzero(complete)] = ~dominated
    return mask


def pareto_front(frame: pd.DataFrame, objectives: Mapping[str, str]) -> pd.DataFrame:
    """The rows of ``frame`` on the front, sorted best-first by the first objective."""
    names = list(objectives)
    mask = non_dominated_mask(frame[names].to_numpy(dtype=float), list(objectives.values()))
    first = names[0]
    return frame[mask].sort_values(first, ascending=objectives[first] == "min", kind="stable")


def _hv2(points: np.ndarray, ref: np.ndarray) -> float:
    """2-D hypervolume (minimisation) of points already strictly inside the reference box."""
    order = np.lexsort((points[:, 1], points[:, 0]))  # by x, then y
    volume, best_y = 0.0, ref[1]
    for x, y in points[order]:
        if y < best_y:  # otherwise dominated by (or equal to) a point already swept
            volume += (ref[0] - x) * (best_y - y)
            best_y = y
    return volume


def _hv(points: np.ndarray, ref: np.ndarray) -> float:
    d = points.shape[1]
    if len(points) == 0:
        return 0.0
    if d == 1:
        return float(ref[0] - points[:, 0].min())
    if d == 2:
        return _hv2(points, ref)
    # Slice along the last objective: between consecutive levels, the dominated region's cross-section is
    # the (d-1)-D hypervolume of every point at or below the lower level.
    order = np.argsort(points[:, -1], kind="stable")
    pts = points[order]
    levels = np.append(pts[:, -1], ref[-1])
    volume = 0.0
    for i in range(len(pts)):
        height = levels[i + 1] - levels[i]
        if height > 0:
            volume += height * _hv(pts[:i + 1, :-1], ref[:-1])
    return volume


def hypervolume(values: np.ndarray, senses: Sequence[str], reference: Sequence[float]) -> float:
    """Exact hypervolume of ``values`` (n, d) against ``reference`` (in the objectives' own units and senses).

    Rows with a NaN, and rows that are not strictly better than the reference in every objective, add
    nothing. Dominated rows may be passed: they add nothing either, and are dropped first for speed.
    """
    v = to_minimisation(values, senses)
    ref = np.asarray(reference, dtype=float) * _signs(senses)
    if ref.shape != (len(senses),) or np.isnan(ref).any():
        raise ValueError(f"reference must hold {len(senses)} finite numbers, got {list(reference)}")
    v = v[~np.isnan(v).any(axis=1)]
    v = v[(v < ref).all(axis=1)]
    if len(v) == 0:
        return 0.0
    senses_min = ["min"] * len(senses)
    v = np.unique(v[non_dominated_mask(v, senses_min)], axis=0)
    return float(_hv(v, ref))


def default_reference(values: np.ndarray, senses: Sequence[str], margin: float = REFERENCE_MARGIN) -> np.ndarray:
    """The worst observed value per objective, moved outwards by ``margin`` × the observed range.

    When every point has the same value of an objective (range 0), the margin is taken of the value's
    magnitude instead (or 1.0 for a value of 0), so the reference still lies strictly beyond it.
    """
    v = to_minimisation(values, senses)
    if np.isnan(v).all(axis=0).any():
        raise ValueError("every value of some objective is missing; no reference point can be derived")
    worst, best = np.nanmax(v, axis=0), np.nanmin(v, axis=0)
    span = worst - best
    span = np.where(span > 0, span, np.where(worst != 0, np.abs(worst), 1.0))
    return (worst + margin * span) * _signs(senses)


def ideal_point(values: np.ndarray, senses: Sequence[str]) -> np.ndarray:
    """The best observed value per objective (in the objectives' own senses)."""
    v = to_minimisation(values, senses)
    return np.nanmin(v, axis=0) * _signs(senses)


def normalised_hypervolume(values: np.ndarray, senses: Sequence[str], reference: Sequence[float],
                           ideal: Sequence[float]) -> float:
    """Hypervolume divided by the volume of the box between ``ideal`` and ``reference``: a unit-free share.

    Raw hypervolumes multiply the objectives' units (NDCG × MB × ms); the share is what a reader can compare,
    and it stays comparable across models as long as all use the same reference and ideal point.
    """
    box = float(np.prod(np.abs(np.asarray(reference, dtype=float) - np.asarray(ideal, dtype=float))))
    return hypervolume(values, senses, reference) / box if box > 0 else float("nan")
