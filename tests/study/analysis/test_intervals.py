"""A claim's statistic over seeds: the paired, Welch and one-sample intervals equal R's and scipy's, a ratio's
Fieller interval says what the difference to its bound says, and no spread gives no interval."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from study.analysis.intervals import estimate, estimate_mean, fieller

# Student's sleep data (R's `sleep`), as in test_significance.py
DRUG1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]
CANDIDATE = pd.Series([0.0604, 0.0551, 0.0642, 0.0608, 0.0631], index=range(1, 6))
REFERENCE = pd.Series([0.0500, 0.0520, 0.0540, 0.0510, 0.0530], index=range(1, 6))


def test_the_paired_interval_is_the_paired_t_tests() -> None:
    est = estimate(pd.Series(DRUG1), pd.Series(DRUG2))
    # R: t.test(DRUG1, DRUG2, paired = TRUE): CI (-2.4598858, -0.7001142), p = 0.002833
    assert est.test == "paired" and est.n == 10 and est.df == 9
    assert (est.low, est.high) == pytest.approx((-2.4598858, -0.7001142), abs=1e-6)
    assert est.p == pytest.approx(0.002833, abs=1e-6)


def test_a_weighted_difference_is_the_one_sample_interval_of_its_per_seed_values() -> None:
    est = estimate(CANDIDATE, REFERENCE, weight=0.9, level=0.99)
    expected = stats.ttest_1samp(CANDIDATE - 0.9 * REFERENCE, 0.0).confidence_interval(0.99)
    assert (est.low, est.high) == pytest.approx((expected.low, expected.high))
    assert est.value == pytest.approx(CANDIDATE.mean() - 0.9 * REFERENCE.mean())


def test_different_seeds_get_welchs_interval() -> None:
    est = estimate(pd.Series(DRUG1, index=range(10)), pd.Series(DRUG2, index=range(100, 110)))
    # R: t.test(DRUG1, DRUG2): df = 17.776, CI (-3.3654832, 0.2054832)
    assert est.test == "welch" and est.df == pytest.approx(17.776, abs=1e-3)
    assert (est.low, est.high) == pytest.approx((-3.3654832, 0.2054832), abs=1e-6)
    assert est.spread == pytest.approx(math.sqrt(np.var(DRUG1, ddof=1) + np.var(DRUG2, ddof=1)))


def test_our_mean_gets_the_one_sample_interval() -> None:
    est = estimate_mean(pd.Series(DRUG1))
    expected = stats.ttest_1samp(DRUG1, 0.0).confidence_interval(0.95)
    assert est.test == "one-sample" and (est.low, est.high) == pytest.approx((expected.low, expected.high))


def test_no_spread_or_one_seed_gives_no_interval() -> None:
    flat = estimate(REFERENCE + 0.002, REFERENCE)  # every seed 0.002 above: no variance estimate
    assert flat.value == pytest.approx(0.002) and math.isnan(flat.low) and math.isnan(flat.mde())
    single = estimate(CANDIDATE.iloc[:1], REFERENCE)
    assert single.test == "none" and math.isnan(single.high)
    assert math.isnan(estimate_mean(pd.Series([0.04, 0.04, 0.04])).low)


@pytest.mark.parametrize("paired", [True, False])
def test_fiellers_interval_holds_exactly_the_ratios_the_difference_does_not_separate(paired: bool) -> None:
    reference = REFERENCE if paired else REFERENCE.set_axis(range(11, 16))
    low, high = fieller(CANDIDATE, reference)
    ratio = CANDIDATE.mean() / reference.mean()
    assert low < ratio < high
    at_low, at_high = estimate(CANDIDATE, reference, weight=low), estimate(CANDIDATE, reference, weight=high)
    if paired:  # an end of the interval is a ratio whose difference interval just touches 0
        assert at_low.low == pytest.approx(0.0, abs=1e-12) and at_high.high == pytest.approx(0.0, abs=1e-12)
    for bound in np.linspace(low - 0.1, high + 0.1, 41):
        difference = estimate(CANDIDATE, reference, weight=bound)
        if abs(bound - low) > 0.01 and abs(bound - high) > 0.01:  # unpaired: df moves a little with the bound
            assert (difference.low > 0) == (bound < low) and (difference.high < 0) == (bound > high)


def test_a_reference_not_separated_from_zero_leaves_the_ratio_unbounded() -> None:
    around_zero = pd.Series([0.01, -0.012, 0.008, -0.009, 0.004], index=range(1, 6))
    assert all(math.isnan(end) for end in fieller(CANDIDATE, around_zero))
