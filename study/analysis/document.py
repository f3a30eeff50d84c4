"""Turn one or several studies' results into a report: Pareto fronts, a paper-style table, significance tests.

    python -m study.report results/<study> [results/<study2> …] [--out DIR] [--objectives M:max,M:min,…]
        [--reference sasrec] [--proposed MODEL] [--hv-reference M=V,…] [--allow-mixed-protocols]

Data flow:

1. :func:`~study.analysis.runs.load_results` reads each study folder (``trials.parquet``, ``replicates.parquet``
   from :mod:`study.replicate`, ``study.yaml``, ``environment.json``); :func:`~study.analysis.runs.collect_runs`
   keeps the successful runs and gives each a ``config_id``: the hash of its settings without the seed, so the
   runs of one configuration under several seeds group together.
2. A configuration is measured by its **replicates** when it has any (complete runs under new seeds, never
   stopped early), otherwise by its sweep trials (several when the study searched ``seed``).
   :func:`~study.analysis.tables.aggregate` gives one point per configuration: the mean over its seed runs, the std
   and n.
3. Pareto fronts over the objectives (default ``valid_ndcg@10:max, peak_mem_mb:min, infer_ms_p50:min``) —
   the 3-D non-dominated set globally and per model, the 2-D front of every pair — and hypervolumes against
   one reference point for all (:mod:`study.analysis.pareto`). Objectives are validation metrics and efficiency
   figures: ``test_`` metrics are reported, never selected on.
4. Each model's **chosen configuration**: the best mean validation metric (``--select-metric``, default the
   first ``valid_`` objective) among its replicated configurations, or among all when none is replicated.
   The results table gives its test metrics (mean ± std over seeds) and :mod:`study.analysis.significance` compares
   it with the reference model's, seed by seed.
5. Each section of the document is one function over a :class:`ReportContext`; :mod:`study.analysis.render`
   writes ``report.md`` and a self-contained ``report.html`` (plots embedded as base64), beside the plots as PNG and
   SVG and a CSV + Parquet file of every table, in ``--out`` (default ``<study>/report``).

The command line is :mod:`study.report`. Bad input (a missing or empty folder, no successful trial, an absent
metric, studies evaluated under different protocols) is a :class:`~study.errors.UserError`: one line, exit code 2.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from study.analysis import significance
from study.analysis.figures import plot_hyperparameters, plot_pairs, safe_name
from study.analysis.options import DEFAULT_REFERENCE_MODEL, ReportOptions
from study.analysis.progress import describe
from study.analysis.render import Document
from study.analysis.runs import (
    STUDY_FILE,
    StudyResults,
    assign_labels,
    check_metrics,
    check_objectives,
    check_protocols,
    collect_runs,
    efficiency_differences,
    load_results,
    name_configs,
    selection_metric,
)
from study.analysis.tables import (
    ParetoResult,
    aggregate,
    analyse_pareto,
    choose,
    chosen_runs,
    configuration_keys,
    dataset_statistics,
    environment_table,
    extra_table,
    fmt,
    fmt_p,
    formatted,
    is_set,
    pareto_pairs_table,
    plain_value,
    results_table,
    resumed_notes,
    short,
    significance_table,
    study_table,
    write_table,
)
from study.errors import UserError
from study.storage import local_copy
from study.train.results import EFFICIENCY_METRICS

REPORT_DIR = "report"


@dataclass
class ReportContext:
    """What the report's sections share: the studies, their runs, the analysis and its tables and figures."""

    studies: list[StudyResults]
    runs: pd.DataFrame
    options: ReportOptions
    select: str  # the validation metric that chose each configuration
    reference: str | None  # reference model of the tests; None: no tests
    result: ParetoResult
    tables: dict[str, pd.DataFrame]
    table_notes: list[str]
    protocol_notes: list[str]
    efficiency_notes: list[str]
    synthetic: bool
    figures: list[tuple[Path, str]] = field(default_factory=list)
    hparam_figures: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return "Study report: " + ", ".join(s.name for s in self.studies)

    @property
    def configuration_keys(self) -> list[str]:
        """The settings shown with each configuration: max_len, then every study's searched keys, each once."""
        return configuration_keys([k for s in self.studies for k in s.searched])


def default_out(paths: list[Path]) -> Path:
    """``<study>/report`` for one study; ``report-<a>+<b>…`` beside the first study for several."""
    if len(paths) == 1:
        return paths[0] / REPORT_DIR
    names = "+".join(p.resolve().name for p in paths)
    return paths[0].resolve().parent / f"report-{safe_name(names)[:100]}"


def relative_to_report(folder: str | Path, out_dir: Path) -> str:
    """``folder`` as a path from the report's folder, so that a report moved or committed with its results still
    locates them and names no one's home directory; absolute where no relative path exists (another drive)."""
    try:
        return Path(os.path.relpath(Path(folder).resolve(), out_dir.resolve())).as_posix()
    except ValueError:
        return str(folder)


def _reference_model(options: ReportOptions, labels: list[str]) -> str | None:
    """The reference of the tests: --reference, else sasrec when it is among the studies, else none."""
    reference = options.reference_model
    if reference is not None and reference not in labels:
        raise UserError(f"--reference {reference}: no such model among the studies ({', '.join(labels)})")
    if options.proposed is not None and options.proposed not in labels:
        raise UserError(f"--proposed {options.proposed}: no such model among the studies ({', '.join(labels)})")
    if reference is None and DEFAULT_REFERENCE_MODEL in labels:
        reference = DEFAULT_REFERENCE_MODEL
    return reference


def analyse(paths: list[str | Path], options: ReportOptions) -> ReportContext:
    """Load and check the studies, aggregate them per configuration, find the fronts and run the tests."""
    if not paths:
        raise UserError("no results folder given")
    check_objectives(options.objectives)
    select = selection_metric(options.objectives, options.select_metric)
    studies = [load_results(local_copy(p)) for p in paths]
    assign_labels(studies)
    runs = collect_runs(studies)
    check_metrics(runs, options.objectives, "objective")
    check_metrics(runs, [select], "selection metric")
    check_metrics(runs, options.metrics, "table metric")
    protocol_notes = check_protocols(runs, options.allow_mixed_protocols)
    labels = [s.label for s in studies]
    reference = _reference_model(options, labels)

    searched = {s.label: s.searched for s in studies}
    points = name_configs(aggregate(runs, searched), select)
    result = analyse_pareto(points, options.objectives, options.hv_reference, options.margin)
    points = result.points
    chosen = choose(points, select)
    chosen = chosen.set_index("label").loc[labels].reset_index()  # rows in the order the studies were given
    per_label = chosen_runs(runs, chosen)
    sig = significance_table(per_label, reference, list(options.metrics), options.alpha) \
        if reference is not None and len(labels) > 1 else pd.DataFrame()
    table, numbers, table_notes = results_table(chosen, list(options.metrics), sig, reference, options.proposed)

    names = list(options.objectives)
    shown_keys = configuration_keys([k for s in studies for k in s.searched])
    point_columns = ["name", "label", "config_id", *names, "n_seeds", "source", "on_front", "on_model_front",
                     "test_ndcg@10", *[k for k in shown_keys if k in points]]
    front = points[points["on_front"]].sort_values(names[0], ascending=options.objectives[names[0]] == "min")
    tables = {
        "studies": study_table(studies), "datasets": dataset_statistics(runs),
        "environment": environment_table(studies, runs),
        "configurations": points, "selected": chosen, "results": numbers, "results_formatted": table,
        "pareto_front": front[[c for c in point_columns if c in front]],
        "hypervolume": result.hypervolumes,
        "hv_reference": pd.DataFrame([{"objective": n, "sense": options.objectives[n], "reference": result.reference[n],
                                       "ideal": result.ideal[n]} for n in names]),
        "significance": sig, "extra": extra_table(per_label),
        "pareto_2d": pareto_pairs_table(result, options.objectives),
    }
    synthetic = bool(runs["synthetic"].astype(bool).any()) if "synthetic" in runs else False
    return ReportContext(studies=studies, runs=runs, options=options, select=select, reference=reference,
                         result=result, tables=tables, table_notes=table_notes, protocol_notes=protocol_notes,
                         efficiency_notes=efficiency_differences(runs, options.objectives), synthetic=synthetic)


def build_report(paths: list[str | Path], out: str | Path | None = None,
                 options: ReportOptions | None = None) -> dict[str, Any]:
    """Analyse the studies in ``paths`` and write the report into ``out``; returns the tables and file paths."""
    options = options or ReportOptions()
    context = analyse(paths, options)
    out_dir = Path(out) if out is not None else default_out([Path(p) for p in paths])
    out_dir.mkdir(parents=True, exist_ok=True)
    if options.plots:
        context.figures = plot_pairs(context.result, options.objectives, out_dir)
        searched = {s.label: s.searched for s in context.studies}
        specs = {s.label: s.study.get("search") or {} for s in context.studies}
        context.hparam_figures = plot_hyperparameters(context.result, options.objectives, searched, specs, out_dir)
    studies = context.tables["studies"]
    studies["folder"] = [relative_to_report(folder, out_dir) for folder in studies["folder"]]
    for stem, frame in context.tables.items():
        write_table(frame, out_dir, stem)
    doc = compose(context)
    (out_dir / "report.md").write_text(doc.markdown(out_dir))
    (out_dir / "report.html").write_text(doc.html(context.title))
    return {"out": out_dir, "tables": context.tables,
            "figures": [p for p, _ in context.figures + context.hparam_figures],
            "reference": context.reference, "select_metric": context.select, "studies": context.studies}


# ---------------------------------------------------------------------------------------------------------------
# Sections: each appends its part of the report to the document


def introduction(doc: Document, ctx: ReportContext) -> None:
    doc.heading(1, ctx.title)
    if ctx.synthetic:
        doc.warning("SYNTHETIC DATA. These studies ran on generated sequences: the numbers test the pipeline and "
                    "compare costs; they are not evidence about recommendation accuracy on real data.")
    if ctx.protocol_notes:
        doc.warning("MIXED PROTOCOLS (--allow-mixed-protocols): " + " | ".join(ctx.protocol_notes) + ". Metrics "
                    "from different protocols are not comparable; read each row in its own context.")
    if ctx.efficiency_notes:
        doc.warning("EFFICIENCY FIGURES DIFFER IN HOW THEY WERE MEASURED: " + "; ".join(ctx.efficiency_notes) + ". "
                    "Memory, latency and energy compare only between runs measured the same way; read the fronts "
                    "with care.")
    running = [s for s in ctx.studies if s.unfinished]
    if running:
        doc.warning("STILL RUNNING: " + "; ".join(f"{s.name} has {len(s.unfinished)} trial(s) without a record yet "
                                                  f"({describe(s.unfinished)})" for s in running)
                    + ". They are still running, or were stopped with their sweep (--resume continues them); this "
                    "report covers the trials that had finished when it was written.")
    doc.para(f"Configurations are selected on validation (`{ctx.select}`); every test figure is that of the trial's "
             "best-validation epoch and is reported, never used for selection. A configuration's value is its mean "
             "over seeds: over its replicates when it has any (python -m study.replicate), else over its sweep trials.")


def studies_and_protocol(doc: Document, ctx: ReportContext) -> None:
    doc.heading(2, "Studies and protocol")
    doc.table(formatted(ctx.tables["studies"].drop(columns=["folder"])))
    runs = ctx.runs
    protocol = runs.drop_duplicates("study").set_index("study")
    rows = []
    for s in ctx.studies:
        p = protocol.loc[s.name]
        rows.append({"study": s.name, "dataset": p.get("dataset"), "ranking": p.get("eval_mode"),
                     "negatives": f"{p.get('num_negatives')} ({p.get('negative_sampler')})"
                     if p.get("eval_mode") == "sampled" else "all items",
                     "mask history": p.get("mask_history"),
                     "max_len": ", ".join(plain_value(v) for v in sorted(set(runs.loc[runs["study"] == s.name,
                                                                                     "config.max_len"].dropna())))
                     if "config.max_len" in runs else "–",
                     "training objective": ", ".join(sorted(set(runs.loc[runs["study"] == s.name, "objective"]
                                                                .astype(str)))) if "objective" in runs else "",
                     "max epochs": (s.study.get("budget") or {}).get("max_epochs"),
                     "scheduler": (s.study.get("scheduler") or {}).get("type", "none") if s.study else "",
                     "sampler": s.study.get("sampler")})
    doc.table(formatted(pd.DataFrame(rows)))
    doc.para("Each study's resolved configuration (search space, budget, resources) is in the appendix.")


def dataset(doc: Document, ctx: ReportContext) -> None:
    doc.heading(2, "Dataset")
    datasets = ctx.tables["datasets"]
    doc.table(formatted(datasets, 4))
    if "users" not in datasets or datasets["users"].isna().any():
        doc.para("Statistics are read from the prepared copy in this machine's data cache (`$SEQREC_DATA`); a "
                 "dataset without them was not found there (prepare it with python -m study.data prepare).")


def environment(doc: Document, ctx: ReportContext) -> None:
    doc.heading(2, "Environment")
    table = ctx.tables["environment"]
    doc.table(formatted(table))
    doc.para("`started`: when the study's first session began, i.e. when it ran; `sessions`: 1, or more where "
             "`--resume` continued it.")
    resumed = resumed_notes(ctx.studies)
    if resumed:
        doc.bullets(resumed)
    accelerators = set(table["accelerator"].astype(str))
    doc.para("Efficiency figures (memory, latency, throughput, energy) were measured on "
             + (" and ".join(sorted(accelerators)) if accelerators else "an unknown device")
             + "; they compare configurations measured on the same machine, not across machines.")


def results(doc: Document, ctx: ReportContext) -> None:
    doc.heading(2, "Results")
    doc.para(f"Test metrics of each model's chosen configuration (best mean `{ctx.select}`), mean ± std over n "
             "seeds; best mean in bold.")
    doc.table(ctx.tables["results_formatted"])
    if ctx.table_notes:
        doc.bullets(ctx.table_notes)
    selected = ctx.tables["selected"]
    doc.para("Chosen configurations (a setting a study fixed rather than searched shows the value it ran with; "
             "– : the model has no such setting):")
    shown = ["label", "name", "config_id", "source", "n_seeds", "seeds", ctx.select, *EFFICIENCY_METRICS[:3]]
    keys = ctx.configuration_keys
    doc.table(formatted(selected[[c for c in shown + keys if c in selected]], plain=keys))


def significance_tests(doc: Document, ctx: ReportContext) -> None:
    doc.heading(2, "Significance")
    sig = ctx.tables["significance"]
    if ctx.reference is None:
        doc.para(f"No tests: the reference model ({DEFAULT_REFERENCE_MODEL} by default) is not among the studies; "
                 "name one with --reference.")
        return
    if sig.empty:
        doc.para("No tests: a single model has nothing to be compared with.")
        return
    untested = sig[sig["test"] == "none"]
    if not untested.empty:
        doc.warning(f"{len(untested)} of {len(sig)} comparisons have no p-value: fewer than "
                    f"{significance.MIN_SEEDS} seeds on a side. Replicate the chosen configurations first: "
                    "python -m study.replicate results/<study> --seeds 5 --select top:1")
    doc.para(f"Each model's chosen configuration against {ctx.reference}'s, per metric: two-sided t-test over seeds "
             "(paired when both sides ran the same seeds, Welch's otherwise), a rank test as robustness check "
             "(Wilcoxon signed-rank when paired, Mann–Whitney U otherwise), Cohen's d_z (paired) or d (pooled "
             f"SD) with an approximate 95 % interval (from {significance.POWERED_SEEDS} seeds per side on), the 95 % "
             "confidence interval of the mean difference (model − reference), the smallest difference each test "
             f"detects with power {significance.TARGET_POWER} at alpha 0.05 (MDE, from the observed spread; its "
             "standardized size beside it) and the seeds per side that would detect the observed difference "
             f"(seeds for Δ). p-values are Holm–Bonferroni adjusted over all {len(sig)} comparisons of this report "
             f"(the rank-test p-values as a family of their own); * = adjusted t-test p < {ctx.options.alpha}. "
             "Reading: higher or lower than the reference where the adjusted p is below alpha, else inconclusive "
             "(a test that does not separate two models does not show them equal: compare Δ with the MDE).")
    low_power = low_power_note(sig)
    if low_power:
        doc.warning(low_power)
    doc.table(_significance_display(sig))


def pareto_fronts(doc: Document, ctx: ReportContext) -> None:
    objectives, result = ctx.options.objectives, ctx.result
    names = list(objectives)
    doc.heading(2, "Pareto fronts")
    objectives_text = ", ".join(f"`{n}` ({'↑' if objectives[n] == 'max' else '↓'})" for n in names)
    doc.para(f"Objectives: {objectives_text}. Each point is a configuration (mean over its seeds). The "
             f"{len(names)}-D non-dominated set over all models:")
    doc.table(formatted(ctx.tables["pareto_front"], plain=ctx.configuration_keys))
    reference_text = ", ".join(f"`{n}` = {fmt(result.reference[n])}" for n in names)
    doc.para(f"Hypervolume reference point: {reference_text} ({result.reference_note}). `hv_share` is the "
             "hypervolume divided by the box between the ideal point (best observed value of each objective) and "
             "the reference: comparable across models because all share that point.")
    doc.table(formatted(ctx.tables["hypervolume"], 4))
    if result.pairs:
        pairs = ctx.tables["pareto_2d"]
        doc.para("2-D fronts of every objective pair (all models):")
        listed = [{"pair": f"{a} / {b}", "front (best first along the pair's first objective)":
                   ", ".join(pairs[(pairs["x"] == a) & (pairs["y"] == b)]["name"])} for a, b in result.pairs]
        doc.table(pd.DataFrame(listed))
    for path, caption in ctx.figures:
        doc.image(path, caption)
    if ctx.hparam_figures:
        doc.heading(3, "Hyperparameters against objectives")
        for path, caption in ctx.hparam_figures:
            doc.image(path, caption)


def model_statistics(doc: Document, ctx: ReportContext) -> None:
    extras = ctx.tables["extra"]
    if extras.empty:
        return
    doc.heading(2, "Model statistics")
    title = "From each chosen configuration's `extra` column, mean ± std over its seeds"
    if extras["statistic"].astype(str).str.startswith("expert").any():
        title += " (ELASTIC: expert usage of the validation pass at the best epoch)"
    doc.para(title + ".")
    doc.table(formatted(extras))


def appendix(doc: Document, ctx: ReportContext) -> None:
    doc.heading(2, "Appendix: study configurations")
    for s in ctx.studies:
        if s.study:
            shown = {k: s.study[k] for k in ("model", "dataset", "protocol", "fixed", "search", "objectives", "budget",
                                             "scheduler", "resources", "sampler", "seeds") if k in s.study}
            doc.para(f"`{s.name}` (resolved `{STUDY_FILE}`):")
            doc.code(yaml.safe_dump(shown, sort_keys=False, default_flow_style=None, width=110))
        else:
            doc.para(f"`{s.name}`: no `{STUDY_FILE}` in {s.path}.")


def files(doc: Document, ctx: ReportContext) -> None:
    doc.heading(2, "Files")
    doc.para("Every table above is beside this report as CSV and Parquet (`results`, `selected`, `configurations`, "
             "`pareto_front`, `pareto_2d`, `hypervolume`, `hv_reference`, `significance`, `extra`, `studies`, "
             "`datasets`, `environment`); plots as PNG and SVG.")


SECTIONS: tuple[Callable[[Document, ReportContext], None], ...] = (
    introduction, studies_and_protocol, dataset, environment, results, significance_tests, pareto_fronts,
    model_statistics, appendix, files)


def compose(ctx: ReportContext) -> Document:
    """The report document: every section in order."""
    doc = Document()
    for section in SECTIONS:
        section(doc, ctx)
    return doc


def _effect_text(s: pd.Series) -> str:
    """The effect size with its interval, or marked unreliable where fewer than POWERED_SEEDS seeds measured it."""
    if pd.isna(s["effect"]):
        return "–"
    text = f"{s['effect_kind']} = {fmt(s['effect'])}"
    if is_set(s["effect_reliable"]):
        return f"{text} [{fmt(s['effect_ci_low'])}, {fmt(s['effect_ci_high'])}]"
    return f"{text} (unreliable: n < {significance.POWERED_SEEDS})"


def low_power_note(sig: pd.DataFrame) -> str:
    """One line on the tests run with fewer than POWERED_SEEDS seeds a side: which effects they could detect."""
    few = sig[(sig["test"] != "none") & (sig[["n_candidate", "n_reference"]].min(axis=1) < significance.POWERED_SEEDS)]
    if few.empty:
        return ""
    cases = few.drop_duplicates(["test", "n_candidate", "n_reference"])
    detectable = "; ".join(
        f"|{'d_z' if row['test'] == 'paired-t' else 'd'}| ≥ {fmt(row['mde'])} "
        + (f"({row['n_pairs']} pairs)" if row["test"] == "paired-t" else f"(n = {row['n_candidate']} / "
           f"{row['n_reference']})") for _, row in cases.iterrows())
    return (f"LOW POWER: {len(few)} of {len(sig)} tests ran on fewer than {significance.POWERED_SEEDS} seeds per side. "
            f"At alpha 0.05 (before Holm), such a test detects with probability {significance.TARGET_POWER} only a "
            f"standardized effect of {detectable}; a non-significant result here is no evidence of no difference, "
            "and those effect sizes are marked unreliable. Replicate with --seeds 5 or more for a test that can "
            "find moderate differences.")


def _detectable_text(s: pd.Series) -> str:
    """The smallest difference the test detects, in the metric's units, with its standardized size beside it."""
    if not s["mde"] > 0:
        return "–"
    standardized = f"{'d_z' if s['test'] == 'paired-t' else 'd'} ≥ {fmt(s['mde'])}"
    return f"{fmt(s['mde_diff'])} ({standardized})" if math.isfinite(s["mde_diff"]) else standardized


def _seeds_text(seeds: float) -> str:
    return "–" if math.isnan(seeds) else "> 1,000,000" if math.isinf(seeds) else f"{seeds:,.0f}"


def _significance_display(sig: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, s in sig.iterrows():
        n = f"{s['n_pairs']} pairs" if s["test"] == "paired-t" else f"{s['n_candidate']} / {s['n_reference']}"
        ci = f"[{fmt(s['ci_low'])}, {fmt(s['ci_high'])}]" if not pd.isna(s["ci_low"]) else "–"
        rows.append({"model": s["candidate"], "metric": short(s["metric"]), "test": s["test"], "n": n,
                     "mean diff": fmt(s["mean_diff"]), "95% CI": ci,
                     "t (df)": f"{fmt(s['t'])} ({s['df']:.4g})" if not pd.isna(s["t"]) else "–",
                     "p": fmt_p(s["p"]), "p Holm": fmt_p(s["p_holm"]) + ("*" if is_set(s["significant"]) else ""),
                     "reading": s["reading"] or "–", "effect": _effect_text(s), "detectable (MDE)": _detectable_text(s),
                     "seeds for Δ": _seeds_text(s["seeds_needed"]),
                     "rank test p (Holm)": f"{fmt_p(s['robust_p'])} ({fmt_p(s['robust_p_holm'])})"
                     if s["robust_test"] else "–", "note": s["note"] or ""})
    return pd.DataFrame(rows)
