"""``python -m study.report RESULTS_DIR [RESULTS_DIR ...]``: the report of one or several studies.

The analysis and the document are :mod:`study.analysis.document`; this module is its command line. It checks its
arguments and folders before it imports the analysis: pandas, torch and matplotlib take seconds to load (tens on a
busy machine), and a mistyped folder is refused at once instead (:func:`study.analysis.runs.check_folder`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from study.analysis.console import table_width, text_table
from study.analysis.options import (
    DEFAULT_OBJECTIVES,
    DEFAULT_REFERENCE_MODEL,
    REFERENCE_MARGIN,
    TABLE_METRICS,
    ReportOptions,
    format_objectives,
    parse_objectives,
)
from study.analysis.progress import StudyRunning, describe
from study.analysis.runs import check_folder, short_labels
from study.errors import UserError, print_error
from study.search.console import WIDTH, fit
from study.storage import is_uri


def parse_hv_reference(text: str | None) -> dict[str, float] | None:
    """``--hv-reference M=V,…`` as {metric: value}; None when not given."""
    if not text:
        return None
    values = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.rpartition("=")
        try:
            values[name] = float(value)
        except ValueError:
            raise UserError(f"--hv-reference {part!r}: expected METRIC=NUMBER") from None
        if not sep or not name:
            raise UserError(f"--hv-reference {part!r}: expected METRIC=NUMBER")
    return values


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m study.report``."""
    parser = argparse.ArgumentParser(
        prog="python -m study.report",
        description="Pareto fronts, a paper-style results table and significance tests over one or several "
                    "studies (e.g. one per model); writes report.md, report.html, plots and CSV/Parquet tables.")
    parser.add_argument("studies", nargs="+", help="results folders written by python -m study.sweep, or the URIs "
                                                   "they were mirrored to (s3://…: fetched into results/ first)")
    parser.add_argument("--out", help="output folder (default: <study>/report, or report-<a>+<b> beside the studies)")
    parser.add_argument("--objectives", default=format_objectives(DEFAULT_OBJECTIVES),
                        help="Pareto objectives as METRIC:max|min,… (default %(default)s); validation metrics and "
                             "efficiency figures only")
    parser.add_argument("--select-metric", help="validation metric that chooses each model's configuration "
                                                "(default: the first valid_ objective)")
    parser.add_argument("--metrics", default=",".join(TABLE_METRICS),
                        help="metrics of the results table and the tests (default %(default)s)")
    parser.add_argument("--reference", help=f"reference model of the significance tests (default: "
                                            f"{DEFAULT_REFERENCE_MODEL} when present)")
    parser.add_argument("--proposed", help="the model whose relative improvement over the best other model the "
                                           "results table reports (default: best vs runner-up)")
    parser.add_argument("--hv-reference", help="hypervolume reference point as METRIC=VALUE,… (default: the worst "
                                               "observed value of each objective, moved out by --margin of its range)")
    parser.add_argument("--margin", type=float, default=REFERENCE_MARGIN,
                        help="fraction of the observed range added beyond the worst value (default %(default)s)")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level after Holm (default 0.05)")
    parser.add_argument("--allow-mixed-protocols", action="store_true",
                        help="report studies evaluated under different data or ranking protocols side by side")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    return parser


def options_from(args: argparse.Namespace) -> ReportOptions:
    """The report's options from the parsed command line; a bad value is a UserError."""
    if not 0 < args.alpha < 1:
        raise UserError(f"--alpha must lie in (0, 1), got {args.alpha}")
    if args.margin < 0:
        raise UserError(f"--margin must be >= 0, got {args.margin}")
    metrics = tuple(m.strip() for m in args.metrics.split(",") if m.strip())
    if not metrics:
        raise UserError("--metrics is empty")
    other = [m for m in metrics if not m.startswith(("test_", "valid_"))]
    if other:
        raise UserError(f"--metrics {other[0]}: the results table holds accuracy metrics (test_… or valid_…); "
                        "efficiency figures are in the chosen-configurations and Pareto tables")
    return ReportOptions(objectives=parse_objectives(args.objectives), reference_model=args.reference,
                         proposed=args.proposed, select_metric=args.select_metric, metrics=metrics,
                         hv_reference=parse_hv_reference(args.hv_reference), margin=args.margin,
                         alpha=args.alpha, allow_mixed_protocols=args.allow_mixed_protocols,
                         plots=not args.no_plots)


def results_rows(outcome: dict[str, Any]) -> tuple[list[dict[str, str]], str]:
    """The results table as console rows, and its caption. Cells are the report's, without bold marks; a table
    wider than 120 columns first names its models by their short labels and writes mean±std without spaces
    (:func:`~study.analysis.console.text_table` then cuts names, then leaves columns off)."""
    rows = [{c: str(v).replace("**", "") for c, v in row.items()}
            for row in outcome["tables"]["results_formatted"].to_dict("records")]
    caption = "results (mean ± std over n seeds; every column in results.csv)"
    for row in rows:
        if row["model"].startswith("Improv. ("):  # its comparison moves to the caption: the name column stays narrow
            caption = caption[:-1] + f"; Improv.: {row['model'][len('Improv. ('):-1]})"
            row["model"] = "Improv."
    if table_width(rows) > WIDTH:
        short = short_labels(s.label for s in outcome["studies"])
        rows = [{c: short.get(v, v) if c == "model" else v.replace(" ± ", "±") for c, v in row.items()}
                for row in rows]
    return rows, caption + ":"


def summary_lines(outcome: dict[str, Any]) -> list[str]:
    """What the console shows of a written report: the results table and the trials of studies still running,
    each within 120 columns; then where the files are."""
    out = outcome["out"]
    rows, caption = results_rows(outcome)
    lines = [fit(caption), *text_table(rows, shrink="model")]
    lines += [fit(f"still running: {s.name}: {len(s.unfinished)} trial(s) not finished ({describe(s.unfinished)}); "
                  "this report covers the finished ones") for s in outcome["studies"] if s.unfinished]
    return [*lines, f"report: {out / 'report.md'}", f"        {out / 'report.html'}", f"tables and plots: {out}"]


def main(argv: list[str] | None = None) -> int:
    """Write the report of the given studies; 0, or 2 with one line on stderr for bad input."""
    args = build_parser().parse_args(argv)
    try:
        options = options_from(args)
        for folder in args.studies:
            if not is_uri(folder):  # a URI is fetched first, by the analysis
                check_folder(folder)
        from study.analysis.document import build_report  # pandas, torch, matplotlib: only for a report to write

        outcome = build_report(args.studies, args.out, options)
    except UserError as error:
        if isinstance(error, StudyRunning):  # which trials run, and how far they got
            print("\n".join(error.table), file=sys.stderr)
        return print_error(error)
    print("\n".join(summary_lines(outcome)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
