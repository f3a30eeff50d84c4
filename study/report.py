"""``python -m study.report RESULTS_DIR [RESULTS_DIR ...]``: the report of one or several studies.

The analysis and the document are :mod:`study.analysis.document`; this module is its command line.
"""

from __future__ import annotations

import argparse
import sys

from study.analysis import pareto
from study.analysis.document import DEFAULT_REFERENCE_MODEL, ReportOptions, build_report
from study.analysis.tables import TABLE_METRICS
from study.errors import UserError, print_error


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
    parser.add_argument("--objectives", default=pareto.format_objectives(pareto.DEFAULT_OBJECTIVES),
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
    parser.add_argument("--margin", type=float, default=pareto.REFERENCE_MARGIN,
                        help="fraction of the observed range added beyond the worst value (default %(default)s)")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level after Holm (default 0.05)")
    parser.add_argument("--allow-mixed-protocols", action="store_true",
                        help="report studies evaluated under different data or ranking protocols side by side")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Write the report of the given studies; 0, or 2 with one line on stderr for bad input."""
    args = build_parser().parse_args(argv)
    try:
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
        options = ReportOptions(objectives=pareto.parse_objectives(args.objectives), reference_model=args.reference,
                                proposed=args.proposed, select_metric=args.select_metric, metrics=metrics,
                                hv_reference=parse_hv_reference(args.hv_reference), margin=args.margin,
                                alpha=args.alpha, allow_mixed_protocols=args.allow_mixed_protocols,
                                plots=not args.no_plots)
        outcome = build_report(args.studies, args.out, options)
    except UserError as error:
        return print_error(error)
    out = outcome["out"]
    print(f"report: {out / 'report.md'}\n        {out / 'report.html'}")
    print(f"tables and plots: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
