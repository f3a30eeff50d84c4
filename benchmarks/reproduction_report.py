"""The generated part of the reproduction report (docs/reproduction.md): per dataset, the paper-style table, one
line per claim and per published row, the ablation tables and the runs stopped by the epoch limit.

``python -m benchmarks.reproduction`` runs the studies and calls :func:`report`, :func:`published_section` and
:func:`write_report`; the rules a verdict follows are in :mod:`benchmarks.reproduction_claims`.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

from benchmarks.reproduction_claims import ABLATION_GROUPS, ABLATIONS, CLAIMS, PUBLISHED, Claim
from study.analysis.runs import HISTORY_FILE, assign_labels, collect_runs, load_results
from study.analysis.significance import compare, holm
from study.analysis.tables import fmt, fmt_p

REPO = Path(__file__).resolve().parents[1]
METRICS = ("test_hr@10", "test_ndcg@10", "test_mrr@10")
BEGIN, END = "<!-- generated: python -m benchmarks.reproduction -->", "<!-- end of generated part -->"
MATCH_TOLERANCE = 0.05  # the issue's ±5 % of the published NDCG@10


def seed_values(folders: dict[str, Path]) -> dict[str, pd.DataFrame]:
    """Per study: its successful runs, one row per seed."""
    studies = [load_results(folder) for folder in folders.values()]
    assign_labels(studies)
    runs = collect_runs(studies)
    runs = runs[runs["measured"]]
    return {key: runs[runs["study"] == folder.name].drop_duplicates("seed").set_index("seed")
            for key, folder in folders.items()}


def trial_wall_s(runs: pd.DataFrame, folder: Path) -> float:
    """Wall time of a study's runs: per run, its row's figure or, where larger, its last epoch's cumulative time.

    A row recorded before 2026-11-26 counts only the last run of a trial stopped and resumed; the epoch reports
    always counted the earlier runs too (the checkpoint carries their time), so the larger of the two is the trial's.
    """
    history_file = folder / HISTORY_FILE
    if not len(runs) or not history_file.is_file():
        return float(runs["wall_time_s"].sum()) if len(runs) else 0.0
    history = pd.read_parquet(history_file, columns=["trial_id", "epoch", "wall_time_s"])
    trained = history.sort_values("epoch").groupby("trial_id")["wall_time_s"].last()
    epochs = trained.reindex(runs["trial_id"]).to_numpy()
    return float(pd.Series(runs["wall_time_s"].to_numpy()).combine(pd.Series(epochs), max).sum())


def mean_sd(values: pd.Series) -> str:
    values = values.dropna()
    if len(values) < 2:
        return fmt(values.mean()) if len(values) else "–"
    return f"{values.mean():.4f} ± {values.std(ddof=1):.4f}"


def results_table(values: dict[str, pd.DataFrame]) -> list[str]:
    lines = ["| study | objective | seeds | HR@10 | NDCG@10 | MRR@10 | best epoch (of run) | s/epoch |",
             "|---|---|---|---|---|---|---|---|"]
    for study, runs in values.items():
        objective = str(runs["objective"].iloc[0]) if "objective" in runs and len(runs) else "–"
        epochs = f"{runs['best_epoch'].mean():.0f} ({runs['epochs_run'].mean():.0f})" if len(runs) else "–"
        seconds = f"{runs['epoch_time_s'].median():.1f}" if "epoch_time_s" in runs and len(runs) else "–"
        lines.append(f"| {study} | {objective} | {len(runs)} | "
                     + " | ".join(mean_sd(runs[m]) for m in METRICS) + f" | {epochs} | {seconds} |")
    return lines


def p_text(p: float) -> str:
    """``p = 0.58`` or ``p < 0.0001``."""
    shown = fmt_p(p)
    return f"p {shown[0]} {shown[1:]}" if shown.startswith("<") else f"p = {shown}"


def claim_lines(values: dict[str, pd.DataFrame], claims: tuple[Claim, ...]) -> list[str]:
    """One line per claim whose two studies ran: verdict, our means, the difference and its paired test."""
    tested = []
    for claim in claims:
        if claim.candidate not in values or claim.reference not in values:
            continue
        results = {m: compare(values[claim.candidate][m], values[claim.reference][m]) for m in claim.metrics}
        tested.append((claim, results))
    adjusted = iter(holm([r["p"] for claim, results in tested if claim.kind == "better"
                          for r in results.values()]))
    lines = []
    for claim, results in tested:
        verdicts, parts = [], []
        for metric, r in results.items():
            cand, ref, diff = r["mean_candidate"], r["mean_reference"], r["mean_diff"]
            name = metric.removeprefix("test_").upper()
            text = f"{name} {cand:.4f} vs {ref:.4f} (Δ {diff:+.4f}"
            if claim.kind == "ratio":
                ratio = cand / ref if ref else math.nan
                verdicts.append(ratio >= claim.bound)
                text += f", ratio {ratio:.3f}"
            elif claim.kind == "within":
                verdicts.append(abs(diff) <= claim.bound)
            if not math.isnan(r["p"]):  # studies with different seeds are not paired: Welch's test, over all runs
                text += f", {'paired' if r['test'] == 'paired-t' else 'Welch'} t {p_text(r['p'])}"
            if claim.kind == "better":
                p_holm = next(adjusted)
                verdicts.append(diff > 0 and p_holm < 0.05)
                if not math.isnan(p_holm):
                    text += f", Holm {p_text(p_holm)}"
                if diff > 0 and not p_holm < 0.05:
                    text += "; the sign agrees but the test does not separate them"
            runs = r["n_pairs"] or (r["n_candidate"] if r["n_candidate"] == r["n_reference"]
                                     else f"{r['n_candidate']} and {r['n_reference']}")
            parts.append(text + f", n = {runs})")
        verdict = "**holds**" if all(verdicts) else "**does not hold**"
        lines.append(f"- {verdict}: {claim.text} ({claim.source}). Ours: {'; '.join(parts)}.")
    return lines


def unconverged(values: dict[str, pd.DataFrame], max_epochs: int, patience: int = 10) -> list[str]:
    """Runs the epoch limit stopped, not their early stop: those whose best epoch was their last (still improving)
    and those stopped fewer epochs after their best than their patience (their stopping rule had not fired yet).

    The limit and the patience are each run's own ``config.max_epochs`` and ``config.patience`` where its row
    records them (a study may give more epochs or patience than the shared protocol's), else the arguments."""
    lines = []
    for study, runs in values.items():
        limit, wait = (runs[key].fillna(default) if key in runs else pd.Series(default, index=runs.index)
                       for key, default in (("config.max_epochs", max_epochs), ("config.patience", patience)))
        since_best = runs["epochs_run"] - runs["best_epoch"]
        at_limit = runs["epochs_run"] >= limit
        improving = runs[at_limit & (since_best == 0)]
        if len(improving):
            epochs = sorted({int(e) for e in improving["epochs_run"]})
            lines.append(f"- {study}: seeds {', '.join(str(int(s)) for s in improving.index)} were still improving "
                         f"at epoch {', '.join(map(str, epochs))}")
        for seed in sorted(runs.index[at_limit & (since_best > 0) & (since_best < wait)]):
            lines.append(f"- {study}: seed {int(seed)} stopped at epoch {int(runs.at[seed, 'epochs_run'])}, "
                         f"{int(since_best[seed])} epochs after its best, before its patience of "
                         f"{int(wait[seed])} ran out")
    return lines


def published_lines(dataset: str, values: dict[str, pd.DataFrame]) -> list[str]:
    """One line per published row whose study ran on ``dataset``: verdict, the published and our numbers."""
    lines = []
    for row in PUBLISHED:
        if row.dataset != dataset or row.study not in values:
            continue
        runs = values[row.study]
        hr, ndcg = runs["test_hr@10"].mean(), runs["test_ndcg@10"].mean()
        ratio = ndcg / row.ndcg10
        if row.kind == "match":
            verdict = "**holds**" if ratio >= 1 - MATCH_TOLERANCE else "**does not hold**"
            claim = "within 5 % of the published NDCG@10, or above it"
        elif row.kind == "beat":
            verdict = "**holds**" if ndcg > row.ndcg10 else "**does not hold**"
            claim = "above the published NDCG@10 (a stronger loss than the row's)"
        else:
            verdict, claim = "diagnostic, no verdict", f"({row.change}) against the published NDCG@10"
        lines.append(f"- {verdict}: {row.study} {claim} ({row.source}: "
                     f"HR@10 {row.hr10:.4f}, NDCG@10 {row.ndcg10:.4f}). Ours: HR@10 {mean_sd(runs['test_hr@10'])}, "
                     f"NDCG@10 {mean_sd(runs['test_ndcg@10'])} (ratio {ratio:.3f}; HR@10 ratio "
                     f"{hr / row.hr10:.3f}; n = {len(runs)}).")
    return lines


def published_section(dataset: str, folders: dict[str, Path], args: argparse.Namespace) -> list[str]:
    """The studies rerun under a published table's protocol, against that table's rows."""
    values = seed_values(folders)
    stopped = unconverged(values, 2 if args.quick else 200)
    return ["### Against published rows", "", *results_table(values), "", *published_lines(dataset, values), "",
            *(stopped and ["Stopped by the epoch limit:", "", *stopped, ""])]


def dataset_section(dataset: str, folders: dict[str, Path], args: argparse.Namespace, report_dir: Path) -> list[str]:
    values = seed_values(folders)
    main = {k: v for k, v in values.items() if k not in ABLATIONS}
    wall = sum(trial_wall_s(values[study], folder) for study, folder in folders.items())
    lines = [*results_table(main), "",
             f"Full report with the paired t-tests (Holm), effect sizes and the Pareto fronts: "
             f"[{report_dir.name}/report.md]({report_dir.relative_to(Path(args.out).parent)}/report.md). "
             f"Training time of these runs: {wall / 3600:.2f} h of trial wall time.", "",
             *(f"![Pareto front of validation NDCG@10 against {axis}, {dataset}]"
               f"({report_dir.relative_to(Path(args.out).parent)}/pareto_valid_ndcg_10__{axis}.png)"
               for axis in ("peak_mem_mb", "infer_ms_p50")), "",
             "### Claims", "", *(claim_lines(values, CLAIMS) or ["- no claim has both of its studies yet"]), ""]
    for model, group in ABLATION_GROUPS.items():
        ablations = {study: values[study] for study in group if study in values}
        if any(study in ABLATIONS for study in ablations):
            lines += [f"### {model} ablations", "", *results_table(ablations), ""]
    stopped = unconverged(values, 2 if args.quick else 200)
    lines += ["### Runs stopped by the epoch limit", "", *(stopped or ["- none: every run stopped early on "
                                                                          "validation"]), ""]
    return lines


def write_report(sections: list[str], out: Path) -> None:
    """Replace the generated part of ``out`` (or create it), keeping every hand-written line outside the markers."""
    generated = "\n".join([BEGIN, *sections, END])
    if out.is_file():
        text = out.read_text()
        pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
        text = pattern.sub(lambda _: generated, text) if pattern.search(text) else f"{text.rstrip()}\n\n{generated}\n"
    else:
        text = f"# Reproduction\n\n{generated}\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


def report(dataset: str, folders: dict[str, Path], args: argparse.Namespace) -> list[str]:
    out = Path(args.out)
    report_dir = out.parent / out.stem / dataset
    # another SASRec study (1L1H, `last`) makes study.report label each SASRec study model@study
    reference = f"sasrec@{folders['sasrec'].name}" if any(s.startswith("sasrec-") for s in folders) else "sasrec"
    command = [sys.executable, "-m", "study.report", *map(str, folders.values()), "--out", str(report_dir),
               "--metrics", ",".join(METRICS), "--reference", reference]
    if subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL).returncode != 0:
        print(f"{dataset}: study.report failed", file=sys.stderr)
    return dataset_section(dataset, folders, args, report_dir)
