"""Hyperparameter and scalability sweeps from a YAML study file, on Ray Tune with Optuna.

    python -m study.sweep search_spaces/sasrec.yaml [--set budget.num_samples=2 ...] [--dry-run] [--resume]

Flow: the YAML is read and validated completely before Ray starts (:mod:`study.spec.study_file`; every problem is
reported at once, exit code 2); ``--dry-run`` stops there and prints the resolved study. Otherwise the dataset
is prepared, Ray starts, and :func:`study.search.runner.run_study` runs the trials and writes ``results/<study>/``
(:mod:`study.search.recorder`); a short summary ends the run.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from study.cli import print_dry_run, run_command
from study.cluster import add_address_argument
from study.errors import UserError

# torch (through models and the spec) and Ray are imported inside main, after the first line is out


class _HelpWithSchema(argparse._HelpAction):
    """--help with the study file's schema as epilog, imported only when help is asked for (it imports torch)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from study.spec.study_file import SCHEMA_HELP

        parser.epilog = SCHEMA_HELP
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m study.sweep",
        description="Run a hyperparameter study described by a YAML file: Optuna (TPE, multi-objective, grid) on "
                    "Ray Tune, ASHA on a validation metric, one record per trial in results/<study>/.",
        formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    parser.add_argument("-h", "--help", action=_HelpWithSchema, help="show this help message and the study file's "
                                                                     "schema, and exit")
    parser.add_argument("study", help="the study YAML (see search_spaces/ and docs/sweep.md)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="override a field by its dotted path, e.g. --set budget.num_samples=2 "
                             "--set fixed.max_epochs=3 --set dataset.source=../data/ml-100k.zip")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the study (every search combination against the model's constraints), "
                             "print it resolved, and exit without starting Ray")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted study in its storage folder: finished trials are kept, "
                             "unfinished ones rerun")
    parser.add_argument("--dashboard", action="store_true",
                        help="start Ray's dashboard on http://127.0.0.1:8265 (or use the cluster's) and "
                             "optuna-dashboard on the study's optuna.db (127.0.0.1, a free port) while the "
                             "sweep runs, and print both URLs (docs/sweep.md, \"Dashboards\")")
    add_address_argument(parser)
    parser.add_argument("--num-cpus", type=int, default=None,
                        help="CPUs the local Ray may use (default: all of this machine's)")
    parser.add_argument("--quiet", action="store_true", help="no Tune progress tables, no worker output")
    parser.add_argument("--no-resume-line", action="store_true",
                        help="after Ctrl-C, print no --resume line: for a sweep started by another command (a "
                             "campaign) that says itself how to continue")
    return parser


def resume_command(args: argparse.Namespace) -> str:
    """The command that continues an interrupted sweep: the study's name and storage may come from ``--set``, and
    its Tune state from ``--address``, so the ``--resume`` line must repeat them to find the run it continues."""
    words = ["python", "-m", "study.sweep", args.study, *(w for o in args.overrides for w in ("--set", o))]
    if args.address != "local":
        words += ["--address", args.address]
    if args.num_cpus is not None:
        words += ["--num-cpus", str(args.num_cpus)]
    return shlex.join([*words, "--resume"])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        from study.spec.study_file import load_study

        if args.resume and args.dry_run:
            raise UserError("--resume and --dry-run exclude each other")
        # a joined cluster may have more CPUs/GPUs than this machine: only check the machine for an embedded Ray
        study = load_study(args.study, args.overrides, check_machine=args.address == "local")
        if study.adaptation:  # a shortened budget runs: say once what it changed (study.yaml records it too)
            # (a dry run's stdout is the study file alone: the note goes beside its verdict)
            print(f"adapted to the budget: {study.adaptation}", file=sys.stderr if args.dry_run else sys.stdout)
        if args.dry_run:
            checked = "every" if study.exhaustive_check else "one key at a time over"
            return print_dry_run(study, f"checked {checked} {study.checked_points} search combination(s) against "
                                        f"{study.model}'s constraints")
        from study.search.runner import run_study  # imports Ray: only once the study is known to be valid

        outcome = run_study(study, resume=args.resume, dashboard=args.dashboard, address=args.address,
                            num_cpus=args.num_cpus, quiet=args.quiet)
        print(outcome["summary"])
        return 0

    return run_command(body, address=args.address, first_line=None if args.dry_run else
                       f"study.sweep: validating {args.study}, then preparing its dataset and starting Ray",
                       interrupted=None if args.no_resume_line else f"continue with: {resume_command(args)}")


if __name__ == "__main__":
    sys.exit(main())
