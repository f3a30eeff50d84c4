"""Run a campaign file's studies resumably, then write its page.

    python -m study.campaign CAMPAIGN.yaml [--report-only] [--datasets KEY ...] [--studies NAME ...]
        [--rerun NAME ...] [--set KEY=VALUE ...] [--num-cpus N] [--data-root DIR] [--quick] [--progress-every SECONDS]

For each dataset of the campaign, in the file's order:

1. each of its studies that ``--datasets`` and ``--studies`` select runs with ``python -m study.sweep``, in the
   order ``--studies`` names them (put the cheap ones first): skipped when its folder holds every seed, resumed
   when it holds an unfinished run, run once more from scratch when ``--rerun`` names it
   (:mod:`study.campaign.runner`);
2. ``python -m study.report`` over the dataset's compared studies writes the full report (tests, effect sizes,
   Pareto plots) into the campaign's ``reports/<dataset>/``;
3. the page's part between its ``generated`` markers is rewritten (:mod:`study.campaign.page`).

The page covers every dataset and study with results, whatever ran, and says on stderr which of them ran with settings
their study file no longer has. On a fresh clone the campaign's recorded studies are first copied back into
``results/``, so ``--report-only`` regenerates the page from the repository. Dataset sources are relative to
``--data-root`` (or ``$SEQREC_DATA_ROOT``); each dataset's table of users, items and lengths comes from its prepared
copy in the local data cache, which is made from the source when one is found, so give the data root to regenerate
the page exactly. ``--quick`` is a smoke run (two seeds, two epochs) under ``<prefix>-quick-*`` names whose page goes
to ``results/``, never to the campaign's folder.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from study.campaign.page import published_section, report, write_page
from study.campaign.runner import (
    archive_study,
    check_run_overrides,
    choose,
    finished_seeds,
    restore_records,
    results_dir,
    run_study,
    warn_if_changed,
)
from study.campaign.spec import Campaign, data_root, load_campaign
from study.cli import EXIT_INTERRUPTED
from study.errors import UserError, print_error

INTERRUPTED = ("interrupted; rerun the same command to continue: finished studies are kept and an unfinished one "
               "resumes from Tune's state (--report-only reports what has finished)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m study.campaign", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaign", type=Path, help="the campaign file (YAML; see docs/campaigns.md)")
    parser.add_argument("--datasets", nargs="+", help="the datasets to run studies on (default: every one)")
    parser.add_argument("--studies", nargs="+", help="the studies to run, in this order (default: every one)")
    parser.add_argument("--rerun", nargs="+", default=[], metavar="STUDY",
                        help="run these studies once more from scratch, their earlier folders kept as "
                             "results/<name>.replaced-<time>/ (default --studies: these)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a study-file override for every sweep, under resources, checkpoint or storage only "
                             "(e.g. resources.gpu=0.2: five seeds share one GPU)")
    parser.add_argument("--num-cpus", type=int, help="CPUs of each sweep's embedded Ray (default: the machine's)")
    parser.add_argument("--data-root", help="the folder dataset sources are relative to (default $SEQREC_DATA_ROOT)")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the page from what exists")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, 2 epochs, separate names")
    parser.add_argument("--progress-every", type=float, default=600, metavar="SECONDS",
                        help="how often a running study prints its progress line (default 600)")
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Bad input is one ``error:`` line and exit 2; Ctrl-C or SIGTERM, one line saying how to continue and 130."""
    # `kill PID` and job schedulers send SIGTERM, and a run started in the background of a script ignores SIGINT:
    # SIGTERM stops like Ctrl-C, after the running sweep has saved Tune's state (stop_sweep passes it a SIGINT)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(build_parser().parse_args(argv))
    except UserError as error:
        return print_error(error)
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)


def resolve_options(campaign: Campaign, options: argparse.Namespace) -> None:
    """Check the selections and overrides against the campaign, and resolve each dataset's source path."""
    for flag, chosen, known in (("--datasets", options.datasets, campaign.datasets),
                                ("--studies", options.studies, campaign.all_studies()),
                                ("--rerun", options.rerun, campaign.all_studies())):
        unknown = [name for name in chosen or () if name not in known]
        if unknown:
            raise UserError(f"{flag} {', '.join(unknown)}: not in {campaign.source} (it has {', '.join(known)})")
    unselected = [name for name in options.rerun if options.studies and name not in options.studies]
    if unselected:
        raise UserError(f"--rerun {', '.join(unselected)}: not among --studies {' '.join(options.studies)}")
    if options.rerun and (options.report_only or options.quick):
        raise UserError("--rerun runs studies: it goes without --report-only and --quick")
    options.datasets = options.datasets or list(campaign.datasets)
    options.studies = options.studies or options.rerun or list(campaign.all_studies())
    check_run_overrides(options.overrides)
    root = data_root(options.data_root)
    options.sources = {key: root / d.source if root and d.source else None for key, d in campaign.datasets.items()}


def prepare_for_report(campaign: Campaign, dataset: str, source: Path | None) -> None:
    """Put ``dataset``'s prepared copy in this machine's data cache, as its studies prepared it, when its source is
    given: study.report reads the dataset's statistics (users, items, lengths) from there, so without it a page
    regenerated on a fresh machine would lose them. Already there, it is reused and nothing is read."""
    if not source:
        return
    from study.data import prepare  # torch-free, but pulls in the data pipeline: only when a page is written

    max_len = campaign_window(campaign)
    try:
        prepare(campaign.datasets[dataset].recipe, source=str(source), max_len=max_len, progress=False)
    except (UserError, OSError, ValueError) as error:
        print(f"{dataset}: the report's dataset statistics are left out ({error})", file=sys.stderr)


def campaign_window(campaign: Campaign) -> int | None:
    """The window every study shares: the reference study's ``fixed.max_len``."""
    from study.spec.yaml_io import read_yaml

    return (read_yaml(campaign.study_file(campaign.reference))[0].get("fixed") or {}).get("max_len")


def dataset_studies(campaign: Campaign, dataset: str, options: argparse.Namespace, runs: bool) -> list[str]:
    """The studies reported on ``dataset``: its list, the studies its choice picks, then its published rows'."""
    spec = campaign.datasets[dataset]
    reported = list(spec.studies)
    if spec.choose:
        chosen = choose(campaign, spec.choose, options.quick)
        if runs and not chosen:
            print(f"{dataset}: the {spec.choose.count} chosen studies wait until every one of "
                  f"{', '.join(spec.choose.candidates)} ran on {', '.join(spec.choose.over)}", file=sys.stderr)
        reported += chosen
    return reported + [s for s in campaign.published_on(dataset) if s not in reported]


def run(options: argparse.Namespace) -> int:
    """Run the studies that ``options`` asks for, then write the page; returns the exit code."""
    campaign = load_campaign(options.campaign)
    resolve_options(campaign, options)
    page = results_dir() / f"{campaign.prefix}-quick.md" if options.quick else campaign.page
    reports = page.parent / page.stem if options.quick else campaign.reports
    epoch_limit = 2 if options.quick else campaign.epoch_limit
    if not options.quick:
        restored = restore_records(campaign.records, results_dir(), campaign.prefix)
        if restored:
            print(f"restored {len(restored)} studies from {campaign.records} into results/", flush=True)
    sections = []
    for dataset, spec in campaign.datasets.items():
        runs = dataset in options.datasets and not options.report_only
        if runs and not options.sources[dataset] and not spec.download:
            print(f"{dataset}: not run, give --data-root DIR (its source is {spec.source})", file=sys.stderr)
            runs = False
        reported = dataset_studies(campaign, dataset, options, runs)
        selected = [study for study in options.studies if runs and study in reported]
        for study in selected:
            run_study(campaign, dataset, study, options)
        folders = {}
        for study in reported:
            folder = results_dir() / campaign.study_name(dataset, study, options.quick)
            if finished_seeds(folder):
                folders[study] = folder
                if study not in selected:  # run_study checked the ones it was given
                    warn_if_changed(campaign, dataset, study, options)
                if not options.quick:
                    archive_study(folder, campaign.records)
        sections += dataset_page(campaign, dataset, folders, options, epoch_limit, page, reports)
    if not sections:  # nothing to report (a machine without results or records): keep what the page says
        print(f"nothing to report; {page} is left as it is", file=sys.stderr)
        return 0
    write_page(sections, page, campaign.name)
    print(f"page: {page}")
    return 0


def dataset_page(campaign: Campaign, dataset: str, folders: dict[str, Path], options: argparse.Namespace,
                 epoch_limit: int, page: Path, reports: Path) -> list[str]:
    """A dataset's part of the page: the compared studies' report, then the published rows'; none without results."""
    published = {k: v for k, v in folders.items() if k in campaign.published_studies}
    compared = {k: v for k, v in folders.items() if k not in published}
    if folders:
        prepare_for_report(campaign, dataset, options.sources.get(dataset))
    reportable = campaign.reference in compared and len(compared) > 1
    if compared and not reportable:  # finished studies that no report names would read as lost: say why
        why = (f"the reference study {campaign.reference!r} has no finished seed; run it with the others "
               f"(--studies {campaign.reference} …)" if campaign.reference not in compared
               else f"only the reference study {campaign.reference!r} has finished seeds")
        print(f"{dataset}: no comparison reported: {why}", file=sys.stderr)
    lines = report(campaign, dataset, compared, epoch_limit, page, reports) if reportable else []
    lines += published_section(campaign, dataset, published, epoch_limit) if published else []
    return [f"## {dataset}", "", *lines] if lines else []


if __name__ == "__main__":
    sys.exit(main())
