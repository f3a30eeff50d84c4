"""Benchmarks for the foundation targets: SASRec accuracy/speed on ml-100k and full-ranking evaluation cost.

    python -m benchmarks.foundation --beauty PATH/Beauty.txt [--ml100k-source PATH] [--seeds 3] [--threads 2]

1. SASRec on ml-100k (5-core, max_len 200, causal CE, full ranking), one trial per seed: test NDCG@10 and
   HR@10 at the best-validation epoch, median epoch time, and the wall time at which the best-validation
   epoch's test NDCG@10 first exceeded RecBole's 16-minute figure (0.041).
2. Full-ranking evaluation of every Beauty user (max_len 50) with the platform's evaluator, against the bare
   roofline measured in the same run: one batched forward keeping the last position, the scoring matmul and
   top-k, nothing else. Medians of repeated runs after a warm-up; the ratio is what the target is about.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import models
from study.data import prepare
from study.train.metrics import evaluate
from study.train.trainer import EpochReport, TrialData, run_trial

RECBOLE_16_MIN_NDCG = 0.041


def sasrec_ml100k(source: str | None, seeds: int, threads: int, max_epochs: int) -> list[dict]:
    data = TrialData.from_prepared(prepare("ml-100k", source=source, max_len=200), max_len=200)
    rows = []
    for seed in range(seeds):
        crossed: list[float] = []

        def watch(report: EpochReport, crossed: list[float] = crossed) -> None:
            if not crossed and report.best_test.get("ndcg@10", 0.0) > RECBOLE_16_MIN_NDCG:
                crossed.append(report.wall_time_s)

        result = run_trial("sasrec", data, {"seed": seed, "num_threads": threads, "max_epochs": max_epochs},
                           callback=watch, progress=True)
        rows.append({**result, "time_to_0.041_s": crossed[0] if crossed else float("nan")})
        print(f"seed {seed}: test NDCG@10 {result['test_ndcg@10']:.4f}  HR@10 {result['test_hr@10']:.4f}  "
              f"best epoch {result['best_epoch']}/{result['epochs_run']}  epoch {result['epoch_time_s']:.2f} s  "
              f"time to >0.041 {rows[-1]['time_to_0.041_s']:.0f} s  wall {result['wall_time_s']:.0f} s", flush=True)
    return rows


@torch.no_grad()
def beauty_full_ranking(source: str, repeats: int) -> tuple[float, float, int, int]:
    data = TrialData.from_prepared(prepare("beauty", source=source, max_len=50), max_len=50)
    model = models.build("sasrec", num_items=data.num_items, max_len=50).eval()
    device = torch.device("cpu")
    inputs = torch.as_tensor(data.test.inputs, dtype=torch.long)

    def roofline() -> None:
        weights = model.item_weights()
        for start in range(0, len(inputs), 256):
            scores = model(inputs[start:start + 256])[:, -1] @ weights.T
            scores.topk(10, dim=1)

    def platform() -> None:
        evaluate(model, data.test, batch_size=256, device=device)

    timings: dict[str, list[float]] = {"roofline": [], "evaluator": []}
    for step in range(repeats + 1):  # the first round is the warm-up
        for name, run in (("roofline", roofline), ("evaluator", platform)):
            start = time.perf_counter()
            run()
            if step:
                timings[name].append(time.perf_counter() - start)
    return (statistics.median(timings["evaluator"]), statistics.median(timings["roofline"]),
            len(inputs), data.num_items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ml100k-source", help="local ml-100k file/zip (default: download from GroupLens)")
    parser.add_argument("--beauty", help="path to the S3Rec Beauty.txt file (part 2 is skipped without it)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-epochs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-training", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device cpu"
          f"{'' if not torch.cuda.is_available() else ' (CUDA present but not used)'}")

    if not args.skip_training:
        rows = sasrec_ml100k(args.ml100k_source, args.seeds, args.threads, args.max_epochs)
        ndcg = [r["test_ndcg@10"] for r in rows]
        print("\n| figure | value | target |\n|---|---|---|")
        print(f"| mean test NDCG@10 over {len(rows)} seeds | {np.mean(ndcg):.4f} ± {np.std(ndcg):.4f} | ≥ 0.050 |")
        print(f"| mean test HR@10 | {np.mean([r['test_hr@10'] for r in rows]):.4f} | (reference 0.107) |")
        print(f"| median epoch time | {np.median([r['epoch_time_s'] for r in rows]):.2f} s | ≤ 12 s |")
        crossings = ", ".join(f"{r['time_to_0.041_s']:.0f} s" for r in rows)
        print(f"| wall time until test NDCG@10 > 0.041 | {crossings} | ≤ 120 s |")
        print(f"| popularity baseline test NDCG@10 | {rows[0]['pop_ndcg@10']:.4f} | (reference 0.023) |")
    if args.beauty:
        evaluator, roof, users, items = beauty_full_ranking(args.beauty, args.repeats)
        print(f"\nfull ranking of {users:,} Beauty users × {items:,} items (max_len 50, SASRec, CPU): "
              f"evaluator {evaluator:.2f} s, roofline {roof:.2f} s, ratio {evaluator / roof:.2f}× (target ≤ 1.5×)")


if __name__ == "__main__":
    main()
