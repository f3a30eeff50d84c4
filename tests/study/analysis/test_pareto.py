"""Non-dominated sets against a brute-force check, hypervolume against hand-computed and inclusion–exclusion values."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from study.analysis.pareto import (
    default_reference,
    hypervolume,
    ideal_point,
    non_dominated_mask,
    normalised_hypervolume,
    pareto_front,
    parse_objectives,
)
from study.errors import UserError


def brute_force_front(values: np.ndarray, senses: list[str]) -> np.ndarray:
    """Pair by pair, straight from the definition (max objectives compared as max)."""
    keep = []
    for i, p in enumerate(values):
        if np.isnan(p).any():
            keep.append(False)
            continue
        dominated = False
        for j, q in enumerate(values):
            if i == j or np.isnan(q).any():
                continue
            no_worse = all((q[k] >= p[k]) if s == "max" else (q[k] <= p[k]) for k, s in enumerate(senses))
            better = any((q[k] > p[k]) if s == "max" else (q[k] < p[k]) for k, s in enumerate(senses))
            dominated |= no_worse and better
        keep.append(not dominated)
    return np.array(keep)


def inclusion_exclusion_hv(values: np.ndarray, senses: list[str], ref: list[float]) -> float:
    """Union of boxes [p, ref] by inclusion–exclusion: independent of the slicing algorithm, for small n."""
    sign = np.array([-1.0 if s == "max" else 1.0 for s in senses])
    pts, r = values * sign, np.asarray(ref) * sign
    total = 0.0
    for size in range(1, len(pts) + 1):
        for subset in itertools.combinations(range(len(pts)), size):
            corner = pts[list(subset)].max(axis=0)
            total += (-1) ** (size + 1) * np.prod(np.clip(r - corner, 0, None))
    return float(total)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("dims", [2, 3, 4])
def test_front_equals_brute_force_with_ties_and_duplicates(seed: int, dims: int) -> None:
    rng = np.random.default_rng(seed)
    # few distinct values per objective: many ties; then duplicate some rows outright
    values = rng.integers(0, 5, size=(40, dims)).astype(float)
    values = np.vstack([values, values[rng.choice(40, 10)]])
    senses = list(rng.choice(["max", "min"], size=dims))
    mask = non_dominated_mask(values, senses)
    np.testing.assert_array_equal(mask, brute_force_front(values, senses))
    assert mask.any()


def test_duplicates_stay_together_and_nan_rows_are_ignored() -> None:
    values = np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 2.0], [2.0, 0.0], [0.5, 0.5], [np.nan, 9.0], [5.0, np.nan]])
    mask = non_dominated_mask(values, ["max", "max"])
    # the two equal points do not dominate each other; (0.5, 0.5) is dominated; NaN rows are never on it
    assert mask.tolist() == [True, True, True, True, False, False, False]


def test_large_input_is_checked_in_blocks() -> None:
    rng = np.random.default_rng(3)
    values = rng.random((1300, 2))  # more rows than one comparison block
    mask = non_dominated_mask(values, ["min", "min"])
    order = np.argsort(values[:, 0])
    running_min = np.minimum.accumulate(values[order, 1])
    expected = np.zeros(len(values), dtype=bool)
    expected[order] = values[order, 1] <= running_min  # continuous values: no ties
    np.testing.assert_array_equal(mask, expected)


def test_pareto_front_frame_sorted_by_first_objective() -> None:
    frame = pd.DataFrame({"ndcg": [0.1, 0.3, 0.2, 0.25], "mem": [10.0, 30.0, 5.0, 40.0], "id": list("abcd")})
    front = pareto_front(frame, {"ndcg": "max", "mem": "min"})
    assert front["id"].tolist() == ["b", "c"]


def test_hypervolume_2d_by_hand() -> None:
    # boxes to (4, 4): 3x1 + 2x1 + 1x1 (the staircase), the dominated (3, 3) adds nothing
    values = np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0], [3.0, 3.0]])
    assert hypervolume(values, ["min", "min"], [4.0, 4.0]) == pytest.approx(6.0)
    # as an accuracy (max) / memory (min) pair: ndcg 0.3 at 10 MB, 0.5 at 30 MB, reference (0.1, 50 MB)
    acc_mem = np.array([[0.3, 10.0], [0.5, 30.0]])
    assert hypervolume(acc_mem, ["max", "min"], [0.1, 50.0]) == pytest.approx(0.2 * 40 + 0.2 * 20)


def test_hypervolume_3d_by_hand() -> None:
    # three boxes of 9, pairwise overlaps of 3, a triple overlap of 1: 27 - 9 + 1
    values = np.array([[1.0, 1.0, 3.0], [1.0, 3.0, 1.0], [3.0, 1.0, 1.0]])
    assert hypervolume(values, ["min"] * 3, [4.0, 4.0, 4.0]) == pytest.approx(19.0)
    # a single point is its box; a point outside the reference adds nothing; a duplicate adds nothing
    one = np.array([[0.5, 2.0, 1.0], [5.0, 4.0, 0.0], [0.5, 2.0, 1.0]])  # (5, 4, 0): memory beyond 3
    assert hypervolume(one, ["max", "min", "min"], [0.0, 3.0, 2.0]) == pytest.approx(0.5 * 1.0 * 1.0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dims", [2, 3, 4])
def test_hypervolume_matches_inclusion_exclusion(seed: int, dims: int) -> None:
    rng = np.random.default_rng(100 + seed)
    values = rng.integers(0, 6, size=(7, dims)).astype(float)
    senses = list(rng.choice(["max", "min"], size=dims))
    ref = [(-1.0 if s == "max" else 6.0) for s in senses]
    assert hypervolume(values, senses, ref) == pytest.approx(inclusion_exclusion_hv(values, senses, ref))


def test_default_reference_and_normalised_share() -> None:
    values = np.array([[0.2, 100.0, 5.0], [0.4, 300.0, 5.0]])
    senses = ["max", "min", "min"]
    ref = default_reference(values, senses)
    # 10 % of the range beyond the worst; the constant latency gets 10 % of its magnitude
    np.testing.assert_allclose(ref, [0.2 - 0.02, 300.0 + 20.0, 5.5])
    np.testing.assert_allclose(ideal_point(values, senses), [0.4, 100.0, 5.0])
    share = normalised_hypervolume(values, senses, ref, ideal_point(values, senses))
    assert 0.0 < share <= 1.0
    # the single ideal point would fill the whole box
    assert normalised_hypervolume(np.array([[0.4, 100.0, 5.0]]), senses, ref, [0.4, 100.0, 5.0]) == pytest.approx(1)


def test_parse_objectives() -> None:
    assert parse_objectives("valid_ndcg@10:max, peak_mem_mb:min") == {"valid_ndcg@10": "max", "peak_mem_mb": "min"}
    for bad in ("valid_ndcg@10", "valid_ndcg@10:up", "a:max,a:min", ""):
        with pytest.raises(UserError):
            parse_objectives(bad)


def test_energy_is_an_axis_like_memory_and_latency() -> None:
    from study.analysis.runs import check_metrics, efficiency_differences

    runs = pd.DataFrame({"study": ["a"] * 3, "valid_ndcg@10": [0.1, 0.2, 0.15], "device": ["cpu"] * 3,
                         "train_energy_j_per_epoch": [50.0, 80.0, 90.0], "energy_method": ["rapl"] * 3})
    objectives = {"valid_ndcg@10": "max", "train_energy_j_per_epoch": "min"}
    assert list(pareto_front(runs, objectives).index) == [1, 0]  # (0.15, 90 J) is dominated by (0.2, 80 J)
    check_metrics(runs, objectives, "objective")
    with pytest.raises(UserError, match="has no values in study a .energy needs a device with an energy counter"):
        check_metrics(runs.assign(train_energy_j_per_epoch=None, energy_method="unavailable"), objectives, "objective")
    mixed = runs.assign(energy_method=["rapl", "nvml", "rapl"])
    assert efficiency_differences(mixed, objectives) == ["efficiency figures come from different energy_method values "
                                                         "(nvml, rapl)"]
