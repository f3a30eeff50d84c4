"""One line per claim for a campaign's page: the three-valued verdict, our means, the interval of the claim's
statistic against its region, and what the seeds could detect.

``values`` maps a study to its runs, one row per seed (indexed by seed), with a column per metric. The verdict is
the claim's :class:`~study.analysis.claims.Region` against the interval (:mod:`study.analysis.intervals`): holds
inside, contradicted entirely outside, inconclusive otherwise; a claim over several metrics holds when each metric
holds and is contradicted when one is (:func:`~study.analysis.claims.combine`).

Choices:

- Intervals are 95 %, except those of ``better`` lines: every metric of every ``better`` line of a dataset is one
  family of m comparisons against shared baselines, and each of its intervals is Bonferroni-widened to level
  1 − 0.05/m. A verdict then reads the interval printed beside it, and the family's chance of one false "holds" or
  "contradicted" stays at most 0.05 (Holm's step-down would reject a little more, but has no interval to print).
- Each line gives the minimum detectable effect (MDE) of its statistic at the seeds it ran, and, where the claim
  states the paper's effect, the seeds that would detect it; both at two-sided α = 0.05 and power 0.8, before the
  family's correction, from the observed spread (:class:`~study.analysis.intervals.Estimate`).
- A published row has no seeds: its claim reads the interval of our mean against the row's value (one sample),
  shown as a ratio to that value.
"""

from __future__ import annotations

import math

import pandas as pd

from study.analysis.claims import SIGNIFICANCE, Claim, combine
from study.analysis.intervals import LEVEL, Estimate, estimate, estimate_mean, fieller
from study.analysis.tables import fmt, fmt_p, short

NO_VERDICT = "diagnostic, no verdict"


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


def level_text(level: float) -> str:
    """``95 %``, ``99.5 %``, ``99.55 %``: to two decimals at most."""
    digits = next(d for d in range(3) if abs(round(100 * level, d) - 100 * level) < 1e-9 or d == 2)
    return f"{100 * level:.{digits}f} %"


def interval_text(low: float, high: float, digits: int = 4, signed: bool = False) -> str:
    """``[-0.0070, +0.0099]``; ``none`` where there is no interval."""
    if math.isnan(low) or math.isnan(high):
        return "none"
    shown = f"{{:{'+' if signed else ''}.{digits}f}}"
    return f"[{shown.format(low)}, {shown.format(high)}]"


def verdict_mark(verdict: str, claim: Claim) -> str:
    """``**holds**``, with the claim's role where it has one: ``**inconclusive** (primary)``."""
    return f"**{verdict}**" + (f" ({claim.role})" if claim.role else "")


def claim_lines(values: dict[str, pd.DataFrame], claims: tuple[Claim, ...]) -> list[str]:
    """One line per study claim whose two studies ran: verdict, our means, the interval against the region, the MDE
    and the seeds the paper's effect needs."""
    tested = [c for c in claims if not c.against_published and c.candidate in values and c.reference in values]
    family = sum(len(c.metrics) for c in tested if c.kind == "better")
    lines = []
    for claim in tested:
        unmeasured = _unmeasured(claim, values)
        if unmeasured:
            lines.append(f"- **not measured**{f' ({claim.role})' if claim.role else ''}: {claim.text} "
                         f"({claim.source}). {unmeasured}.")
            continue
        level = 1 - SIGNIFICANCE / family if claim.kind == "better" and family > 1 else LEVEL
        judged = [_judge_metric(claim, metric, values, level, family) for metric in claim.metrics]
        verdict = combine([v for v, _ in judged])
        parts = "; ".join(text for _, text in judged)
        lines.append(f"- {verdict_mark(verdict, claim)}: {claim.text} ({claim.source}). Ours: {parts}.")
    return lines


def _unmeasured(claim: Claim, values: dict[str, pd.DataFrame]) -> str:
    """Why ``claim`` cannot be judged though both its studies ran: the metrics a study's rows do not carry (rows
    carry sampled test metrics only where the study set ``sampled_test_negatives``); "" when every one is there."""
    gaps = []
    for study in (claim.candidate, claim.reference):
        lacking = [short(metric) for metric in claim.metrics
                   if metric not in values[study] or values[study][metric].isna().all()]
        if lacking:
            gaps.append(f"{study} records no {' or '.join(lacking)}")
    if gaps and any("sampled_" in metric for metric in claim.metrics):
        gaps.append("rows carry sampled test metrics where their study ran with sampled_test_negatives")
    return "; ".join(gaps)


def _judge_metric(claim: Claim, metric: str, values: dict[str, pd.DataFrame], level: float,
                  family: int) -> tuple[str, str]:
    """The verdict of ``claim`` on ``metric``, and the text that shows why."""
    candidate, reference = values[claim.candidate][metric], values[claim.reference][metric]
    est = estimate(candidate, reference, claim.weight, level)
    region = claim.region()
    mc, mr = est.mean_candidate, est.mean_reference
    text = f"{short(metric)} {mc:.4f} vs {mr:.4f} ("
    if claim.kind == "ratio":
        text += f"ratio {mc / mr if mr else math.nan:.3f}, {level_text(level)} CI "
        text += interval_text(*fieller(candidate, reference, level), digits=3)
    else:
        text += f"Δ {est.value:+.4f}, {level_text(level)} CI {interval_text(est.low, est.high, signed=True)}"
    text += f" against {region.text}"
    if claim.kind == "better" and family > 1:
        text += f", Bonferroni over {family}"
    text += f"; {_test_text(est, with_p=claim.kind == 'better')}{_power_text(claim, est)}"
    return region.verdict(est.low, est.high), text + ")"


def _test_text(est: Estimate, with_p: bool) -> str:
    """``paired t p = 0.54, n = 5``, ``Welch, n = 3 and 5``, or why there is no interval."""
    runs = f"n = {est.n}" if est.n == est.n_reference or est.test == "one-sample" \
        else f"n = {est.n} and {est.n_reference}"
    if est.test == "none":
        return f"no interval: fewer than 2 seeds on a side, {runs}"
    if math.isnan(est.low):
        return f"no interval: no spread across the seeds, {runs}"
    name = {"paired": "paired t", "welch": "Welch t", "one-sample": "t"}[est.test]
    return f"{name} {p_text(est.p)}, {runs}" if with_p else f"{name.removesuffix(' t')}, {runs}"


def _power_text(claim: Claim, est: Estimate) -> str:
    """``; MDE 0.0095 (18 %); the paper's +7.3 % (+0.0038 here) needs 15 seeds``: relative to our reference."""
    mde, scale = est.mde(), est.mean_reference
    if math.isnan(mde):
        return ""
    text = f"; MDE {mde:.4f} ({100 * mde / scale:.0f} %)" if scale else f"; MDE {mde:.4f}"
    if claim.paper_effect is not None:
        effect = claim.paper_effect * scale
        n = est.seeds_for(effect)
        needs = "more than a million" if math.isinf(n) else f"{n:.0f}" if not math.isnan(n) else "?"
        text += f"; the paper's {100 * claim.paper_effect:+.1f} % ({effect:+.4f} here) needs {needs} seeds"
    return text


def published_lines(dataset: str, values: dict[str, pd.DataFrame], claims: tuple[Claim, ...]) -> list[str]:
    """One line per published-row claim of ``dataset`` whose study ran: verdict, the published and our numbers, the
    interval of our mean as a ratio to the row against the claim's region, and its MDE."""
    lines = []
    for claim in claims:
        if not claim.against_published or claim.dataset != dataset or claim.candidate not in values:
            continue
        runs, row = values[claim.candidate], dict(claim.published)
        judged = claim.metrics[0]
        published = row[judged]
        est = estimate_mean(runs[judged])
        region = claim.region(published)
        verdict = NO_VERDICT if region is None else verdict_mark(region.verdict(est.low, est.high), claim)
        ratios = {metric: runs[metric].mean() / value for metric, value in row.items()}
        cited = ", ".join(f"{short(m)} {v:.4f}" for m, v in row.items())
        ours = ", ".join(f"{short(m)} {mean_sd(runs[m])}" for m in row)
        interval = f"{level_text(est.level)} CI {interval_text(est.low / published, est.high / published, 3)}"
        interval += f" against {region.text}" if region else ""
        others = "".join(f"; {short(m)} ratio {ratio:.3f}" for m, ratio in ratios.items() if m != judged)
        mde = est.mde()
        power = "" if math.isnan(mde) else f"; MDE {mde:.4f} ({100 * mde / published:.0f} % of the row)"
        lines.append(f"- {verdict}: {claim.candidate} {claim.text} ({claim.source}: {cited}). Ours: {ours} "
                     f"(ratio {ratios[judged]:.3f}, {interval}{others}; n = {len(runs)}{power}).")
    return lines
