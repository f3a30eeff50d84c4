"""Tests over seeds: scipy's outputs on known data, effect sizes, intervals, Holm against worked examples."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from study.analysis.significance import (
    NO_TEST_NOTE,
    adjust,
    compare,
    compare_many,
    detectable_difference,
    holm,
    seeds_needed,
)

# Student's sleep data (Cushny & Peebles 1905, R's `sleep`): extra hours of sleep of 10 patients under two drugs.
DRUG1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def by_seed(values: list[float], seeds: list[int] | None = None) -> pd.Series:
    return pd.Series(values, index=seeds if seeds is not None else range(len(values)))


def test_paired_t_matches_r_and_scipy_on_the_sleep_data() -> None:
    row = compare(by_seed(DRUG1), by_seed(DRUG2))
    # R: t.test(DRUG1, DRUG2, paired = TRUE) -> t = -4.0621, df = 9, p = 0.002833, CI (-2.4598858, -0.7001142)
    assert row["test"] == "paired-t" and row["n_pairs"] == 10
    assert row["t"] == pytest.approx(-4.0621, abs=1e-4)
    assert row["df"] == 9
    assert row["p"] == pytest.approx(0.002833, abs=1e-6)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((-2.4598858, -0.7001142), abs=1e-6)
    assert row["mean_diff"] == pytest.approx(-1.58)
    expected = stats.ttest_rel(DRUG1, DRUG2)
    assert (row["t"], row["p"]) == (pytest.approx(expected.statistic), pytest.approx(expected.pvalue))
    diff = np.subtract(DRUG1, DRUG2)
    assert row["effect_kind"] == "dz"
    assert row["effect"] == pytest.approx(diff.mean() / diff.std(ddof=1))
    assert row["robust_test"] == "wilcoxon-signed-rank"
    assert row["robust_p"] == pytest.approx(stats.wilcoxon(DRUG1, DRUG2).pvalue)


def test_pairing_follows_the_seeds_not_the_order() -> None:
    shuffled = [5, 2, 8, 0, 9, 1, 3, 7, 4, 6]
    candidate = by_seed([DRUG1[s] for s in shuffled], shuffled)
    assert compare(candidate, by_seed(DRUG2))["t"] == pytest.approx(-4.0621, abs=1e-4)


def test_welch_matches_r_and_scipy_when_seeds_differ() -> None:
    row = compare(by_seed(DRUG1, list(range(10))), by_seed(DRUG2, list(range(100, 110))))
    # R: t.test(DRUG1, DRUG2) -> t = -1.8608, df = 17.776, p = 0.07939, CI (-3.3654832, 0.2054832)
    assert row["test"] == "welch-t" and row["n_pairs"] == 0
    assert row["t"] == pytest.approx(-1.8608, abs=1e-4)
    assert row["df"] == pytest.approx(17.776, abs=1e-3)
    assert row["p"] == pytest.approx(0.07939, abs=1e-5)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((-3.3654832, 0.2054832), abs=1e-6)
    expected = stats.ttest_ind(DRUG1, DRUG2, equal_var=False)
    assert (row["t"], row["p"]) == (pytest.approx(expected.statistic), pytest.approx(expected.pvalue))
    pooled = np.sqrt((np.var(DRUG1, ddof=1) + np.var(DRUG2, ddof=1)) / 2)  # equal n: the plain average
    assert row["effect_kind"] == "d"
    assert row["effect"] == pytest.approx((np.mean(DRUG1) - np.mean(DRUG2)) / pooled)
    assert row["robust_p"] == pytest.approx(stats.mannwhitneyu(DRUG1, DRUG2).pvalue)


def test_unequal_group_sizes_use_welch_with_a_t_based_interval() -> None:
    a, b = [0.31, 0.29, 0.33], [0.25, 0.27, 0.26, 0.24, 0.28]
    row = compare(by_seed(a), by_seed(b))  # seeds 0..2 vs 0..4: not the same set
    assert row["test"] == "welch-t"
    va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 5
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 4)
    half = stats.t.ppf(0.975, df) * np.sqrt(va + vb)
    diff = np.mean(a) - np.mean(b)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((diff - half, diff + half))
    assert "seeds differ" in row["note"]


def test_fewer_than_two_seeds_gives_no_p_value() -> None:
    row = compare(by_seed([0.3]), by_seed([0.2, 0.25]))
    assert row["test"] == "none" and np.isnan(row["p"]) and row["note"] == NO_TEST_NOTE
    assert row["mean_diff"] == pytest.approx(0.3 - 0.225)


def test_zero_variance_gives_no_p_value_instead_of_certainty() -> None:
    # the same difference under every seed: scipy says t = inf, p = 0; that is no evidence, so no p-value
    constant_shift = compare(by_seed([0.31, 0.35]), by_seed([0.30, 0.34]))
    assert stats.ttest_rel([0.31, 0.35], [0.30, 0.34]).pvalue < 1e-6
    assert constant_shift["test"] == "paired-t" and np.isnan(constant_shift["p"]) and np.isnan(constant_shift["t"])
    assert constant_shift["mean_diff"] == pytest.approx(0.01)
    assert "no variance" in constant_shift["note"]
    identical = compare(by_seed([0.3, 0.3]), by_seed([0.3, 0.3]))
    assert np.isnan(identical["p"]) and "no variance" in identical["note"]
    unpaired = compare(by_seed([0.3, 0.3]), by_seed([0.2, 0.2], [5, 6]))
    assert unpaired["test"] == "welch-t" and np.isnan(unpaired["p"]) and "no variance" in unpaired["note"]


def test_holm_worked_examples() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4x, 3x, 2x, 1x = 0.02, 0.03, 0.06, 0.04 -> monotone: 0.02, 0.03, 0.06, 0.06
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    # R: p.adjust(c(0.01, 0.02, 0.03, 0.04, 0.05), "holm") = 0.05 0.08 0.09 0.09 0.09
    np.testing.assert_allclose(holm([0.01, 0.02, 0.03, 0.04, 0.05]), [0.05, 0.08, 0.09, 0.09, 0.09])
    # capped at 1; missing p-values are left out of m and stay missing
    np.testing.assert_allclose(holm([0.6, None, 0.02, np.nan]), [0.6, np.nan, 0.04, np.nan])
    assert np.isnan(holm([])).all()
    with pytest.raises(ValueError):
        holm([1.5])


def test_adjust_marks_significance_over_the_whole_family() -> None:
    groups = {"sasrec": by_seed(DRUG2), "a": by_seed(DRUG1), "b": by_seed([1.0, 2.0][:1])}
    table = adjust(pd.DataFrame(compare_many(groups, "sasrec", "test_ndcg@10")))
    assert table["candidate"].tolist() == ["a", "b"]
    # one testable comparison: Holm leaves it unchanged; the untestable one stays NA
    assert table["p_holm"].iloc[0] == pytest.approx(table["p"].iloc[0])
    assert bool(table["significant"].iloc[0]) is True
    assert pd.isna(table["significant"].iloc[1])
    assert table["reading"].tolist() == ["lower", ""]  # drug 1 gives less sleep; b has no test


def test_a_comparison_the_family_does_not_separate_reads_inconclusive_never_no_different() -> None:
    groups = {"sasrec": by_seed(DRUG2), "a": by_seed(DRUG1), "c": by_seed([v + 0.1 for v in DRUG2[::-1]])}
    table = adjust(pd.DataFrame(compare_many(groups, "sasrec", "test_ndcg@10")))
    assert table["reading"].tolist() == ["lower", "inconclusive"]
    assert set(adjust(pd.DataFrame(compare_many({"sasrec": by_seed(DRUG1)}, "sasrec", "m")))) >= {"reading"}


def test_the_detectable_difference_and_the_seeds_needed_match_the_t_quantiles() -> None:
    # paired differences 0.01 .. 0.05: sd = 0.0158114, se = sd / sqrt(5) = 0.0070711, df = 4;
    # t_0.975,4 = 2.7764, t_0.8,4 = 0.9410: MDE = 3.7174 * 0.0070711 = 0.026286
    sd = np.std([0.01, 0.02, 0.03, 0.04, 0.05], ddof=1)
    assert detectable_difference(sd / np.sqrt(5), 4) == pytest.approx(0.026286, abs=1e-6)
    # an effect of 0.01: n = 22 detects it, (2.0796 + 0.8591) * sd / sqrt(22) = 0.009906; n = 21 does not,
    # (2.0860 + 0.8600) * sd / sqrt(21) = 0.010165
    assert seeds_needed(0.01, sd) == 22 and seeds_needed(-0.01, sd) == 22
    # unpaired, n per side, spread sqrt(s1² + s2²), 2n - 2 df: (2.0211 + 0.8507) * sd / sqrt(21) = 0.009909
    assert seeds_needed(0.01, sd, paired=False) == 21
    assert np.isnan(seeds_needed(0.0, sd)) and np.isnan(detectable_difference(0.0, 4))
    assert seeds_needed(1e-9, sd, most=1000) == float("inf")
    row = compare(by_seed([0.06, 0.07, 0.08, 0.09, 0.10]), by_seed([0.05] * 5))
    assert row["mde_diff"] == pytest.approx(0.026286, abs=1e-6)
    # the observed difference, 0.03: five pairs, as the MDE at n = 5 (0.0263) is below it and at n = 4 (0.0329) not
    assert row["seeds_needed"] == 5
