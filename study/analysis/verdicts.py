"""One line per claim for a campaign's page: the verdict (:meth:`study.analysis.claims.Claim.holds`), our means,
the difference and its test.

``values`` maps a study to its runs, one row per seed (indexed by seed), with a column per metric. Holm's correction
runs over every metric of every ``better`` line of a dataset: those are the claims a test decides.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pandas as pd

from study.analysis.claims import Claim
from study.analysis.significance import compare, holm
from study.analysis.tables import fmt, fmt_p

HOLDS, FAILS, NO_VERDICT = "**holds**", "**does not hold**", "diagnostic, no verdict"


def metric_name(metric: str) -> str:
    """``test_ndcg@10`` → ``NDCG@10``."""
    return metric.removeprefix("test_").upper()


def mean_sd(values: pd.Series) -> str:
    """``0.0525 ± 0.0027`` over the seeds (the mean alone for one seed, ``–`` for none)."""
    values = values.dropna()
    if len(values) < 2:
        return fmt(values.mean()) if len(values) else "–"
    return f"{values.mean():.4f} ± {values.std(ddof=1):.4f}"


def p_text(p: float) -> str:
    """``p = 0.58`` or ``p < 0.0001``."""
    shown = fmt_p(p)
    return f"p {shown[0]} {shown[1:]}" if shown.startswith("<") else f"p = {shown}"


def claim_lines(values: dict[str, pd.DataFrame], claims: tuple[Claim, ...]) -> list[str]:
    """One line per study claim whose two studies ran: verdict, our means, the difference and its test."""
    tested = []
    for claim in claims:
        if claim.against_published or claim.candidate not in values or claim.reference not in values:
            continue
        results = {m: compare(values[claim.candidate][m], values[claim.reference][m]) for m in claim.metrics}
        tested.append((claim, results))
    adjusted = iter(holm([r["p"] for claim, results in tested if claim.kind == "better" for r in results.values()]))
    lines = []
    for claim, results in tested:
        verdicts, parts = [], []
        for metric, result in results.items():
            holds, text = _judge_metric(claim, metric, result, adjusted)
            verdicts.append(holds)
            parts.append(text)
        verdict = HOLDS if all(verdicts) else FAILS
        lines.append(f"- {verdict}: {claim.text} ({claim.source}). Ours: {'; '.join(parts)}.")
    return lines


def _judge_metric(claim: Claim, metric: str, r: dict, adjusted: Iterator[float]) -> tuple[bool, str]:
    """Whether ``claim`` holds on ``metric`` given its comparison ``r``, and the text that shows it."""
    cand, ref, diff = r["mean_candidate"], r["mean_reference"], r["mean_diff"]
    text = f"{metric_name(metric)} {cand:.4f} vs {ref:.4f} (Δ {diff:+.4f}"
    if claim.kind == "ratio":
        text += f", ratio {cand / ref if ref else math.nan:.3f}"
    if not math.isnan(r["p"]):  # studies with different seeds are not paired: Welch's test, over all runs
        text += f", {'paired' if r['test'] == 'paired-t' else 'Welch'} t {p_text(r['p'])}"
    p_holm = next(adjusted) if claim.kind == "better" else math.nan
    holds = claim.holds(cand, ref, diff=diff, p_holm=p_holm)
    if claim.kind == "better":
        if not math.isnan(p_holm):
            text += f", Holm {p_text(p_holm)}"
        if diff > 0 and not holds:
            text += "; the sign agrees but the test does not separate them"
    runs = r["n_pairs"] or (r["n_candidate"] if r["n_candidate"] == r["n_reference"]
                             else f"{r['n_candidate']} and {r['n_reference']}")
    return holds, text + f", n = {runs})"


def published_verdict(claim: Claim, ours: float, published: float) -> str:
    """The verdict of a published-row claim, from our mean and the row's value of the judged metric."""
    holds = claim.holds(ours, published)
    return NO_VERDICT if holds is None else HOLDS if holds else FAILS


def published_lines(dataset: str, values: dict[str, pd.DataFrame], claims: tuple[Claim, ...]) -> list[str]:
    """One line per published-row claim of ``dataset`` whose study ran: verdict, the published and our numbers."""
    lines = []
    for claim in claims:
        if not claim.against_published or claim.dataset != dataset or claim.candidate not in values:
            continue
        runs, row = values[claim.candidate], dict(claim.published)
        judged = claim.metrics[0]
        ratios = {metric: runs[metric].mean() / value for metric, value in row.items()}
        verdict = published_verdict(claim, runs[judged].mean(), row[judged])
        cited = ", ".join(f"{metric_name(m)} {v:.4f}" for m, v in row.items())
        ours = ", ".join(f"{metric_name(m)} {mean_sd(runs[m])}" for m in row)
        others = "".join(f"; {metric_name(m)} ratio {ratio:.3f}" for m, ratio in ratios.items() if m != judged)
        lines.append(f"- {verdict}: {claim.candidate} {claim.text} ({claim.source}: {cited}). Ours: {ours} "
                     f"(ratio {ratios[judged]:.3f}{others}; n = {len(runs)}).")
    return lines
