"""Running a campaign's studies through ``python -m study.sweep``, resumably, and keeping their compact records.

Choices:

- Each study runs as its own ``study.sweep`` subprocess, so a campaign is exactly what a user would type, study by
  study, and one study's failure or memory does not reach the next.
- A study whose folder holds every seed is skipped; one with Tune's state is resumed (``--resume``). A study restored
  from the records in part (its run was lost before every seed finished) is reported with the seeds it has and not
  resumed, since Tune's state did not travel with it: ``--rerun`` runs it whole.
- ``--rerun`` runs a study once more from scratch (a study file changed since it ran, say). Its earlier folder is
  kept as ``results/<name>.replaced-<UTC time>/``; while that folder exists the new run is the one the command
  continues, so after Ctrl-C the same command resumes it rather than starting a third, and the earlier run's records
  are not restored over it. Its records are replaced once the new run has finished seeds.
- The compact records (:data:`RECORD_FILES`: what the report reads, not the weights, Tune's state or the per-trial
  files) are copied into the campaign's ``records`` folder, which is tracked, and copied back into ``results/`` on a
  fresh clone, so that ``--report-only`` regenerates the page from the repository alone.
- A study another sweep is still running (its folder's lock has a live holder: a second campaign, say) is reported
  as far as it got but not recorded, so the tracked records never hold half a run.
- A sweep stopped by a signal that this process did not get (a campaign in the background ignores SIGINT) stops
  the campaign as Ctrl-C does: it is not reported as failed, and the page is not rewritten.
- ``--set`` may change where and how fast a study runs (:data:`RUN_SECTIONS`), never what it measures: the report
  compares studies that must share their protocol.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from study.analysis.runs import ENVIRONMENT_FILE, HISTORY_FILE, STUDY_FILE, TRIALS_FILE
from study.campaign.spec import Campaign, Choice
from study.cli import EXIT_INTERRUPTED
from study.errors import UserError
from study.search.lock import in_use_by
from study.search.records import PARTIAL_HISTORY_SUFFIX

RECORD_FILES = (TRIALS_FILE, HISTORY_FILE, STUDY_FILE, ENVIRONMENT_FILE)
RUN_SECTIONS = ("resources", "checkpoint", "storage")  # what a campaign's --set may change
QUICK_SEEDS = 2
REPLACED_SUFFIX = ".replaced-"  # results/<name>.replaced-<UTC time>/: a run --rerun set aside
# a sweep's exit after Ctrl-C (its own exit code), or its death by SIGINT or SIGTERM before it could say so
SWEEP_INTERRUPTED = (EXIT_INTERRUPTED, -signal.SIGINT, -signal.SIGTERM)


def results_dir() -> Path:
    """Where ``study.sweep`` puts ``results/<name>/``: it runs in this process's working folder."""
    return Path.cwd() / "results"


def finished_seeds(folder: Path) -> int:
    """Seeds whose trial finished successfully in a study folder (0 when it has no trial table yet)."""
    table = folder / TRIALS_FILE
    if not table.is_file():
        return 0
    trials = pd.read_parquet(table, columns=["status", "seed"])
    return int(trials.loc[trials["status"] == "ok", "seed"].nunique())


def check_run_overrides(overrides: list[str]) -> list[str]:
    """The ``--set`` overrides a campaign may take: only keys under :data:`RUN_SECTIONS`."""
    refused = [o for o in overrides if o.partition("=")[0].strip().split(".")[0] not in RUN_SECTIONS]
    if refused:
        raise UserError(f"--set {', '.join(refused)}: a campaign's --set may change only "
                        f"{', '.join(RUN_SECTIONS)}; the protocol of every study is its study file's")
    return overrides


def archive_study(folder: Path, records: Path) -> None:
    """Copy a study's compact records to ``records/<study>/``, replacing what was there, unless a sweep is still
    writing the folder: another campaign or sweep running it would leave the tracked records half a study."""
    holder = in_use_by(folder)
    if holder:
        print(f"{folder.name}: its records are left as they were, since a sweep is still running it ({holder}); "
              "the campaign that runs it records it when it ends", file=sys.stderr)
        return
    target = records / folder.name
    target.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        source, kept = folder / name, target / name
        if source.is_file() and not _same_file(source, kept):
            shutil.copy2(source, kept)


def _same_file(source: Path, kept: Path) -> bool:
    """Whether ``kept`` is already ``source``'s copy: ``copy2`` keeps the modification time, so size and time say it
    without reading either file (a report run would otherwise rewrite every record each time)."""
    if not kept.is_file():
        return False
    a, b = source.stat(), kept.stat()
    return a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns


def restore_records(records: Path, results: Path, prefix: str) -> list[str]:
    """Copy every recorded study of the campaign that ``results`` lacks into it, but for one being rerun (its earlier
    run set aside); the names restored."""
    restored = []
    for source in sorted(p for p in records.glob(f"{prefix}-*") if (p / TRIALS_FILE).is_file()):
        if not (results / source.name).exists() and not replaced_runs(results / source.name):
            shutil.copytree(source, results / source.name)
            restored.append(source.name)
    return restored


def replaced_runs(folder: Path) -> list[Path]:
    """The earlier runs of a study that ``--rerun`` set aside, oldest first."""
    return sorted(folder.parent.glob(f"{folder.name}{REPLACED_SUFFIX}*"))


def set_aside(folder: Path) -> None:
    """For ``--rerun``: move ``folder`` to ``<name>.replaced-<UTC time>`` so that the study runs from scratch,
    unless an earlier ``--rerun`` already did (this folder is then the new run, to continue)."""
    if not folder.exists():
        return
    earlier = replaced_runs(folder)
    if earlier:
        print(f"{folder.name}: already rerun (the run before is in {earlier[-1].name}); continuing the new run. "
              "Delete that folder to rerun the study again", flush=True)
        return
    holder = in_use_by(folder)
    if holder:
        raise UserError(f"--rerun {folder.name}: a sweep is still running it ({holder}); stop it first")
    target = folder.with_name(f"{folder.name}{REPLACED_SUFFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    folder.rename(target)
    print(f"{folder.name}: running again from scratch (--rerun); the earlier run is kept in {target}", flush=True)


def sweep_overrides(campaign: Campaign, dataset: str, study: str, source: Path | None, quick: bool,
                    run: tuple[str, ...] = ()) -> list[str]:
    """The ``--set`` arguments of one study's sweep: its name and data, then the run's own overrides."""
    overrides = [f"name={campaign.study_name(dataset, study, quick)}",
                 f"dataset.name={campaign.datasets[dataset].recipe}", *run]
    if source:
        overrides.append(f"dataset.source={source}")
    if quick:  # a smoke run of the whole pipeline: two seeds, two epochs, five prefixes per user
        seeds = list(range(1, QUICK_SEEDS + 1))
        overrides += ["budget.max_epochs=2", f"budget.num_samples={QUICK_SEEDS}", f"search.seed={{grid: {seeds}}}"]
        if "prefixes_per_user" in campaign.study_file(study).read_text():
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


def changed_settings(folder: Path, study_file: Path, overrides: list[str]) -> list[str]:
    """The fixed and protocol settings of ``study_file`` (with the sweep's ``overrides``) that the finished runs in
    ``folder`` ran with another value, as ``key VALUE (ran OTHER)``. Rows are read as today's keys mean them
    (:func:`study.analysis.runs.upgrade_rows`), so a setting added after they ran counts with what they ran; a file
    that no longer resolves is left to the sweep to report."""
    from study.analysis.runs import parse_config, upgrade_rows
    from study.spec.study_file import load_study
    from study.spec.yaml_io import StudyConfigError

    rows = pd.read_parquet(folder / TRIALS_FILE)
    if "config" not in rows:
        return []
    try:
        wanted = load_study(study_file, overrides, check_machine=False).to_dict()
    except StudyConfigError:
        return []
    settings = {**(wanted.get("fixed") or {}), **(wanted.get("protocol") or {})}
    changed = set()  # "auto" (the objective, the device) is decided when a run starts: its rows hold the outcome
    for config in upgrade_rows(rows[rows["status"] == "ok"])["config"]:
        ran = parse_config(config)
        changed |= {f"{key} {value} (ran {ran[key]})" for key, value in settings.items()
                    if key in ran and value != "auto" and not _same_setting(ran[key], value)}
    return sorted(changed)


def _same_setting(ran: object, wanted: object) -> bool:
    """Whether a recorded setting equals the study file's: numbers by value (a row's 1e-3 is the file's 0.001)."""
    if isinstance(ran, (int, float)) and isinstance(wanted, (int, float)) and not isinstance(ran, bool):
        return math.isclose(ran, wanted, rel_tol=1e-9, abs_tol=0.0)
    return ran == wanted


def warn_if_changed(campaign: Campaign, dataset: str, study: str, options) -> None:
    """Say on stderr which settings of ``study``'s file its finished runs on ``dataset`` ran otherwise, and how to
    run it again; nothing when they match. ``options`` carries the command's ``quick`` and ``sources``."""
    folder = results_dir() / campaign.study_name(dataset, study, options.quick)
    overrides = sweep_overrides(campaign, dataset, study, options.sources.get(dataset), options.quick)
    changed = changed_settings(folder, campaign.study_file(study), overrides)
    if changed:
        print(f"{folder.name}: its study file has changed since it ran ({'; '.join(changed)}), so its results are "
              f"the earlier settings'. --rerun {study} runs it again", file=sys.stderr)


def run_study(campaign: Campaign, dataset: str, study: str, options) -> Path | None:
    """Run (or resume, or skip) one study; its results folder, or None when its sweep failed.

    ``options`` carries the command's ``quick``, ``rerun``, ``overrides``, ``num_cpus``, ``progress_every`` and
    ``sources``.
    """
    folder = results_dir() / campaign.study_name(dataset, study, options.quick)
    seeds = QUICK_SEEDS if options.quick else campaign.seeds
    if study in options.rerun:
        set_aside(folder)
    if finished_seeds(folder) >= seeds:
        print(f"{folder.name}: done ({seeds} seeds)", flush=True)
        warn_if_changed(campaign, dataset, study, options)
        return folder
    if (folder / TRIALS_FILE).is_file() and not (folder / "tune").is_dir():
        print(f"{folder.name}: holds {finished_seeds(folder)} of {seeds} seeds but no Tune state to resume them "
              f"(restored from the campaign's records?); reported as it is. --rerun {study} runs it whole",
              file=sys.stderr)
        return folder
    # the sweep's own "--resume" line would compete with the campaign's "rerun the same command" after Ctrl-C
    command = [sys.executable, "-m", "study.sweep", str(campaign.study_file(study)), "--quiet", "--no-resume-line"]
    for override in sweep_overrides(campaign, dataset, study, options.sources.get(dataset), options.quick,
                                    tuple(options.overrides)):
        command += ["--set", override]
    if options.num_cpus:
        command += ["--num-cpus", str(options.num_cpus)]
    if (folder / TRIALS_FILE).is_file() or (folder / "tune").is_dir():
        command.append("--resume")
    print(f"{folder.name}: running ({' '.join(command[2:4])} …)", flush=True)
    sweep = subprocess.Popen(command)
    try:
        while True:  # a study runs for hours: say where it stands every few minutes
            try:
                sweep.wait(timeout=options.progress_every)
                break
            except subprocess.TimeoutExpired:
                print(progress_line(folder, seeds), flush=True)
    except KeyboardInterrupt:
        stop_sweep(sweep)
        raise
    if sweep.returncode in SWEEP_INTERRUPTED:
        # the signal stopped the sweep but not this process (started in the background, which ignores SIGINT, or
        # a SIGINT sent to the sweep alone): the campaign stops too, as after Ctrl-C, rather than going on as if
        # the study had failed and rewriting the page from a half-run study
        raise KeyboardInterrupt
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


def choose(campaign: Campaign, choice: Choice, quick: bool) -> list[str]:
    """The ``choice.count`` candidates with the best mean ``choice.metric`` ratio to ``choice.ratio_to`` over the
    datasets ``choice.over``, best first; none until every candidate has every seed on each of those datasets."""
    ratios: dict[str, list[float]] = {}
    seeds = QUICK_SEEDS if quick else campaign.seeds
    for dataset in choice.over:
        means = {}
        for study in (choice.ratio_to, *choice.candidates):
            folder = results_dir() / campaign.study_name(dataset, study, quick)
            if finished_seeds(folder) >= seeds:
                trials = pd.read_parquet(folder / TRIALS_FILE)
                means[study] = trials.loc[trials["status"] == "ok", choice.metric].mean()
        for study in choice.candidates:
            if study in means and means.get(choice.ratio_to):
                ratios.setdefault(study, []).append(means[study] / means[choice.ratio_to])
    complete = {s: statistics.mean(r) for s, r in ratios.items() if len(r) == len(choice.over)}
    if len(complete) < len(choice.candidates):
        return []
    return sorted(complete, key=complete.get, reverse=True)[:choice.count]
