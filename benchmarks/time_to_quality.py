"""How long SASRec takes to reach 0.9x the test NDCG@10 of SASRec trained on every prefix, by the windows it trains on.

    python -m benchmarks.time_to_quality --dataset ml-100k --source ../shared/datasets/ml-100k [--seeds 3]
        [--threads 2] [--budget 1800] [--reference 0.0668]
        [--only newest history history-decay history-warmup last last-no-dropout] [--until-target]

Ways to cut each user's training history, everything else at the trainer's and SASRec's defaults (``python
-m study.train``'s ``run_trial``, the causal CE except where named) but the learning rate, a constant 1e-3 unless a
way names a schedule (``CONSTANT_SCHEDULE``, the trainer's default before SASRec's windows took one of their own):

- ``newest``: each user's newest window only (``window_step: 0``), what every causal model trained on before
  whole-history windows became the default;
- ``history``: windows over the whole history, each training item a target once an epoch (the default windows,
  ``window_step`` max_len / 5 with ``window_targets: new``), at the constant rate;
- ``history-decay``: dropout-free windows over the whole history whose targets shift with the window
  (``window_targets: shifting``), at lr 3e-3 halved after every 3 epochs without a validation gain
  (``lr_decay_patience: 3``): the defaults search's ``windows=10,shifting,dropout=0,lr=3e-3,decay=3``;
- ``history-warmup``: the default windows at SASRec's dropout, at lr 6e-3 warmed up over the first 110 steps
  (``lr_warmup_steps``) and decayed as ``history-decay``: the defaults search's
  ``windows=10,new,lr=6e-3,warmup=110,decay=3``, SASRec's default on these windows;
- ``last``: CE at the end of every prefix of the whole history (``objective: last``, RecBole's augmentation), one
  forward pass per training item;
- ``last-no-dropout``: the same without dropout (hidden and attention), which stops improving after a few epochs.

The target is 0.9 x ``--reference``: by default the mean test NDCG@10 of the reproduction's ``sasrec-last`` study on
the dataset, read from its committed records (``experiments/reproduction/runs/``); a dataset without such records
needs ``--reference``. Each run trains until early stopping or ``--budget`` seconds; the table gives, per way, the
median over seeds of the wall time at which the test NDCG@10 of the best-validation epoch (what ``study.train``
would report if stopped there) first reaches the target (a seed that never reaches it counts as never), and of the
final test NDCG@10. ``--until-target`` ends a run at that epoch instead (the time to the target is the same; the
last column then reads where the run stopped), so that the slow ways cost only what the table measures. Seeds run
one after the other on ``--threads`` threads, the ways interleaved within each seed so that a change of load hits
all alike; the load average is printed with every run: on a shared machine every absolute time depends on it.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.defaults_search import CANDIDATES
from benchmarks.speed import load_text, prepared_recipe
from study.data import RECIPES
from study.environment import cpu_text
from study.train.objectives import CONSTANT_SCHEDULE

WAYS: dict[str, dict[str, Any]] = {
    "newest": {"window_step": 0},
    "history": {},  # the default windows, at the constant rate
    "history-decay": CANDIDATES["windows=10,shifting,dropout=0,lr=3e-3,decay=3"],
    "history-warmup": CANDIDATES["windows=10,new,lr=6e-3,warmup=110,decay=3"],
    "last": {"objective": "last"},
    "last-no-dropout": {"objective": "last", "dropout": 0.0, "attn_dropout": 0.0},
}
RECORDS = Path(__file__).resolve().parents[1] / "experiments" / "reproduction" / "runs"


class TargetReached(Exception):
    """Ends a run at the first epoch that reaches the target (``--until-target``)."""


@dataclass
class Progress:
    """Each epoch's (wall s, test NDCG@10 of the best-validation epoch so far); with ``stop_at``, the run ends at the
    first epoch whose figure reaches it."""

    epochs: list[tuple[float, float]] = field(default_factory=list)
    stop_at: float | None = None

    def __call__(self, report: Any) -> None:
        self.epochs.append((report.wall_time_s, report.best_test["ndcg@10"]))
        if self.stop_at is not None and self.epochs[-1][1] >= self.stop_at:
            raise TargetReached

    def reached(self, target: float) -> float | None:
        return next((wall for wall, test in self.epochs if test >= target), None)


def campaign_reference(dataset: str) -> float:
    """The mean test NDCG@10 of the reproduction's sasrec-last study on ``dataset``, from its committed records."""
    import pandas as pd

    trials = RECORDS / f"repro-{dataset.replace('-', '')}-sasrec-last" / "trials.parquet"
    if not trials.is_file():
        raise SystemExit(f"no sasrec-last records for {dataset} at {trials}; give --reference")
    rows = pd.read_parquet(trials)
    return float(rows.loc[rows["status"] == "ok", "test_ndcg@10"].mean())


def settings_of(way: str) -> dict[str, Any]:
    """The settings ``way`` trains with over the defaults: its own, at the constant rate unless it names a rate."""
    return {**CONSTANT_SCHEDULE, **WAYS[way]}


def train(prepared: Path, way: str, seed: int, threads: int, budget: float, stop_at: float | None) -> Progress:
    from study.train.trainer import TrialData, run_trial

    progress = Progress(stop_at=stop_at)
    data = TrialData.from_prepared(prepared, 50)  # SASRec's default window
    settings = {**settings_of(way), "seed": seed, "num_threads": threads, "time_budget_s": budget,
                "measure_efficiency": False}
    try:
        run_trial("sasrec", data, settings, callback=progress)
    except TargetReached:
        pass
    return progress


def median_time(reached: list[float | None]) -> float | None:
    """The median over seeds of the time to the target, a seed that never reached it counting as never (so the
    median exists when more than half of the seeds reached it); None when it does not."""
    median = statistics.median(math.inf if wall is None else wall for wall in reached)
    return None if math.isinf(median) else median


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.time_to_quality", description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="ml-100k", choices=list(RECIPES),
                        help="a recipe name (python -m study.data list)")
    parser.add_argument("--source", help="the recipe's local source; default: download where the recipe can")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per way (1, 2, ...)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget", type=float, default=1800.0, help="wall seconds at most per run")
    parser.add_argument("--reference", type=float, help="the NDCG@10 whose 0.9x is the target")
    parser.add_argument("--only", nargs="*", choices=list(WAYS), help="run these ways only")
    parser.add_argument("--until-target", action="store_true",
                        help="end each run at the first epoch that reaches the target")
    args = parser.parse_args(argv)
    reference = args.reference if args.reference is not None else campaign_reference(args.dataset)
    target = 0.9 * reference
    prepared = prepared_recipe(args.dataset, args.source, 50)
    ways = args.only or list(WAYS)
    print(f"{args.dataset}: target test NDCG@10 {target:.4f} (0.9 x {reference:.4f}); {args.threads} threads, "
          f"at most {args.budget:.0f} s a run{', ended at the target' if args.until_target else ''}; {cpu_text()}; "
          f"{load_text()}", flush=True)
    runs: dict[str, list[Progress]] = {way: [] for way in ways}
    stop_at = target if args.until_target else None
    for seed in range(1, args.seeds + 1):
        for way in ways:
            progress = train(prepared, way, seed, args.threads, args.budget, stop_at)
            runs[way].append(progress)
            reached = progress.reached(target)
            outcome = "not reached" if reached is None else f"reached at {reached:.0f} s"
            print(f"seed {seed}, {way}: {len(progress.epochs)} epochs in {progress.epochs[-1][0]:.0f} s, test "
                  f"NDCG@10 {progress.epochs[-1][1]:.4f}, target {outcome}; {load_text()}", flush=True)
    last_column = "test NDCG@10 where it stopped" if args.until_target else "final test NDCG@10"
    print(f"\n| {args.dataset} | s to test NDCG@10 >= {target:.4f} (median) | reached | {last_column} (median) "
          "| s per run (median) |")
    print("|---|---|---|---|---|")
    for way in ways:
        reached = [run.reached(target) for run in runs[way]]
        ttq = median_time(reached)
        final = statistics.median(run.epochs[-1][1] for run in runs[way])
        wall = statistics.median(run.epochs[-1][0] for run in runs[way])
        print(f"| {way} | {'-' if ttq is None else f'{ttq:.0f}'} | {sum(r is not None for r in reached)}/"
              f"{len(reached)} | {final:.4f} | {wall:.0f} |")
    print(f"\n{load_text()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
