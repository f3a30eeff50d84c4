"""A claim holds exactly when its stated rule says so: ratio and within on the means, better on a significant gain
after Holm's correction, and a published row on its own dataset's values."""

from __future__ import annotations

import pandas as pd

from study.analysis.claims import Claim
from study.analysis.verdicts import claim_lines, published_lines

ROW = "S3Rec, all-item table, SASRec row"
LASTFM_ROW = (("test_hr@10", 0.0688), ("test_ndcg@10", 0.0390))
BEAUTY_ROW = (("test_hr@10", 0.0605), ("test_ndcg@10", 0.0318))


def seeds(ndcg: list[float], hr: list[float] | None = None) -> pd.DataFrame:
    """One study's per-seed test metrics, indexed by seed as a campaign's page reads them."""
    hr = hr or [2 * value for value in ndcg]
    return pd.DataFrame({"test_ndcg@10": ndcg, "test_hr@10": hr, "test_mrr@10": [v / 2 for v in ndcg]},
                        index=pd.Index(range(1, len(ndcg) + 1), name="seed"))


SASREC = seeds([0.050, 0.052, 0.054, 0.051, 0.053])


def test_a_ratio_claim_holds_at_or_above_its_bound() -> None:
    claim = (Claim("B reaches 0.9x A", "paper", "b", "ratio", reference="a", bound=0.9),)
    [line] = claim_lines({"a": SASREC, "b": seeds([0.91 * v for v in SASREC["test_ndcg@10"]])}, claim)
    assert line.startswith("- **holds**: B reaches 0.9x A (paper). Ours: NDCG@10") and "ratio 0.910" in line
    [line] = claim_lines({"a": SASREC, "b": seeds([0.89 * v for v in SASREC["test_ndcg@10"]])}, claim)
    assert line.startswith("- **does not hold**") and "ratio 0.890" in line
    assert claim_lines({"a": SASREC}, claim) == []  # one of its studies has not run: no line


def test_a_better_claim_needs_a_gain_the_test_separates() -> None:
    claim = (Claim("B outperforms A", "paper", "b", "better", reference="a"),)
    clearly = seeds([v + 0.010 + 0.001 * i for i, v in enumerate(SASREC["test_ndcg@10"])])
    noisy = seeds([v + d for v, d in zip(SASREC["test_ndcg@10"], (0.004, -0.003, 0.002, -0.002, 0.001))])
    [line] = claim_lines({"a": SASREC, "b": clearly}, claim)
    assert line.startswith("- **holds**") and "paired t" in line and "Holm p" in line
    [line] = claim_lines({"a": SASREC, "b": noisy}, claim)
    assert line.startswith("- **does not hold**") and "the test does not separate them" in line
    [line] = claim_lines({"a": SASREC, "b": seeds(list(clearly["test_ndcg@10"])[:3])}, claim)
    assert "Welch t" in line and "paired" not in line and "n = 3 and 5" in line  # a study not at every seed


def test_holm_counts_every_better_line_and_no_other() -> None:
    better = Claim("B outperforms A", "paper", "b", "better", reference="a")
    ratio = Claim("B reaches 0.5x A", "paper", "b", "ratio", reference="a", bound=0.5)
    gain = seeds([v + d for v, d in zip(SASREC["test_ndcg@10"], (0.004, 0.001, 0.006, 0.002, 0.005))])
    values = {"a": SASREC, "b": gain, "c": gain}
    [alone] = claim_lines(values, (better,))
    lines = claim_lines(values, (better, ratio, Claim("C outperforms A", "paper", "c", "better", reference="a")))
    p_alone = alone.split("Holm p = ")[1].split(",")[0]
    p_two = lines[0].split("Holm p = ")[1].split(",")[0]
    assert float(p_two) == 2 * float(p_alone)  # two better lines: Holm doubles the smaller p
    assert "Holm" not in lines[1]


def test_a_within_claim_must_hold_on_every_metric() -> None:
    claim = (Claim("B within 0.01 of A", "paper", "b", "within", reference="a", bound=0.01,
                   metrics=("test_hr@10", "test_ndcg@10")),)
    close = seeds(list(SASREC["test_ndcg@10"] - 0.005), hr=list(2 * SASREC["test_ndcg@10"] - 0.005))
    far_on_hr = seeds(list(SASREC["test_ndcg@10"] - 0.005), hr=list(2 * SASREC["test_ndcg@10"] - 0.02))
    [line] = claim_lines({"a": SASREC, "b": close}, claim)
    assert line.startswith("- **holds**") and "HR@10" in line and "; NDCG@10" in line
    [line] = claim_lines({"a": SASREC, "b": far_on_hr}, claim)
    assert line.startswith("- **does not hold**")


def test_a_published_row_is_matched_within_its_bound_or_above() -> None:
    claim = (Claim("within 5 % of the published NDCG@10, or above it", ROW, "bce", "match", bound=0.05,
                   dataset="lastfm", published=LASTFM_ROW),)
    for ratio, verdict in ((0.96, "**holds**"), (0.94, "**does not hold**"), (1.30, "**holds**")):
        [line] = published_lines("lastfm", {"bce": seeds([0.0390 * ratio] * 3)}, claim)
        assert line.startswith(f"- {verdict}: bce within 5 %"), line
        assert f"({ROW}: HR@10 0.0688, NDCG@10 0.0390)" in line and f"ratio {ratio:.3f}; HR@10 ratio" in line
        assert line.endswith("n = 3).")


def test_a_beat_claim_uses_its_own_datasets_row() -> None:
    claims = tuple(Claim("above the published NDCG@10", ROW, "ce", "beat", dataset=dataset, published=row)
                   for dataset, row in (("lastfm", LASTFM_ROW), ("beauty", BEAUTY_ROW)))
    between = {"ce": seeds([(0.0390 + 0.0318) / 2] * 2)}  # above Beauty's row, below LastFM's
    [on_lastfm] = published_lines("lastfm", between, claims)
    [on_beauty] = published_lines("beauty", between, claims)
    assert on_lastfm.startswith("- **does not hold**") and on_beauty.startswith("- **holds**")
    assert published_lines("ml-100k", between, claims) == []  # no row for that dataset


def test_a_diagnostic_is_set_beside_the_row_without_a_verdict() -> None:
    claim = (Claim("(patience 50) against the published NDCG@10", ROW, "p50", "diagnostic", dataset="lastfm",
                   published=LASTFM_ROW),)
    for ratio in (0.5, 0.99, 1.2):
        [line] = published_lines("lastfm", {"p50": seeds([0.0390 * ratio] * 3)}, claim)
        assert line.startswith("- diagnostic, no verdict: p50 (patience 50)"), line
        assert "holds" not in line and f"ratio {ratio:.3f}" in line
    assert claim_lines({"p50": SASREC}, claim) == []  # a published-row claim is no study claim
