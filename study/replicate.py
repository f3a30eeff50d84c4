"""Rerun a study's chosen configurations under new seeds, as Ray trials on the sweep's own runner.

    python -m study.replicate results/<study> --seeds 5 --select pareto|top:N [--first-seed 1]
        [--objectives valid_ndcg@10:max,peak_mem_mb:min,infer_ms_p50:min] [--dry-run] [--resume]

Data flow:

1. the study's sweep trials are grouped into configurations (settings without the seed, as in
   :mod:`study.analysis.runs`) and the configurations to replicate are selected on validation metrics: ``pareto``
   = the non-dominated set over ``--objectives``, ``top:N`` = the N best by ``--select-metric``;
2. each gets the seeds ``first_seed … first_seed + seeds − 1``: the same numbers in every study, so the
   report can pair two models' runs seed by seed. A seed the configuration already ran with in the sweep
   is refused (it would not be a replicate), and a (configuration, seed) already replicated is skipped;
3. the points (the source trial's searched values, with ``seed`` set) run through
   :func:`study.search.runner.run_study` with ``points=``: the sweep's trainable, its resources per trial and its
   recorder, FIFO and without the study's time budget, so every replicate trains its full epoch budget.
   Each invocation is a batch in ``results/<study>/replicates/<NNN>/`` (``plan.json``, ``trials/``,
   ``trials.parquet``, ``tune/``); ``--resume`` continues the last batch after an interruption;
4. ``results/<study>/replicates.parquet`` (+ ``.csv``) gathers every batch's rows: the same result schema as
   ``trials.parquet``, plus ``source_trial_id`` (the sweep trial replicated), ``config_id`` and
   ``replicate_batch``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from study.cli import run_command
from study.cluster import add_address_argument
from study.errors import UserError
from study.storage import Mirror, local_copy

if TYPE_CHECKING:
    import pandas as pd

# pandas, torch (through study.analysis) and Ray are imported inside the functions, so that the command's first
# line comes out at once


def parse_select(text: str) -> tuple[str, int]:
    """``pareto`` → ("pareto", 0); ``top:N`` → ("top", N)."""
    if text == "pareto":
        return "pareto", 0
    kind, _, count = text.partition(":")
    if kind == "top" and count.isdigit() and int(count) >= 1:
        return "top", int(count)
    raise UserError(f"--select {text!r}: expected pareto or top:N with N >= 1")


def select_configurations(path: str | Path, select: str, objectives: dict[str, str],
                          select_metric: str | None = None) -> pd.DataFrame:
    """The sweep configurations to replicate, best first, with ``source_trial_id`` and the searched point."""
    import pandas as pd

    from study.analysis import pareto
    from study.analysis.runs import (
        assign_labels,
        check_metrics,
        check_objectives,
        collect_runs,
        load_results,
        name_configs,
        selection_metric,
    )
    from study.analysis.tables import aggregate

    kind, count = parse_select(select)
    check_objectives(objectives)
    metric = selection_metric(objectives, select_metric)
    results = load_results(path)
    results.replicates = pd.DataFrame()  # select among the sweep's own configurations
    assign_labels([results])
    runs = collect_runs([results])
    check_metrics(runs, [metric], "selection metric")
    points = name_configs(aggregate(runs, {results.label: results.searched}), metric)
    if kind == "pareto":
        check_metrics(runs, objectives, "objective")
        points = pareto.pareto_front(points, objectives)
    else:
        points = points.sort_values([metric, "config_id"], ascending=[False, True]).head(count)
    return points.reset_index(drop=True)


def _trial_point(results_path: Path, trials: pd.DataFrame, trial_id: str, searched: list[str]) -> dict[str, Any]:
    """The config Tune gave the source trial (its searched values), from its record, else from its row."""
    from study.analysis.runs import RECORDS_DIR, parse_config
    from study.layout import record_path

    record = record_path(results_path / RECORDS_DIR, trial_id)
    if record.is_file():
        try:
            return dict(json.loads(record.read_text()).get("config") or {})
        except json.JSONDecodeError:
            pass
    row = trials[trials["trial_id"] == trial_id].iloc[0]
    full = parse_config(row["config"])
    return {key: full[key] for key in searched if key in full}


def plan_replicates(path: str | Path, selected: pd.DataFrame, seeds: int, first_seed: int) -> list[dict[str, Any]]:
    """One entry per (configuration, new seed) not replicated yet: source trial, config id, seed, trial config."""
    from study.analysis.runs import SEED_KEYS, load_results

    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}")
    if first_seed < 0:
        raise UserError(f"--first-seed must be >= 0, got {first_seed}")
    path = Path(path)
    results = load_results(path)
    trials = results.trials
    done: set[tuple[str, int]] = set()
    if not results.replicates.empty:
        ok = results.replicates[results.replicates["status"] == "ok"]
        done = {(str(c), int(s)) for c, s in zip(ok["config_id"], ok["seed"])}
    wanted = list(range(first_seed, first_seed + seeds))
    plan = []
    for _, row in selected.iterrows():
        used = sorted(int(s) for s in row["seeds"].split(",")) if row["seeds"] else []
        clash = sorted(set(used) & set(wanted))
        if clash:
            raise UserError(f"configuration {row['name']} (trial {row['source_trial_id']}) already ran with seed "
                            f"{clash[0]} in the sweep, so that run would not be a replicate; pass --first-seed "
                            f"{max(used) + 1} (and the same --first-seed for every study you compare, so that "
                            "seeds pair)")
        point = _trial_point(path, trials, str(row["source_trial_id"]), results.searched)
        point = {k: v for k, v in point.items() if k not in SEED_KEYS}
        for seed in wanted:
            if (row["config_id"], seed) in done:
                continue
            plan.append({"source_trial_id": str(row["source_trial_id"]), "config_id": row["config_id"],
                         "name": row["name"], "seed": seed, "config": {**point, "seed": seed}})
    return plan


def _batches(path: Path) -> list[Path]:
    from study.analysis.runs import REPLICATES_DIR

    root = path / REPLICATES_DIR
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit()) if root.is_dir() else []


def merge_batch(path: Path, batch: Path, plan: list[dict[str, Any]]) -> pd.DataFrame:
    """Link a batch's trial rows to their source trials and rewrite ``replicates.parquet`` with them."""
    import pandas as pd

    from study.analysis.runs import REPLICATES_CSV_FILE, REPLICATES_FILE, TRIALS_FILE, config_id
    from study.search.records import atomic_write

    rows = pd.read_parquet(batch / TRIALS_FILE) if (batch / TRIALS_FILE).is_file() else pd.DataFrame()
    by_key = {(entry["config_id"], int(entry["seed"])): entry for entry in plan}
    if not rows.empty:
        keys = [(config_id(c), int(s)) for c, s in zip(rows["config"], rows["seed"])]
        unknown = [k for k in keys if k not in by_key]
        if unknown:
            raise UserError(f"{batch}: {len(unknown)} trial(s) match no planned replicate (config {unknown[0][0]}, "
                            f"seed {unknown[0][1]}); was the study file changed between the sweep and now?")
        rows.insert(1, "source_trial_id", [by_key[k]["source_trial_id"] for k in keys])
        rows.insert(2, "config_id", [k[0] for k in keys])
        rows.insert(3, "replicate_batch", batch.name)
    target = path / REPLICATES_FILE
    existing = pd.read_parquet(target) if target.is_file() else pd.DataFrame()
    if not existing.empty:
        existing = existing[existing["replicate_batch"].astype(str) != batch.name]
    merged = pd.concat([f for f in (existing, rows) if not f.empty], ignore_index=True) \
        if not (existing.empty and rows.empty) else rows
    atomic_write(target, lambda out: merged.to_parquet(out, index=False))
    atomic_write(path / REPLICATES_CSV_FILE, lambda out: out.write(merged.to_csv(index=False).encode()))
    return merged


def replicate(path: str | Path, *, seeds: int, select: str, objectives: dict[str, str] | None = None,
              select_metric: str | None = None, first_seed: int = 1, dry_run: bool = False, resume: bool = False,
              num_cpus: int | None = None, address: str = "local", quiet: bool = False) -> dict[str, Any]:
    """Select, plan and run replicates of the study in ``path``; returns the plan, the batch folder and the rows."""
    import pandas as pd

    from study.analysis import pareto
    from study.analysis.runs import PLAN_FILE, REPLICATES_DIR, STUDY_FILE
    from study.spec.study_file import load_study

    path = local_copy(path)
    objectives = objectives or dict(pareto.DEFAULT_OBJECTIVES)
    if resume:
        batches = _batches(path)
        if not batches or not (batches[-1] / PLAN_FILE).is_file():
            raise UserError(f"nothing to resume in {path / REPLICATES_DIR}: no replicate batch was started there")
        batch = batches[-1]
        stored = json.loads((batch / PLAN_FILE).read_text())
        plan = stored["points"]
        selected = pd.DataFrame()
    else:
        selected = select_configurations(path, select, objectives, select_metric)
        plan = plan_replicates(path, selected, seeds, first_seed)
        batches = _batches(path)
        batch = path / REPLICATES_DIR / f"{int(batches[-1].name) + 1 if batches else 1:03d}"
    if dry_run or not plan:
        return {"plan": plan, "selected": selected, "batch": None, "replicates": None}
    if not (path / STUDY_FILE).is_file():
        raise UserError(f"{path / STUDY_FILE} is missing: replicates rerun the study exactly as it was resolved")
    # the folder may have moved since the sweep (copied off a cluster, pulled from a URI): it is the study's folder
    study = dataclasses.replace(load_study(path / STUDY_FILE), storage=path.resolve())
    if not resume:
        batch.mkdir(parents=True, exist_ok=False)
        created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        (batch / PLAN_FILE).write_text(json.dumps({"created": created, "select": select, "objectives": objectives,
                                                   "seeds": seeds, "first_seed": first_seed, "points": plan},
                                                  indent=1) + "\n")
    from study.search.runner import run_study  # imports Ray: only once there is something to run

    outcome = run_study(study, resume=resume, address=address, num_cpus=num_cpus, quiet=quiet,
                        points=[entry["config"] for entry in plan], storage=batch)
    merged = merge_batch(path, batch, plan)
    Mirror(path, study.storage_uri).push(force=True)
    return {"plan": plan, "selected": selected, "batch": batch, "replicates": merged, "outcome": outcome}


def describe(plan: list[dict[str, Any]]) -> str:
    """The plan in words, one line per configuration; values as the report shows them (plan.json keeps them all)."""
    import pandas as pd

    from study.analysis.runs import SEED_KEYS
    from study.analysis.tables import plain_value

    if not plan:
        return "nothing to replicate: every selected configuration already has these seeds"
    frame = pd.DataFrame(plan)
    grouped = frame.groupby(["name", "source_trial_id", "config_id"], sort=False)["seed"]
    lines = [f"{len(plan)} replicate trial(s):"]
    for (name, trial, cid), seeds in grouped:
        config = next(e["config"] for e in plan if e["config_id"] == cid)
        shown = ", ".join(f"{k}={plain_value(v)}" for k, v in config.items() if k not in SEED_KEYS)
        lines.append(f"  {name} (trial {trial}, config {cid}) seeds {', '.join(map(str, seeds))}: {shown}")
    return "\n".join(lines)


def summarise(replicates: pd.DataFrame, batch: Path, metric: str) -> str:
    from study.analysis.runs import REPLICATES_FILE

    rows = replicates[replicates["replicate_batch"].astype(str) == batch.name]
    failed = rows[rows["status"] != "ok"]
    lines = [f"{len(rows) - len(failed)} replicate(s) ok, {len(failed)} failed; in {batch}"]
    all_ok = replicates[replicates["status"] == "ok"]
    if metric in all_ok:
        per = all_ok.groupby("source_trial_id")[metric].agg(["mean", "std", "count"])
        for trial, stats in per.iterrows():
            lines.append(f"  {trial}: {metric} {stats['mean']:.4f} ± {stats['std']:.4f} over {int(stats['count'])} "
                         "seeds" if stats["count"] > 1 else f"  {trial}: {metric} {stats['mean']:.4f} (1 seed)")
    for _, row in failed.head(5).iterrows():
        lines.append(f"  failed {row['trial_id']} (seed {row['seed']}): {str(row['error'])[:200]}")
    lines.append(f"all replicates: {batch.parent.parent / REPLICATES_FILE}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m study.replicate",
        description="Rerun a study's chosen configurations under new seeds as Ray trials (the sweep's trainable "
                    "and resources), recorded in results/<study>/replicates.parquet linked to their source trial.")
    parser.add_argument("study", help="the study's results folder (results/<study>), or the URI it was mirrored to "
                                      "(s3://…: fetched into results/<last part of the URI>/ first)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per configuration (default %(default)s)")
    parser.add_argument("--select", default="top:1",
                        help="pareto (the non-dominated set over --objectives) or top:N (best N by --select-metric); "
                             "default %(default)s")
    parser.add_argument("--first-seed", type=int, default=1,
                        help="seeds are FIRST … FIRST+seeds−1 (default %(default)s); keep it equal across the "
                             "studies you compare so that their runs pair seed by seed")
    parser.add_argument("--objectives", default=None,
                        help="objectives of --select pareto, as METRIC:max|min,… (default: "
                             "study.analysis.pareto.DEFAULT_OBJECTIVES, valid_ndcg@10:max,peak_mem_mb:min,"
                             "infer_ms_p50:min)")
    parser.add_argument("--select-metric", help="validation metric of top:N (default: the first valid_ objective)")
    parser.add_argument("--dry-run", action="store_true", help="print the planned replicates and exit")
    parser.add_argument("--resume", action="store_true", help="continue the last, interrupted batch")
    add_address_argument(parser)
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs the local Ray may use (default: all)")
    parser.add_argument("--quiet", action="store_true", help="no Tune progress tables, no worker output")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        from study.analysis import pareto
        from study.analysis.runs import selection_metric

        if args.resume and args.dry_run:
            raise UserError("--resume and --dry-run exclude each other")
        objectives = pareto.parse_objectives(args.objectives or pareto.format_objectives(pareto.DEFAULT_OBJECTIVES))
        outcome = replicate(args.study, seeds=args.seeds, select=args.select, objectives=objectives,
                            select_metric=args.select_metric, first_seed=args.first_seed, dry_run=args.dry_run,
                            resume=args.resume, num_cpus=args.num_cpus, address=args.address, quiet=args.quiet)
        print(describe(outcome["plan"]))
        if outcome["batch"] is not None:
            metric = selection_metric(objectives, args.select_metric)
            print(summarise(outcome["replicates"], outcome["batch"], metric))
            print(f"next: python -m study.report {args.study} [other studies …]")
        return 0

    # (a dry run prints its plan alone)
    return run_command(body, address=args.address, first_line=None if args.dry_run else
                       f"study.replicate: selecting configurations of {args.study}, then starting Ray",
                       interrupted=f"continue with: python -m study.replicate {args.study} --resume")


if __name__ == "__main__":
    sys.exit(main())
