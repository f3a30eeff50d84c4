"""Full softmax CE against sampled softmax (logQ-corrected) for SASRec on Amazon Beauty (12,101 items).

    python -m benchmarks.sampled_softmax --beauty PATH/Beauty.txt [--negatives 256] [--samplers uniform popularity]
        [--max-epochs 6] [--time-budget 300] [--max-len 20] [--hidden 64] [--batch-size 128] [--threads 1]
        [--seed 0]

Each row trains the zoo's SASRec (2 layers, d = ``--hidden``) with one objective: ``causal`` (full softmax CE at
every position) or ``sampled_ce`` with ``--negatives`` shared negatives per step from each ``--samplers`` entry.
Every run gets the same budget: ``--max-epochs`` epochs, cut after the epoch that crosses ``--time-budget``
seconds (evaluation included), so the faster objective may run more epochs inside the same time; a budget of
minutes is far below eSASRec's full training (its SS-256 row reports NDCG@10 = 0.0531), so NDCG here compares
the objectives under one small budget and is no reproduction.

Columns: ``step time`` is the training part of an epoch divided by its steps, ``epoch time`` the training part of
an epoch, both the median over the epochs after the first (the warm-up: allocator, lazy initialisation); the
test metrics are those of the best-validation epoch (full ranking over all items, leave-one-out). Beauty's
median sequence holds ~6 items, so ``--max-len 20`` keeps nearly every interaction while keeping steps short.
The machine's load average is printed with the table: timings on a shared CPU depend on it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from study.data import prepare
from study.train.trainer import EpochReport, TrialData, run_trial


def _prepared_beauty(source: Path, max_len: int) -> Path:
    """Prepare Beauty in a private cache unless SEQREC_DATA names one (the benchmark never writes elsewhere)."""
    if "SEQREC_DATA" not in os.environ:
        os.environ["SEQREC_DATA"] = tempfile.mkdtemp(prefix="seqrec-bench-")
    return prepare("beauty", source=source, max_len=max_len, progress=False)


def run_row(data: TrialData, label: str, settings: dict) -> dict:
    reports: list[EpochReport] = []
    result = run_trial("sasrec", data, settings, callback=reports.append)
    measured = reports[1:] or reports  # the first epoch is the warm-up unless it is the only one
    steps = -(-len(data.train) // settings["batch_size"])  # ceil: batches of user windows per epoch
    train_time = statistics.median(r.train_time_s for r in measured)
    return {"objective": label, "epochs": len(reports), "step_ms": 1000 * train_time / steps,
            "epoch_s": train_time, "wall_s": reports[-1].wall_time_s if reports else float("nan"),
            "best_epoch": result["best_epoch"], "ndcg@10": result["test_ndcg@10"], "hr@10": result["test_hr@10"],
            "pop_ndcg@10": result["pop_ndcg@10"]}


def table(rows: list[dict], header: str) -> str:
    lines = [header, "",
             "| objective | epochs | step time (ms) | epoch time (s) | speed-up | best epoch | test NDCG@10 "
             "| test HR@10 |",
             "|---|---|---|---|---|---|---|---|"]
    full = next((r for r in rows if r["objective"] == "full CE"), rows[0])
    for r in rows:
        lines.append(f"| {r['objective']} | {r['epochs']} | {r['step_ms']:.0f} | {r['epoch_s']:.1f} | "
                     f"{full['epoch_s'] / r['epoch_s']:.2f}× | {r['best_epoch']} | {r['ndcg@10']:.4f} | "
                     f"{r['hr@10']:.4f} |")
    lines.append(f"| popularity baseline | | | | | | {rows[0]['pop_ndcg@10']:.4f} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beauty", type=Path, required=True, help="the S3Rec Beauty.txt file")
    parser.add_argument("--negatives", type=int, default=256)
    parser.add_argument("--samplers", nargs="+", default=["uniform"], choices=["uniform", "popularity"])
    parser.add_argument("--max-epochs", type=int, default=6)
    parser.add_argument("--time-budget", type=float, default=300.0, help="seconds per run (0 = epochs only)")
    parser.add_argument("--max-len", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    data = TrialData.from_prepared(_prepared_beauty(args.beauty, args.max_len), max_len=args.max_len)
    base = {"max_len": args.max_len, "hidden_size": args.hidden, "inner_size": args.hidden,
            "batch_size": args.batch_size, "lr": args.lr, "max_epochs": args.max_epochs,
            "time_budget_s": args.time_budget, "patience": 0, "num_threads": args.threads, "seed": args.seed,
            "measure_efficiency": False, "dropout": 0.2, "attn_dropout": 0.2}
    runs = [("full CE", {"objective": "causal"})]
    runs += [(f"sampled CE, {args.negatives} {sampler}", {"objective": "sampled_ce", "train_negatives": args.negatives,
                                                           "train_negative_sampler": sampler})
             for sampler in args.samplers]
    rows = []
    for label, settings in runs:
        rows.append(run_row(data, label, {**base, **settings}))
        print(f"done: {label} ({rows[-1]['epochs']} epochs, {rows[-1]['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    load = os.getloadavg()
    header = (f"SASRec on Beauty ({data.num_items} items, {len(data.train)} users), d = {args.hidden}, window "
              f"{args.max_len}, batch {args.batch_size}, {args.threads} thread(s); budget {args.max_epochs} epochs "
              f"or {args.time_budget:.0f} s per run; load average at the end {load[0]:.1f} / {load[1]:.1f} / "
              f"{load[2]:.1f} (1/5/15 min) on {os.cpu_count()} CPUs")
    print(table(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
