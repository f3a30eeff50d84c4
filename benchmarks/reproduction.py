"""Regenerate the reproduction report (docs/reproduction.md) through the platform's own commands, resumably.

    python -m benchmarks.reproduction [--ml100k PATH] [--lastfm PATH/LastFM.txt] [--beauty PATH/Beauty.txt]
        [--datasets ml-100k lastfm beauty] [--studies sasrec bert4rec ...] [--num-cpus N]
        [--set KEY=VALUE ...] [--out docs/reproduction.md] [--report-only] [--quick]

Every study file of ``search_spaces/reproduction/`` is one zoo model at its paper's configuration, five seeds
(a grid over ``seed``). For each dataset and study this runs

1. ``python -m study.sweep search_spaces/reproduction/<study>.yaml --set name=repro-<dataset>-<study> …``:
   skipped when the folder already holds every seed, ``--resume`` when it holds an unfinished run;
2. ``python -m study.report`` over the dataset's studies (t-tests against SASRec with Holm's correction, effect
   sizes, the accuracy–memory–latency Pareto plot) into ``docs/reproduction/<dataset>/``;
3. the part of docs/reproduction.md between its ``generated`` markers: the paper-style table (mean ± sd over the
   seeds; HR@10, NDCG@10, MRR@10), one line per paper claim (**holds** / **does not hold**, our numbers, the
   difference, the paired test), the ablations, the runs that stopped at the epoch limit, and the wall time. What
   is outside the markers (the reasons, written by a person who read the numbers) is kept as it is.

Beauty runs SASRec, BERT4Rec (and reports BERT4Rec with the Section 3.6 samples, ``bert4rec-last-item-samples``) and
the two efficient models with the best mean NDCG@10 ratio to SASRec on ml-100k and LastFM (those two wait until
every efficient model ran on both). On LastFM and Beauty, ``sasrec-s3rec-bce`` and ``sasrec-s3rec-ce`` rerun SASRec
under the protocol of S3Rec's all-item ranking table (history masked, batch 256, early stopping on validation
NDCG@20; S3Rec's BCE with one negative, then the zoo's causal CE) and are set against that table's published SASRec
row, not against the other studies; on LastFM ``sasrec-s3rec-bce-patience50``, the BCE study with patience 50,
measures what S3Rec's stopping rule costs there and gets no verdict. An interrupted run continues where it stopped:
a finished study is never rerun, and an unfinished one resumes from Tune's state. While a study runs, a line every
``--progress-every`` seconds gives its finished seeds and each running trial's epoch and best epoch so far. Studies
run in the order ``--studies`` names them (put the cheap ones before ELASTIC, whose epoch is ~250 times SASRec's)
and are reported in the report's own order. Every study's compact records (``trials.parquet``, ``history.parquet``,
``study.yaml``, ``environment.json``: what the report reads, not the weights, Tune's state or the per-trial files)
are kept in the repository under ``docs/reproduction/runs/<study>/``. ``results/`` is not tracked, so on a fresh
clone they are copied back into it first: the report then regenerates from the clone alone, and a study they hold in
full is not rerun. A study they hold in part (its run was lost before every seed finished) is reported with the
seeds it has and is not resumed, since Tune's state did not travel with it: move its folder aside to rerun it whole.
The dataset table of each report comes from the prepared copy in the local data cache, which is made from
``--ml100k``/``--lastfm``/``--beauty`` when they are given (``--report-only`` too): give them to regenerate the page
exactly.

``--set`` passes a study-file override to every sweep after the run's own (``--set resources.gpu=0.2`` lets the five
seeds of a study share one GPU). It changes where and how fast a study runs, never its protocol: keys under
``protocol``, ``fixed``, ``search``, ``budget`` and ``dataset`` are refused, since the report compares studies that
must share them. ``--quick`` is a smoke run of the whole pipeline (two seeds, two epochs, five prefixes per user) under
``repro-quick-*`` names, written to results/, never to docs/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from benchmarks.reproduction_claims import ABLATIONS, EFFICIENT, MAIN_STUDIES, PUBLISHED, PUBLISHED_STUDIES
from benchmarks.reproduction_report import published_section, report, write_report
from study.analysis.runs import ENVIRONMENT_FILE, HISTORY_FILE, STUDY_FILE, TRIALS_FILE
from study.cli import EXIT_INTERRUPTED
from study.data import prepare
from study.errors import UserError
from study.search.records import PARTIAL_HISTORY_SUFFIX
from study.spec.yaml_io import read_yaml

REPO = Path(__file__).resolve().parents[1]
STUDY_DIR = REPO / "search_spaces" / "reproduction"
# the finished studies' compact records, tracked by git, so that a fresh clone regenerates the report
ARCHIVE = REPO / "docs" / "reproduction" / "runs"
ARCHIVED_FILES = (TRIALS_FILE, HISTORY_FILE, STUDY_FILE, ENVIRONMENT_FILE)
RESULTS = REPO / "results"  # where study.sweep puts results/<name>/ (it runs from the repository root)
SEEDS = 5
QUICK_SEEDS = 2
DATASETS = {"ml-100k": "ml-100k", "lastfm": "lastfm", "beauty": "beauty"}  # dataset key -> data recipe

# study-file sections a --set may change: where and how a study runs, not what it measures
RUN_SECTIONS = ("resources", "checkpoint", "storage")


def study_name(dataset: str, study: str, quick: bool) -> str:
    return f"repro-{'quick-' if quick else ''}{dataset.replace('-', '')}-{study}"


def finished_seeds(folder: Path) -> int:
    """Seeds whose trial finished successfully in a study folder (0 when it has no trial table yet)."""
    table = folder / TRIALS_FILE
    if not table.is_file():
        return 0
    trials = pd.read_parquet(table, columns=["status", "seed"])
    return int(trials.loc[trials["status"] == "ok", "seed"].nunique())


def check_run_overrides(overrides: list[str]) -> list[str]:
    """The ``--set`` overrides that a reproduction may take: only keys under :data:`RUN_SECTIONS`."""
    refused = [o for o in overrides if o.partition("=")[0].strip().split(".")[0] not in RUN_SECTIONS]
    if refused:
        raise ValueError(f"--set {', '.join(refused)}: a reproduction's --set may change only "
                         f"{', '.join(RUN_SECTIONS)}; the protocol of every study is the study file's")
    return overrides


def archive_study(folder: Path, archive: Path) -> None:
    """Copy a study's compact records (:data:`ARCHIVED_FILES`) to ``archive/<study>/``, replacing what was there."""
    target = archive / folder.name
    target.mkdir(parents=True, exist_ok=True)
    for name in ARCHIVED_FILES:
        source, kept = folder / name, target / name
        if source.is_file() and not _same_file(source, kept):
            shutil.copy2(source, kept)


def _same_file(source: Path, kept: Path) -> bool:
    """Whether ``kept`` is already ``source``'s copy: ``copy2`` keeps the modification time, so size and time say it
    without reading either file (a report run would otherwise rewrite every archived study each time)."""
    if not kept.is_file():
        return False
    a, b = source.stat(), kept.stat()
    return a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns


def restore_archive(archive: Path, results: Path) -> list[str]:
    """Copy every archived study that ``results`` lacks into it; the names restored."""
    restored = []
    for source in sorted(p for p in archive.glob("repro-*") if (p / TRIALS_FILE).is_file()):
        if not (results / source.name).exists():
            shutil.copytree(source, results / source.name)
            restored.append(source.name)
    return restored


def prepare_for_report(dataset: str, source: str | None) -> None:
    """Put ``dataset``'s prepared copy in this machine's data cache, as its studies prepared it, when its source file
    is given: study.report reads the dataset's statistics (users, items, lengths) from there, so without it a report
    regenerated on a fresh machine would lose them. Already there, it is reused and nothing is read."""
    if not source:
        return
    max_len = read_yaml(STUDY_DIR / "sasrec.yaml")[0]["fixed"]["max_len"]  # every study's window
    try:
        prepare(DATASETS[dataset], source=source, max_len=max_len, progress=False)
    except (UserError, OSError, ValueError) as error:
        print(f"{dataset}: the report's dataset statistics are left out ({error})", file=sys.stderr)


def sweep_overrides(dataset: str, study: str, source: str | None, quick: bool,
                    run: tuple[str, ...] = ()) -> list[str]:
    overrides = [f"name={study_name(dataset, study, quick)}", f"dataset.name={DATASETS[dataset]}", *run]
    if source:
        overrides.append(f"dataset.source={source}")
    if quick:
        seeds = list(range(1, QUICK_SEEDS + 1))
        overrides += ["budget.max_epochs=2", f"budget.num_samples={QUICK_SEEDS}", f"search.seed={{grid: {seeds}}}"]
        if "prefixes_per_user" in (STUDY_DIR / f"{study}.yaml").read_text():
            overrides.append("fixed.prefixes_per_user=5")
    return overrides


def progress_line(folder: Path, seeds: int) -> str:
    """Where a running study stands: its finished seeds, and each running trial's epoch and best epoch so far with
    that epoch's validation NDCG@10 (read from the per-epoch files the recorder appends while a trial runs)."""
    running = []
    for history in sorted((folder / "trials").glob(f"*{PARTIAL_HISTORY_SUFFIX}")):
        lines = history.read_text().splitlines()
        if not lines:
            continue
        last = json.loads(lines[-1])
        best = last.get("best_valid_ndcg@10")
        score = f", validation NDCG@10 {best:.4f}" if best is not None else ""
        running.append(f"{history.name.removesuffix(PARTIAL_HISTORY_SUFFIX)} at epoch {last['epoch']} "
                       f"(best epoch {last['best_epoch']}{score})")
    now = time.strftime("%H:%M")
    return (f"{now} {folder.name}: {finished_seeds(folder)}/{seeds} seeds finished"
            + (f"; running: {'; '.join(running)}" if running else ""))


def run_study(dataset: str, study: str, args: argparse.Namespace) -> Path | None:
    """Run (or resume, or skip) one study; its results folder, or None when it failed."""
    folder = RESULTS / study_name(dataset, study, args.quick)
    seeds = QUICK_SEEDS if args.quick else SEEDS
    if finished_seeds(folder) >= seeds:
        print(f"{folder.name}: done ({seeds} seeds)", flush=True)
        return folder
    if (folder / TRIALS_FILE).is_file() and not (folder / "tune").is_dir():
        print(f"{folder.name}: holds {finished_seeds(folder)} of {seeds} seeds but no Tune state to resume them "
              f"(restored from {ARCHIVE.relative_to(REPO)}?); reported as it is. Move the folder aside to rerun it "
              "whole", file=sys.stderr)
        return folder
    command = [sys.executable, "-m", "study.sweep", str(STUDY_DIR / f"{study}.yaml"), "--quiet"]
    for override in sweep_overrides(dataset, study, args.sources.get(dataset), args.quick, tuple(args.overrides)):
        command += ["--set", override]
    if args.num_cpus:
        command += ["--num-cpus", str(args.num_cpus)]
    if (folder / TRIALS_FILE).is_file() or (folder / "tune").is_dir():
        command.append("--resume")
    print(f"{folder.name}: running ({' '.join(command[2:4])} …)", flush=True)
    sweep = subprocess.Popen(command, cwd=REPO)
    try:
        while True:  # a study runs for hours: say where it stands every few minutes
            try:
                sweep.wait(timeout=args.progress_every)
                break
            except subprocess.TimeoutExpired:
                print(progress_line(folder, seeds), flush=True)
    except KeyboardInterrupt:
        stop_sweep(sweep)
        raise
    if sweep.returncode != 0:
        print(f"{folder.name}: the sweep failed; rerun to resume it", file=sys.stderr)
        return None
    return folder


def stop_sweep(sweep: subprocess.Popen, grace_s: float = 60.0) -> None:
    """After Ctrl-C: wait for the sweep to save Tune's state and stop. Ctrl-C in a terminal reaches it too (one
    process group); a SIGINT sent to this process alone is passed on once the grace period has passed (not at once:
    a second SIGINT would make Tune skip its last save)."""
    try:
        sweep.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        sweep.send_signal(signal.SIGINT)
        sweep.wait()


def best_efficient(args: argparse.Namespace) -> list[str]:
    """The two efficient models with the best mean NDCG@10 ratio to SASRec over ml-100k and LastFM."""
    ratios: dict[str, list[float]] = {}
    for dataset in ("ml-100k", "lastfm"):
        means = {}
        for study in ("sasrec", *EFFICIENT):
            folder = RESULTS / study_name(dataset, study, args.quick)
            if finished_seeds(folder) >= (QUICK_SEEDS if args.quick else SEEDS):
                trials = pd.read_parquet(folder / TRIALS_FILE)
                means[study] = trials.loc[trials["status"] == "ok", "test_ndcg@10"].mean()
        for study in EFFICIENT:
            if study in means and means.get("sasrec"):
                ratios.setdefault(study, []).append(means[study] / means["sasrec"])
    complete = {s: statistics.mean(r) for s, r in ratios.items() if len(r) == 2}
    return sorted(complete, key=complete.get, reverse=True)[:2] if len(complete) == len(EFFICIENT) else []


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ml100k", help="local ml-100k file/zip (default: download from GroupLens)")
    parser.add_argument("--lastfm", help="the S3Rec LastFM.txt (no LastFM study runs without it)")
    parser.add_argument("--beauty", help="the S3Rec Beauty.txt (no Beauty study runs without it)")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS),
                        help="the datasets to run studies on (the report covers every dataset with results)")
    parser.add_argument("--studies", nargs="+", default=[*MAIN_STUDIES, *ABLATIONS, *PUBLISHED_STUDIES],
                        choices=[*MAIN_STUDIES, *ABLATIONS, *PUBLISHED_STUDIES])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"a study-file override for every sweep, under {', '.join(RUN_SECTIONS)} only "
                             "(e.g. resources.gpu=0.2: five seeds share one GPU)")
    parser.add_argument("--num-cpus", type=int, help="CPUs of the embedded Ray (default: the machine's)")
    parser.add_argument("--out", default=None, help="the report (default docs/reproduction.md; "
                                                    "results/repro-quick.md with --quick)")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the report from what exists")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, 2 epochs, separate names")
    parser.add_argument("--progress-every", type=float, default=600, metavar="SECONDS",
                        help="how often a running study prints its progress line (default 600)")
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # `kill PID` and job schedulers send SIGTERM, and a run started in the background of a script ignores SIGINT:
    # SIGTERM stops like Ctrl-C, after the sweep below has saved Tune's state (stop_sweep passes it a SIGINT)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(build_parser().parse_args(argv))
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to continue: finished studies are kept and an unfinished one "
              "resumes from Tune's state (--report-only reports what has finished)", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    """Run the studies that ``args`` asks for, then write the report; returns the exit code."""
    args.out = str(REPO / (args.out or ("results/repro-quick.md" if args.quick else "docs/reproduction.md")))
    missing = [s for s in args.studies if not (STUDY_DIR / f"{s}.yaml").is_file()]
    if missing:
        print(f"error: no study file for {', '.join(missing)} in {STUDY_DIR}", file=sys.stderr)
        return 2
    try:
        check_run_overrides(args.overrides)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.sources = {"ml-100k": args.ml100k, "lastfm": args.lastfm, "beauty": args.beauty}
    if not args.quick:
        restored = restore_archive(ARCHIVE, RESULTS)
        if restored:
            print(f"restored {len(restored)} studies from {ARCHIVE.relative_to(REPO)} into results/", flush=True)
    sections = []
    # --datasets and --studies say what runs; the report covers every dataset and study that has results
    for dataset in DATASETS:
        runs = dataset in args.datasets and not args.report_only
        if runs and dataset != "ml-100k" and not args.sources[dataset]:
            print(f"{dataset}: not run, give --{dataset} PATH", file=sys.stderr)
            runs = False
        reported = [*MAIN_STUDIES, *ABLATIONS]
        if dataset == "beauty":
            chosen = best_efficient(args)
            if runs and not chosen:
                print("beauty: the two efficient models wait until every efficient model ran on ml-100k and lastfm",
                      file=sys.stderr)
            # bert4rec-last-item-samples: Beauty's BERT4Rec runs from before the bert4rec study dropped those samples
            reported = ["sasrec", "bert4rec", "bert4rec-last-item-samples", *chosen]
        reported += [s for s in PUBLISHED_STUDIES if any(r.study == s and r.dataset == dataset for r in PUBLISHED)]
        folders = {}
        # studies run in the order --studies gives (cheap ones first, say), then are reported in the report's order
        for study in (s for s in args.studies if runs and s in reported):
            run_study(dataset, study, args)
        for study in reported:
            folder = RESULTS / study_name(dataset, study, args.quick)
            if finished_seeds(folder):
                folders[study] = folder
                if not args.quick:
                    archive_study(folder, ARCHIVE)
        compared = {k: v for k, v in folders.items() if k not in PUBLISHED_STUDIES}
        published = {k: v for k, v in folders.items() if k in PUBLISHED_STUDIES}
        if folders:
            prepare_for_report(dataset, args.sources.get(dataset))
        lines = report(dataset, compared, args) if "sasrec" in compared and len(compared) > 1 else []
        lines += published_section(dataset, published, args) if published else []
        sections += [f"## {dataset}", "", *lines] if lines else []
    if not sections:  # nothing to report (a machine without results or records): keep what the page says
        print(f"no study has results to report; {args.out} is left as it is", file=sys.stderr)
        return 0
    write_report(sections, Path(args.out))
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
