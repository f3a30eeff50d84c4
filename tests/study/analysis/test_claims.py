"""A claim's verdict is its region against the interval over the seeds: holds inside, contradicted entirely outside,
inconclusive otherwise, for each kind; a published row reads our mean's interval against its value."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from study.analysis.claims import CONTRADICTED, HOLDS, INCONCLUSIVE, Claim, Region, combine
from study.analysis.verdicts import claim_lines, published_lines

ROW = "S3Rec, all-item table, SASRec row"
LASTFM_ROW = (("test_hr@10", 0.0688), ("test_ndcg@10", 0.0390))
BEAUTY_ROW = (("test_hr@10", 0.0605), ("test_ndcg@10", 0.0318))
NOISE = (0.004, -0.003, 0.002, -0.002, 0.001)  # sums to 0.002: a mean shift of 0.0004 with sd 0.0029
TIGHT = (0.0004, -0.0003, 0.0002, -0.0002, -0.0001)  # sums to 0, sd 0.00029


def seeds(ndcg: list[float], hr: list[float] | None = None) -> pd.DataFrame:
    """One study's per-seed test metrics, indexed by seed as a campaign's page reads them."""
    hr = hr or [2 * value for value in ndcg]
    return pd.DataFrame({"test_ndcg@10": ndcg, "test_hr@10": hr, "test_mrr@10": [v / 2 for v in ndcg]},
                        index=pd.Index(range(1, len(ndcg) + 1), name="seed"))


SASREC = seeds([0.050, 0.052, 0.054, 0.051, 0.053])
BASE = list(SASREC["test_ndcg@10"])


def shifted(by: float, noise: tuple[float, ...] = TIGHT, scale: float = 1.0) -> pd.DataFrame:
    return seeds([scale * v + by + d for v, d in zip(BASE, noise)])


def verdict(line: str) -> str:
    return line.split("**")[1]


def test_a_region_reads_an_interval_three_ways() -> None:
    gain = Region(0.0, open_low=True)
    assert gain.verdict(0.001, 0.01) == HOLDS and gain.verdict(-0.01, 0.0) == CONTRADICTED
    assert gain.verdict(-0.001, 0.01) == INCONCLUSIVE and gain.verdict(math.nan, math.nan) == INCONCLUSIVE
    within = Region(-0.01, 0.01)
    assert within.verdict(-0.01, 0.01) == HOLDS and within.verdict(0.011, 0.02) == CONTRADICTED
    assert within.verdict(-0.02, 0.0) == INCONCLUSIVE and within.verdict(-0.03, 0.03) == INCONCLUSIVE
    assert combine([HOLDS, HOLDS]) == HOLDS and combine([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([INCONCLUSIVE, CONTRADICTED]) == CONTRADICTED


@pytest.mark.parametrize(("candidate", "expected"), [
    (shifted(0.010), HOLDS),  # every seed ~0.010 above: the interval lies above 0
    (shifted(-0.010), CONTRADICTED),  # every seed ~0.010 below: the interval lies below 0
    (shifted(0.0, NOISE), INCONCLUSIVE),  # the sign agrees, the interval holds 0
])
def test_a_better_claim_reads_the_interval_of_the_paired_difference(candidate: pd.DataFrame, expected: str) -> None:
    claim = (Claim("B outperforms A", "paper", "b", "better", reference="a"),)
    [line] = claim_lines({"a": SASREC, "b": candidate}, claim)
    assert verdict(line) == expected, line
    diff = (candidate["test_ndcg@10"] - SASREC["test_ndcg@10"]).to_numpy()
    half = stats.t.ppf(0.975, 4) * diff.std(ddof=1) / math.sqrt(5)
    assert f"95 % CI [{diff.mean() - half:+.4f}, {diff.mean() + half:+.4f}] against Δ > 0" in line
    assert "paired t p " in line and "n = 5" in line


def test_an_underpowered_better_claim_is_never_contradicted() -> None:
    claim = (Claim("B outperforms A", "paper", "b", "better", reference="a"),)
    below = shifted(-0.002, (0.010, -0.012, 0.011, -0.009, 0.0))  # below on average, far within the noise
    assert verdict(claim_lines({"a": SASREC, "b": below}, claim)[0]) == INCONCLUSIVE
    [line] = claim_lines({"a": SASREC, "b": seeds([0.01])}, claim)  # one seed: no interval at all
    assert verdict(line) == INCONCLUSIVE and "no interval: fewer than 2 seeds on a side, n = 1 and 5" in line
    [line] = claim_lines({"a": SASREC, "b": seeds(BASE[:3])}, claim)  # not the same seeds: Welch
    assert "Welch t p " in line and "n = 3 and 5" in line


def test_better_lines_share_one_bonferroni_family_and_no_other_kind_joins_it() -> None:
    better = Claim("B outperforms A", "paper", "b", "better", reference="a")
    ratio = Claim("B reaches 0.5x A", "paper", "b", "ratio", reference="a", bound=0.5)
    gain = shifted(0.004, NOISE)  # mean 0.0044 = 3.4 se: past t_0.975,4 = 2.78, short of t_0.9875,4 = 3.50
    values = {"a": SASREC, "b": gain, "c": gain}
    [alone] = claim_lines(values, (better,))
    lines = claim_lines(values, (better, ratio, Claim("C outperforms A", "paper", "c", "better", reference="a")))
    assert "95 % CI" in alone and "Bonferroni" not in alone
    diff = (gain["test_ndcg@10"] - SASREC["test_ndcg@10"]).to_numpy()
    half = stats.t.ppf(1 - 0.05 / 4, 4) * diff.std(ddof=1) / math.sqrt(5)  # two lines: level 1 - 0.05 / 2
    assert f"97.5 % CI [{diff.mean() - half:+.4f}, {diff.mean() + half:+.4f}] against Δ > 0, Bonferroni over 2" \
        in lines[0]
    assert "95 % CI" in lines[1] and "Bonferroni" not in lines[1]
    # the same data hold alone at 95 % and not in a family of two
    assert verdict(alone) == HOLDS and verdict(lines[0]) == INCONCLUSIVE


@pytest.mark.parametrize(("scale", "noise", "expected"), [
    (1.2, TIGHT, HOLDS),  # 1.2x: the interval of the ratio lies above 0.9
    (0.6, TIGHT, CONTRADICTED),  # 0.6x: entirely below
    (0.9, NOISE, INCONCLUSIVE),  # at the bound, with noise: the interval straddles it
])
def test_a_ratio_claim_reads_the_difference_to_its_bound(scale: float, noise: tuple[float, ...],
                                                         expected: str) -> None:
    claim = (Claim("B reaches 0.9x A", "paper", "b", "ratio", reference="a", bound=0.9),)
    [line] = claim_lines({"a": SASREC, "b": shifted(0.0, noise, scale)}, claim)
    assert verdict(line) == expected, line
    assert line.startswith(f"- **{expected}**: B reaches 0.9x A (paper). Ours: NDCG@10")
    assert "against ratio ≥ 0.9" in line
    assert claim_lines({"a": SASREC}, claim) == []  # one of its studies has not run: no line


@pytest.mark.parametrize(("hr_shift", "hr_noise", "expected"), [
    (0.002, TIGHT, HOLDS),  # both metrics close: both intervals inside ±0.01
    (-0.03, TIGHT, CONTRADICTED),  # HR@10 0.03 below on every seed: one metric contradicts the claim
    (-0.008, (0.02, -0.015, 0.01, -0.02, 0.005), INCONCLUSIVE),  # HR@10's interval reaches past -0.01
])
def test_a_within_claim_reads_every_metric(hr_shift: float, hr_noise: tuple[float, ...], expected: str) -> None:
    claim = (Claim("B within 0.01 of A", "paper", "b", "within", reference="a", bound=0.01,
                   metrics=("test_hr@10", "test_ndcg@10")),)
    hr = [2 * v + hr_shift + d for v, d in zip(BASE, hr_noise)]
    candidate = seeds([v - 0.001 + d for v, d in zip(BASE, TIGHT)], hr=hr)
    [line] = claim_lines({"a": SASREC, "b": candidate}, claim)
    assert verdict(line) == expected, line
    assert "HR@10" in line and "; NDCG@10" in line and line.count("against |Δ| ≤ 0.01") == 2


def test_a_claim_on_a_metric_one_study_does_not_record_is_not_measured_and_says_which() -> None:
    claim = (Claim("B within 0.01 of A on sampled metrics", "paper", "b", "within", reference="a", bound=0.01,
                   metrics=("test_sampled_hr@10", "test_sampled_ndcg@10"), role="primary"),)
    sampled = {"test_sampled_hr@10": [0.30, 0.31, 0.29, 0.30, 0.32],
               "test_sampled_ndcg@10": [0.15, 0.16, 0.14, 0.15, 0.16]}
    candidate = SASREC.assign(**sampled)
    # as a campaign's page reads them: studies that lack a column get it as NaN beside those that have it
    reference = SASREC.assign(**{metric: math.nan for metric in sampled})
    [line] = claim_lines({"a": reference, "b": candidate}, claim)
    assert line.startswith("- **not measured** (primary): B within 0.01 of A on sampled metrics (paper).")
    assert line.endswith(" a records no sampled HR@10 or sampled NDCG@10; rows carry sampled test metrics where "
                         "their study ran with sampled_test_negatives.")
    [line] = claim_lines({"a": SASREC, "b": SASREC}, claim)  # neither has the column at all
    assert "b records no sampled HR@10 or sampled NDCG@10; a records no sampled HR@10 or" in line
    close = {metric: [v + d for v, d in zip(values, TIGHT)] for metric, values in sampled.items()}
    [line] = claim_lines({"a": SASREC.assign(**close), "b": candidate}, claim)
    assert verdict(line) == HOLDS and "sampled HR@10 0.3040 vs 0.3040" in line, line


@pytest.mark.parametrize(("ratio", "noise", "expected"), [
    (1.0, TIGHT, HOLDS), (0.8, TIGHT, CONTRADICTED), (0.95, NOISE, INCONCLUSIVE)])
def test_a_published_row_is_matched_by_our_means_interval(ratio: float, noise: tuple[float, ...],
                                                         expected: str) -> None:
    claim = (Claim("within 5 % of the published NDCG@10, or above it", ROW, "bce", "match", bound=0.05,
                   dataset="lastfm", published=LASTFM_ROW),)
    values = [0.0390 * ratio + d for d in noise]
    [line] = published_lines("lastfm", {"bce": seeds(values)}, claim)
    assert line.startswith(f"- **{expected}**: bce within 5 %"), line
    mean, sd = pd.Series(values).mean(), pd.Series(values).std(ddof=1)
    half = stats.t.ppf(0.975, 4) * sd / math.sqrt(5)
    assert f"95 % CI [{(mean - half) / 0.039:.3f}, {(mean + half) / 0.039:.3f}] against ratio ≥ 0.95" in line
    assert f"({ROW}: HR@10 0.0688, NDCG@10 0.0390)" in line and "; HR@10 ratio" in line and "n = 5; MDE" in line


@pytest.mark.parametrize(("ratio", "noise", "expected"), [
    (1.3, TIGHT, HOLDS), (0.8, TIGHT, CONTRADICTED), (1.0, NOISE, INCONCLUSIVE)])
def test_a_beat_claim_needs_our_whole_interval_above_the_row(ratio: float, noise: tuple[float, ...],
                                                            expected: str) -> None:
    claims = tuple(Claim("above the published NDCG@10", ROW, "ce", "beat", dataset=dataset, published=row)
                   for dataset, row in (("lastfm", LASTFM_ROW), ("beauty", BEAUTY_ROW)))
    [line] = published_lines("lastfm", {"ce": seeds([0.0390 * ratio + d for d in noise])}, claims)
    assert verdict(line) == expected and "against ratio > 1" in line, line
    assert published_lines("ml-100k", {"ce": SASREC}, claims) == []  # no row for that dataset


def test_a_diagnostic_is_set_beside_the_row_without_a_verdict() -> None:
    claim = (Claim("(patience 50) against the published NDCG@10", ROW, "p50", "diagnostic", dataset="lastfm",
                   published=LASTFM_ROW),)
    for ratio in (0.5, 0.99, 1.2):
        [line] = published_lines("lastfm", {"p50": seeds([0.0390 * ratio + d for d in TIGHT])}, claim)
        assert line.startswith("- diagnostic, no verdict: p50 (patience 50)"), line
        assert "holds" not in line and f"ratio {ratio:.3f}, 95 % CI" in line and "against ratio" not in line
    assert claim_lines({"p50": SASREC}, claim) == []  # a published-row claim is no study claim


def test_a_line_gives_its_mde_and_the_seeds_the_papers_effect_needs() -> None:
    # paired differences 0.01 .. 0.05: sd = 0.0158114, se = sd / sqrt(5) = 0.0070711
    candidate = seeds([v + d for v, d in zip(BASE, (0.01, 0.02, 0.03, 0.04, 0.05))])
    claim = (Claim("B outperforms A", "paper", "b", "better", reference="a", paper_effect=0.2, role="primary"),)
    [line] = claim_lines({"a": SASREC, "b": candidate}, claim)
    # MDE = (t_0.975,4 + t_0.8,4) * se = (2.7764 + 0.9410) * 0.0070711 = 0.0263, 51 % of SASRec's 0.0520
    assert "MDE 0.0263 (51 %)" in line
    # the paper's +20 % of 0.0520 = 0.0104: n = 21 detects it, (2.0860 + 0.8600) * sd / sqrt(21) = 0.01016,
    # n = 20 does not, (2.0930 + 0.8610) * sd / sqrt(20) = 0.01044
    assert "the paper's +20.0 % (+0.0104 here) needs 21 seeds" in line
    assert line.startswith("- **holds** (primary): B outperforms A")
