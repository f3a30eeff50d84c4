"""Which trainer defaults reach quality fastest on this machine: a zoo model on ml-100k under a fixed wall budget.

    python -m benchmarks.defaults_search --source DIR_WITH_ml-100k.inter [--model sasrec] [--budget 60]
        [--threads 2] [--seeds 1] [--first-seed 0] [--only CANDIDATE ...] [--dataset ml-100k]

Each candidate is the trainer's and ``--model``'s defaults (SASRec by default) with a few keys changed
(``CANDIDATES``; the window candidates apply to every model, which is how a family's windows are chosen), at the
constant learning rate (``CONSTANT_SCHEDULE``) unless it names a schedule: the search chooses a family's schedule,
so its candidates do not start from one it chose. It trains with
``run_trial`` (the code ``python -m study.train`` runs) on ``--threads`` threads, one candidate after the other,
for ``--budget`` seconds of wall time (the epoch that crosses the budget is run but not counted). The table gives,
per candidate (the median over ``--seeds`` seeds): the epochs that fit, the best **validation** NDCG@10 within the
budget, the mean validation NDCG@10 over the epochs centred on that best one (``AROUND_BEST``), the cross-fitted
validation NDCG@10 (:func:`cross_fitted`), which is what selects, and the test NDCG@10 of the best-validation epoch and
the wall time at which that test figure first reached 0.041 (issue #16's time-to-quality target, an ml-100k
figure: on any other ``--dataset`` the column reads "-"). ``--dataset`` runs the same candidates on another recipe
(``--source`` then names its file), so that a default can be held to a second dataset. The best validation
figure is a maximum over epochs, so it rises with the epoch-to-epoch noise of the validation curve alone, the more
epochs sit near the top the more; the mean around the best weighs the maximum as one epoch of up to eleven, and so
marks down a curve that peaks sharply, although the trainer keeps that peak's weights. The cross-fitted figure has
neither bias: the users that pick an epoch never score it. Nothing is chosen on the test split: a default changes
only where the validation columns say so, and the same defaults then hold for every dataset. Each seed's line adds
ELASTIC's expert usage at its best epoch, for the memory candidates.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import models
from benchmarks.speed import TARGET_NDCG, load_text, prepared_recipe
from study.data import RECIPES
from study.environment import cpu_text
from study.train.metrics import user_metric
from study.train.objectives import CONSTANT_SCHEDULE
from study.train.trainer import EpochReport, TrialData, run_trial

# The search that chose SASRec's 50-item window: every candidate that does not name a window uses the 200 items
# that were the default then, and each user's newest window (window_step 0, the only one then), so that rerunning
# this gives the table of benchmarks/results/cpu_speed.md.
NEWEST = {"window_step": 0}
OLD_WINDOW = {"max_len": 200, **NEWEST}
# `shifting` windows 10 apart without dropout: the dropout-free windows the path diagnostics vary one setting of
SHIFTING_NO_DROPOUT: dict[str, Any] = {"max_len": 50, "window_step": 10, "window_targets": "shifting",
                                       "dropout": 0.0, "attn_dropout": 0.0}
CANDIDATES: dict[str, dict[str, Any]] = {
    "max_len=200": OLD_WINDOW,  # the old defaults
    "batch=64": {**OLD_WINDOW, "batch_size": 64},
    "batch=32": {**OLD_WINDOW, "batch_size": 32},
    "lr=2e-3": {**OLD_WINDOW, "lr": 2e-3},
    "lr=3e-3": {**OLD_WINDOW, "lr": 3e-3},
    "batch=64,lr=2e-3": {**OLD_WINDOW, "batch_size": 64, "lr": 2e-3},
    "dropout=0.2": {**OLD_WINDOW, "dropout": 0.2, "attn_dropout": 0.2},
    "max_len=50": {"max_len": 50, **NEWEST},
    "batch=32,lr=2e-3": {**OLD_WINDOW, "batch_size": 32, "lr": 2e-3},
    "batch=16": {**OLD_WINDOW, "batch_size": 16},
    "max_len=50,batch=32": {"max_len": 50, "batch_size": 32, **NEWEST},
    # the search that chose the whole-history windows (`--only windows*`, against max_len=50, the newest window)
    "windows=10,new": {"max_len": 50, "window_step": 10, "window_targets": "new"},
    "windows=10,all": {"max_len": 50, "window_step": 10, "window_targets": "all"},
    "windows=5,new": {"max_len": 50, "window_step": 5, "window_targets": "new"},
    "windows=25,new": {"max_len": 50, "window_step": 25, "window_targets": "new"},
    # more optimizer steps an epoch over the whole-history windows (`last` makes ~10x as many as they do)
    "windows=10,new,batch=32": {"max_len": 50, "window_step": 10, "window_targets": "new", "batch_size": 32},
    "windows=10,new,batch=64": {"max_len": 50, "window_step": 10, "window_targets": "new", "batch_size": 64},
    "windows=10,new,lr=2e-3": {"max_len": 50, "window_step": 10, "window_targets": "new", "lr": 2e-3},
    # on ml-100k a window scores ~14 targets on average, so 8 windows a step give about `last`'s 128 targets a step
    # and its steps an epoch (871 against 754): `last`'s optimisation, with the targets still sharing windows
    "windows=10,new,batch=16": {"max_len": 50, "window_step": 10, "window_targets": "new", "batch_size": 16},
    "windows=10,new,batch=8": {"max_len": 50, "window_step": 10, "window_targets": "new", "batch_size": 8},
    # the whole history is ~2.5x the newest window's targets, so the newest window's dropout may over-regularise it
    "windows=10,new,dropout=0.3": {"max_len": 50, "window_step": 10, "window_targets": "new",
                                   "dropout": 0.3, "attn_dropout": 0.3},
    "windows=10,new,dropout=0.2": {"max_len": 50, "window_step": 10, "window_targets": "new",
                                   "dropout": 0.2, "attn_dropout": 0.2},
    # `new` scores the newest window's older targets with only the part of it before them: on ml-100k 51 % of its
    # targets see fewer than 40 items, 34 % under `last`; `tail` scores them in older windows, nearer `last`'s context
    "windows=10,tail": {"max_len": 50, "window_step": 10, "window_targets": "tail"},
    # fewer targets share each window's forward pass (and its dropout draw)
    "windows=5,tail": {"max_len": 50, "window_step": 5, "window_targets": "tail"},
    # down to a step of 1, where every target sees the items `last` gives it, at about `last`'s cost an epoch
    "windows=2,tail": {"max_len": 50, "window_step": 2, "window_targets": "tail"},
    "windows=1,tail": {"max_len": 50, "window_step": 1, "window_targets": "tail"},
    # every target in a window's newest `step` slots, as `last`'s are in its newest one (at a step of 1, `last`)
    "windows=10,aligned": {"max_len": 50, "window_step": 10, "window_targets": "aligned"},
    "windows=5,aligned": {"max_len": 50, "window_step": 5, "window_targets": "aligned"},
    "windows=2,aligned": {"max_len": 50, "window_step": 2, "window_targets": "aligned"},
    # `aligned` with the windows' ends moved every epoch: each target at every newest slot over the epochs, with the
    # contexts those slots give it, where `aligned` keeps one (`last` gives each target one slot and one context)
    "windows=10,shifting": {"max_len": 50, "window_step": 10, "window_targets": "shifting"},
    # `shifting`'s slots in `last`'s passes: each target in a window of its own, so that it shares no forward pass
    # and no dropout draw, at `last`'s cost; what separates where a target is scored from its sharing a pass
    "windows=10,single": {"max_len": 50, "window_step": 10, "window_targets": "single"},
    # `aligned` at a step of 1: CE at the end of every prefix (the campaign's `sasrec-last`), to pair the layouts
    # above with it seed by seed on one device
    "last": {"max_len": 50, "objective": "last"},
    # without dropout a window's targets give exactly the gradients of passes of their own (the model is causal), so
    # if `last`'s lead over the windows is its one dropout draw a target, it goes with the dropout
    "last,dropout=0": {"max_len": 50, "objective": "last", "dropout": 0.0, "attn_dropout": 0.0},
    "windows=10,shifting,dropout=0": SHIFTING_NO_DROPOUT,
    # a window's targets share its embedding and hidden dropout draws but not their attention dropout (a mask per
    # query and key), so more of a window's noise is each target's own with more attention dropout, or more of both
    "windows=10,new,attn_dropout=0.7": {"max_len": 50, "window_step": 10, "window_targets": "new",
                                        "attn_dropout": 0.7},
    "windows=10,new,dropout=0.7": {"max_len": 50, "window_step": 10, "window_targets": "new",
                                   "dropout": 0.7, "attn_dropout": 0.7},
    # `last` at a dropout between 0 and 0.5: without it it peaks after 3-7 epochs, with 0.5 after 8-51 (sasrec-last)
    "last,dropout=0.2": {"max_len": 50, "objective": "last", "dropout": 0.2, "attn_dropout": 0.2},
    # without dropout `last` and `shifting` differ in their path: ~760 steps of 128 targets an epoch against ~83 of
    # ~1,170. `last` at ~95 steps of 1,024, each target still in its own pass, asks whether the steps are the gap
    "last,dropout=0,batch=1024": {"max_len": 50, "objective": "last", "dropout": 0.0, "attn_dropout": 0.0,
                                  "batch_size": 1024},
    # if they are, a longer step may stand in for more of them at the windows' cost (Adam's step is ~lr a weight)
    "windows=10,shifting,dropout=0,lr=3e-3": {**SHIFTING_NO_DROPOUT, "lr": 3e-3},
    "windows=10,new,lr=3e-3": {"max_len": 50, "window_step": 10, "window_targets": "new", "lr": 3e-3},
    # lr 3e-3 gives back ~40 % of `last`'s dropout-free lead: how much a longer step still can
    "windows=10,shifting,dropout=0,lr=6e-3": {**SHIFTING_NO_DROPOUT, "lr": 6e-3},
    "windows=10,shifting,dropout=0,lr=1e-2": {**SHIFTING_NO_DROPOUT, "lr": 1e-2},
    # the windows at about `last`'s steps an epoch (~660 of ~146 targets), 16 users a step where `last` has ~113
    "windows=10,shifting,dropout=0,batch=16": {**SHIFTING_NO_DROPOUT, "batch_size": 16},
    # a long step early and a short one late: lr 3e-3, halved after every 3 epochs without a validation gain
    "windows=10,new,lr=3e-3,decay=3": {"max_len": 50, "window_step": 10, "window_targets": "new", "lr": 3e-3,
                                       "lr_decay_patience": 3},
    "windows=10,shifting,dropout=0,lr=3e-3,decay=3": {**SHIFTING_NO_DROPOUT, "lr": 3e-3, "lr_decay_patience": 3},
    # longer steps that begin small: lr 6e-3 and 1e-2 lost without a warm-up (dropout 0); here at SASRec's dropout
    # 0.5, warmed up over the first 110 steps (two epochs of the windows on ml-100k) and decayed as above
    "windows=10,new,lr=6e-3,warmup=110,decay=3": {"max_len": 50, "window_step": 10, "window_targets": "new",
                                                  "lr": 6e-3, "lr_warmup_steps": 110, "lr_decay_patience": 3},
    # ELASTIC's memory (`--model elastic`, which trains with `last`): Lample et al.'s remedies for queries that
    # crowd onto a few experts, against the paper's memory as read (the campaign's `elastic` study)
    "elastic": {"max_len": 50},
    "query_batchnorm": {"max_len": 50, "query_batchnorm": True},
    "key_heads=4": {"max_len": 50, "key_heads": 4},
    "query_batchnorm,key_heads=4": {"max_len": 50, "query_batchnorm": True, "key_heads": 4},
}


# The epochs on either side of the best one whose validation figures the selecting mean takes in: the trainer's
# patience (10) leaves ten after the best whenever it, not the budget, ends a run, so five fit after any best.
AROUND_BEST = 5
# A candidate trained without a budget runs for up to an hour on one thread: it says where it stands this often.
PROGRESS_EVERY_S = 300.0
# The random halvings of the validation users that the cross-fitted figure averages over, drawn from a fixed seed so
# that every candidate and seed is scored on the same halvings: enough that the figure barely depends on the draw
CROSS_FIT_HALVINGS = 200
CROSS_FIT_SEED = 0


def cross_fitted(ranks: list[np.ndarray] | np.ndarray, halvings: int = CROSS_FIT_HALVINGS,
                 seed: int = CROSS_FIT_SEED) -> float:
    """The validation NDCG@10 of the epoch that validation selects, scored on users that did not select it.

    ``ranks`` (epochs, users): each epoch's rank of every validation user's target (``EpochReport.valid_ranks``).
    For each random halving of the users, the epoch with the best mean NDCG@10 on one half is scored by the other
    half's mean at that epoch, both ways round; the figure is the mean of those scores, 0 without epochs. It estimates
    what the trainer's choice of the best epoch is worth on users it has not seen: the noise that made an epoch best
    on one half does not score it. Each half selects from half the users, so the figure sits a little below what a
    selection on all of them would give, alike for every candidate.
    """
    if len(ranks) == 0:
        return 0.0
    gains = user_metric(torch.as_tensor(np.asarray(ranks)), "ndcg", 10).numpy()  # (epochs, users)
    users = gains.shape[1]
    rng = np.random.default_rng(seed)
    first = rng.permuted(np.tile(np.arange(users) < users // 2, (halvings, 1)), axis=1).T  # (users, halvings)
    by_first, by_second = gains @ first / first.sum(0), gains @ ~first / (~first).sum(0)  # (epochs, halvings)
    every = np.arange(halvings)
    scores = np.concatenate([by_second[by_first.argmax(0), every], by_first[by_second.argmax(0), every]])
    return float(scores.mean())


@dataclass
class Run:
    """One candidate's epochs under the budget: (wall s, best validation NDCG@10, its test NDCG@10), and beside them
    each epoch's own validation NDCG@10."""

    epochs: list[tuple[float, float, float]] = field(default_factory=list)
    valid: list[float] = field(default_factory=list)  # per epoch: that epoch's validation NDCG@10
    ranks: list[np.ndarray] = field(default_factory=list)  # per epoch: every validation user's rank of its target
    best_extras: list[dict[str, float]] = field(default_factory=list)  # per epoch: the best epoch's model statistics
    name: str = ""  # "<candidate> seed <n>" for the progress lines; none printed without it

    def __call__(self, report: EpochReport) -> None:
        printed_at = self.epochs[-1][0] // PROGRESS_EVERY_S if self.epochs else 0.0
        self.epochs.append((report.wall_time_s, report.best_valid["ndcg@10"], report.best_test["ndcg@10"]))
        self.valid.append(report.valid["ndcg@10"])
        self.ranks.append(report.valid_ranks)
        self.best_extras.append(dict(report.best_extra))
        if self.name and report.wall_time_s // PROGRESS_EVERY_S > printed_at:
            print(f"  {self.name}: epoch {report.epoch}, {report.wall_time_s:.0f} s, best valid NDCG@10 "
                  f"{report.best_valid['ndcg@10']:.4f} at epoch {report.best_epoch}", flush=True)

    def within(self, budget: float) -> list[tuple[float, float, float]]:
        return [epoch for epoch in self.epochs if epoch[0] <= budget]

    def mean_around_best(self, budget: float) -> float:
        """The mean validation NDCG@10 over the widest run of epochs centred on the best one inside the budget, at
        most ``AROUND_BEST`` on either side; 0 when no epoch fits. Centred, so that a curve still rising or falling
        through its best adds as much above the trend as below it: a best among the first epochs, or one that the
        budget or ``max_epochs`` cut, is averaged with fewer neighbours (the last epoch with none)."""
        curve = self.valid[:len(self.within(budget))]
        if not curve:
            return 0.0
        best = curve.index(max(curve))
        half = min(AROUND_BEST, best, len(curve) - 1 - best)
        near = curve[best - half:best + half + 1]
        return sum(near) / len(near)

    def cross_fitted(self, budget: float) -> float:
        """:func:`cross_fitted` over the epochs inside the budget."""
        return cross_fitted(self.ranks[:len(self.within(budget))])

    def time_to_quality(self, target: float = TARGET_NDCG) -> float | None:
        return next((wall for wall, _, test in self.epochs if test >= target), None)


def train(prepared: Path, overrides: dict[str, Any], threads: int, budget: float, seed: int,
          model: str = "sasrec", name: str = "") -> Run:
    run = Run(name=name)
    data = TrialData.from_prepared(prepared, overrides["max_len"])  # windows cut to the candidate's length
    run_trial(model, data, {"num_threads": threads, "time_budget_s": budget, "measure_efficiency": False,
                               "seed": seed, **CONSTANT_SCHEDULE, **overrides}, callback=run)
    return run


def usage_text(extra: dict[str, float]) -> str:
    """ELASTIC's expert usage at the best epoch (``Elastic.stats``), or nothing for a model without experts."""
    if "expert_usage_rate" not in extra:
        return ""
    return (f"; experts used {extra['expert_usage_rate']:.1%}, load entropy {extra['expert_load_entropy_norm']:.2f} "
            f"of the maximum, top expert {extra['expert_max_load']:.1%} of selections")


@dataclass
class Row:
    """A candidate's line of the table: medians over its seeds."""

    label: str
    epochs: float
    best_valid: float
    around_best: float  # the mean validation NDCG@10 around the best epoch
    cross_fitted: float  # the cross-fitted validation NDCG@10: what selects
    test: float  # the test NDCG@10 of the best-validation epoch
    seconds_to_quality: float | None  # wall s until that test figure reached the target, on every seed


def seed_line(label: str, seed: int, run: Run, budget: float) -> str:
    """One seed's figures inside the budget, to pair with a study's seeds: printed as soon as its run ends."""
    epochs = run.within(budget)
    valid, test = epochs[-1][1:] if epochs else (0.0, 0.0)
    extra = run.best_extras[len(epochs) - 1] if epochs else {}
    return (f"  {label} seed {seed}: {len(epochs)} epochs, best valid NDCG@10 {valid:.4f}, mean valid over the best "
            f"± {AROUND_BEST} epochs {run.mean_around_best(budget):.4f}, cross-fitted valid "
            f"{run.cross_fitted(budget):.4f}, its test {test:.4f}{usage_text(extra)}")


def summarise(label: str, runs: list[Run], budget: float, target: float | None = TARGET_NDCG) -> Row:
    """The candidate's medians over its seeds' runs; no time to quality without a ``target``."""
    counted = [run.within(budget) for run in runs]
    finals = [epochs[-1][1:] if epochs else (0.0, 0.0) for epochs in counted]  # (best valid, its test)
    reached = [run.time_to_quality(target) if target is not None else None for run in runs]
    return Row(label, statistics.median(len(e) for e in counted), statistics.median(final[0] for final in finals),
               statistics.median(run.mean_around_best(budget) for run in runs),
               statistics.median(run.cross_fitted(budget) for run in runs),
               statistics.median(final[1] for final in finals),
               statistics.median(reached) if None not in reached else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.defaults_search", description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="ml-100k", choices=list(RECIPES),
                        help="a recipe name (python -m study.data list)")
    parser.add_argument("--source", help="the recipe's local source (for ml-100k a folder with ml-100k.inter or "
                                         "u.data); default: download where the recipe can")
    parser.add_argument("--model", default="sasrec", choices=models.available())
    parser.add_argument("--budget", type=float, default=60.0, help="wall seconds of training per candidate")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=1, help="seeds per candidate (0, 1, ...)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="start the seeds here, to add seeds to a search already run")
    parser.add_argument("--only", nargs="*", choices=list(CANDIDATES), help="run these candidates only")
    args = parser.parse_args(argv)
    prepared = prepared_recipe(args.dataset, args.source, 200)
    quality_target = TARGET_NDCG if args.dataset == "ml-100k" else None  # issue #16's target is an ml-100k figure
    data = TrialData.from_prepared(prepared, 200)
    torch.set_num_threads(args.threads)
    print(f"{args.model} on {args.dataset}: {len(data.train)} users, {data.num_items} items; budget "
          f"{args.budget:.0f} s on {args.threads} threads; {cpu_text()}; {load_text()}", flush=True)
    rows = []
    for label in args.only or CANDIDATES:
        runs = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            runs.append(train(prepared, CANDIDATES[label], args.threads, args.budget, seed, args.model,
                              f"{label} seed {seed}"))
            print(seed_line(label, seed, runs[-1], args.budget), flush=True)
        row = summarise(label, runs, args.budget, quality_target)
        rows.append(row)
        print(f"{label}: {row.epochs:g} epochs, best valid NDCG@10 {row.best_valid:.4f}, mean around it "
              f"{row.around_best:.4f}, cross-fitted {row.cross_fitted:.4f}, its test {row.test:.4f}, seconds to "
              f"test >= {TARGET_NDCG}: {quality_text(row, quality_target)}; {load_text()}", flush=True)
    print_table(rows, args.budget, quality_target)
    return 0


def quality_text(row: Row, target: float | None) -> str:
    """The row's seconds to the time-to-quality target: "-" without a target, "not reached" if a seed missed it."""
    if target is None:
        return "-"
    return "not reached" if row.seconds_to_quality is None else f"{row.seconds_to_quality:.1f}"


def print_table(rows: list[Row], budget: float, target: float | None = TARGET_NDCG) -> None:
    """The candidates' rows as a Markdown table, best cross-fitted validation first, and the one it selects."""
    print(f"\n| candidate | epochs in {budget:.0f} s | best valid NDCG@10 | mean valid over best ± {AROUND_BEST} "
          f"| cross-fitted valid NDCG@10 | its test NDCG@10 | s to test >= {TARGET_NDCG} |")
    print("|---|---|---|---|---|---|---|")
    for row in sorted(rows, key=lambda row: -row.cross_fitted):
        ttq = quality_text(row, target)
        print(f"| {row.label} | {row.epochs:g} | {row.best_valid:.4f} | {row.around_best:.4f} | "
              f"{row.cross_fitted:.4f} | {row.test:.4f} | {ttq} |")
    print(f"\nselected by validation (cross-fitted): {max(rows, key=lambda row: row.cross_fitted).label}; "
          f"{load_text()}")


if __name__ == "__main__":
    raise SystemExit(main())
