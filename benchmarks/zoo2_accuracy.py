"""Accuracy of model zoo II (ELASTIC, LISA) beside SASRec: three sections, markdown tables.

    python -m benchmarks.zoo2_accuracy --ml100k-source PATH/ml-100k.inter --lastfm PATH/LastFM.txt
        [--quick] [--sections main sensitivity sampled] [--seeds 0 1 2] [--threads 1] [--max-len N]
        [--max-epochs 200] [--patience 10] [--time-budget 0] [--out FILE] [--table-only]

Sections:
- ``main``: SASRec, ELASTIC and LISA-Base × {ml-100k, LastFM} × seeds, full ranking, HR/NDCG/MRR@10
  (mean ± std over seeds), plus the popularity baseline.
- ``sensitivity``: ELASTIC on ml-100k over K ∈ {8², 16², 32², 64²} × k ∈ {4, 8, 16} (k ≤ √K), NDCG@10
  and the key usage rate on the validation split (the paper's Figure 5), seed 0.
- ``sampled``: LISA-Base/Soft/Mini against the paper's 1-layer 1-head Transformer (``sasrec-1l``) and the
  zoo's SASRec on ml-100k, ranking the target against 100 uniform negatives (the LISA paper's protocol),
  seeds as given.

Protocol of every cell: leave-one-out, best epoch by validation NDCG@10, test metrics of that epoch,
history not masked, Adam (lr 2e-3), batch 128. Windows: ml-100k 200 items (``--quick``: 50), LastFM 50.
Losses: SASRec and LISA train with the causal softmax CE (``--objective bce`` gives the LISA paper's BCE
with one negative to both); ELASTIC is non-causal and trains with ``last`` (CE at the end of
``--prefixes`` random prefixes per user and epoch). Model sizes are laptop-scale and say so in the
variant table below (d = 64 everywhere; the LISA paper's D = 128).

``--quick`` shortens everything (windows of 50, at most 10 epochs, patience 3, 5 ELASTIC prefixes per user,
one seed) so the whole grid runs in about an hour on a 2-core CPU; its numbers are under-trained and say so.
Budgets are in epochs, not seconds, so a loaded machine slows a run down without changing its numbers.
Each finished trial is appended to a JSONL file (default ``results/zoo2_accuracy[_quick].jsonl``); cells
already there are skipped and tables are printed from everything the file holds, so an interrupted run
resumes and a partial grid still prints.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

from benchmarks.cells import append_row, load_rows
from study.data import prepare
from study.train.metrics import popularity_metrics
from study.train.trainer import TrialData, run_trial

# label → (model, hyperparameters); all d = 64
VARIANTS: dict[str, tuple[str, dict]] = {
    "sasrec": ("sasrec", {"dropout": 0.2, "attn_dropout": 0.2}),
    "sasrec-1l": ("sasrec", {"num_layers": 1, "num_heads": 1, "inner_size": 64, "activation": "relu",
                             "dropout": 0.1, "attn_dropout": 0.1}),
    "elastic": ("elastic", {"dropout": 0.2, "attn_dropout": 0.2}),  # K = 16×16, k = 8, pool 4, 2 layers
    "lisa-base": ("lisa", {"hidden_size": 64, "inner_size": 64, "variant": "base", "num_codewords": 64}),
    "lisa-soft": ("lisa", {"hidden_size": 64, "inner_size": 64, "variant": "soft", "num_codewords": 16}),
    "lisa-mini": ("lisa", {"hidden_size": 64, "inner_size": 64, "variant": "mini", "num_codewords": 32,
                           "target_codewords": 64}),
}
DATASETS = {"ml-100k": ("ml-100k", 200), "lastfm": ("lastfm", 50)}
SENSITIVITY_K = (64, 256, 1024, 4096)
SENSITIVITY_TOPK = (4, 8, 16)
METRICS = ("hr@10", "ndcg@10", "mrr@10")


def cells(args: argparse.Namespace) -> list[tuple[str, str, str, int, dict]]:
    """(section, dataset, label, seed, extra settings) for every requested trial."""
    out = []
    if "main" in args.sections:
        for dataset in args.datasets:
            for label in ("sasrec", "elastic", "lisa-base"):
                out += [("main", dataset, label, seed, {}) for seed in args.seeds]
    if "sensitivity" in args.sections:
        for k_experts in SENSITIVITY_K:
            for top_k in SENSITIVITY_TOPK:
                if top_k <= math.isqrt(k_experts):
                    label = f"elastic K={math.isqrt(k_experts)}x{math.isqrt(k_experts)} k={top_k}"
                    out.append(("sensitivity", "ml-100k", label, args.seeds[0],
                                {"num_experts": k_experts, "top_k": top_k}))
    if "sampled" in args.sections:
        for label in ("sasrec-1l", "sasrec", "lisa-base", "lisa-soft", "lisa-mini"):
            out += [("sampled", "ml-100k", label, seed, {"eval_mode": "sampled", "num_negatives": 100})
                    for seed in args.seeds]
    return out


def cell_key(section: str, dataset: str, label: str, seed: int) -> str:
    return f"{section}/{dataset}/{label}/{seed}"


def run_cells(args: argparse.Namespace, out: Path) -> None:
    done = {row["cell"] for row in load_rows(out)}
    sources = {"ml-100k": args.ml100k_source, "lastfm": args.lastfm}
    loaded: dict[str, TrialData] = {}
    for section, dataset, label, seed, extra in cells(args):
        key = cell_key(section, dataset, label, seed)
        if key in done:
            continue
        if dataset == "lastfm" and not sources["lastfm"]:
            print("lastfm: skipped, give --lastfm PATH/LastFM.txt", file=sys.stderr)
            continue
        recipe, max_len = DATASETS[dataset]
        max_len = args.max_len or (min(max_len, 50) if args.quick else max_len)
        if dataset not in loaded:
            path = prepare(recipe, source=sources[dataset], max_len=max_len, progress=False)
            loaded[dataset] = TrialData.from_prepared(path, max_len=max_len)
            popular = popularity_metrics(loaded[dataset].test, loaded[dataset].item_popularity)
            append_row(out, {"cell": cell_key("main", dataset, "popularity", 0), "section": "main",
                             "label": "popularity", "dataset": dataset, "seed": 0,
                             **{f"test_{k}": v for k, v in popular.items()}})
        name, hparams = VARIANTS[label.split(" ")[0]]
        settings = {**hparams, **extra, "max_len": max_len, "seed": seed, "lr": args.lr, "batch_size": 128,
                    "max_epochs": args.max_epochs, "patience": args.patience, "time_budget_s": args.time_budget,
                    "num_threads": args.threads, "measure_efficiency": False}
        if name == "elastic":
            settings["prefixes_per_user"] = args.prefixes
        else:
            settings["objective"] = args.objective
        started = time.perf_counter()
        row = run_trial(name, loaded[dataset], settings)
        append_row(out, {"cell": key, "section": section, "label": label, **row})
        usage = row["extra"].get("expert_usage_rate")
        print(f"{key:48s} HR@10 {row['test_hr@10']:.4f} NDCG@10 {row['test_ndcg@10']:.4f} MRR@10 "
              f"{row['test_mrr@10']:.4f}" + (f" usage {usage:.3f}" if usage is not None else "") +
              f"  {row['objective']} best epoch {row['best_epoch']}/{row['epochs_run']}"
              f"  {row['epoch_time_s']:.1f} s/epoch  {time.perf_counter() - started:.0f} s", flush=True)


def mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def epochs(rows: list[dict]) -> str:
    return f"{statistics.mean(r['best_epoch'] for r in rows):.0f}/{statistics.mean(r['epochs_run'] for r in rows):.0f}"


def main_table(rows: list[dict]) -> str:
    lines = ["| dataset | model | objective | HR@10 | NDCG@10 | MRR@10 | seeds | best/run epochs |",
             "|---|---|---|---|---|---|---|---|"]
    for dataset in DATASETS:
        for label in ("popularity", "sasrec", "elastic", "lisa-base"):
            mine = [r for r in rows if r["section"] == "main" and r["dataset"] == dataset and r["label"] == label]
            if not mine:
                continue
            objective = mine[0].get("objective", "–")
            runs = "–" if label == "popularity" else epochs(mine)
            lines.append(f"| {dataset} | {label} | {objective} | "
                         + " | ".join(mean_std([r[f"test_{m}"] for r in mine]) for m in METRICS)
                         + f" | {len(mine)} | {runs} |")
    return "\n".join(lines)


def sensitivity_table(rows: list[dict]) -> str:
    """Rows K, columns k: test NDCG@10 and the validation key usage rate of the selected epoch."""
    lines = ["| K | " + " | ".join(f"k={k}: NDCG@10 (usage)" for k in SENSITIVITY_TOPK) + " |",
             "|---|" + "---|" * len(SENSITIVITY_TOPK)]
    for k_experts in SENSITIVITY_K:
        side = math.isqrt(k_experts)
        line = f"| {side}×{side} |"
        for top_k in SENSITIVITY_TOPK:
            mine = [r for r in rows if r["section"] == "sensitivity" and r["label"] == f"elastic K={side}x{side} "
                    f"k={top_k}"]
            if not mine:
                line += " – |" if top_k <= side else " n/a (k > √K) |"
                continue
            usage = statistics.mean(r["extra"].get("expert_usage_rate", math.nan) for r in mine)
            line += f" {mean_std([r['test_ndcg@10'] for r in mine])} ({100 * usage:.1f}%) |"
        lines.append(line)
    return "\n".join(lines)


def sampled_table(rows: list[dict]) -> str:
    mine = [r for r in rows if r["section"] == "sampled"]
    reference = [r["test_ndcg@10"] for r in mine if r["label"] == "sasrec-1l"]
    lines = ["| model | objective | HR@10 | NDCG@10 | ΔNDCG@10 vs sasrec-1l | seeds | best/run epochs |",
             "|---|---|---|---|---|---|---|"]
    for label in ("sasrec-1l", "sasrec", "lisa-base", "lisa-soft", "lisa-mini"):
        group = [r for r in mine if r["label"] == label]
        if not group:
            continue
        ndcg = [r["test_ndcg@10"] for r in group]
        delta = f"{statistics.mean(ndcg) - statistics.mean(reference):+.4f}" if reference else "–"
        lines.append(f"| {label} | {group[0]['objective']} | {mean_std([r['test_hr@10'] for r in group])} | "
                     f"{mean_std(ndcg)} | {delta} | {len(group)} | {epochs(group)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ml100k-source", help="local ml-100k file/zip (default: download from GroupLens)")
    parser.add_argument("--lastfm", help="path to the S3Rec LastFM.txt file (LastFM is skipped without it)")
    parser.add_argument("--sections", nargs="+", default=["main", "sensitivity", "sampled"],
                        choices=["main", "sensitivity", "sampled"])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--seeds", nargs="+", type=int, help="default 0 1 2 (--quick: 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per trial")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--objective", default="causal", choices=["causal", "bce"], help="SASRec and LISA loss")
    parser.add_argument("--prefixes", type=int, default=10, help="ELASTIC: random prefixes per user and epoch")
    parser.add_argument("--max-len", type=int, help="window length for every dataset (default: per dataset)")
    parser.add_argument("--max-epochs", type=int, default=200)
    parser.add_argument("--patience", type=int, default=10, help="epochs without a better validation NDCG@10")
    parser.add_argument("--time-budget", type=float, default=0.0, help="seconds per trial, 0 = none")
    parser.add_argument("--quick", action="store_true",
                        help="windows of 50, <= 10 epochs, patience 3, 5 ELASTIC prefixes, seed 0 unless --seeds")
    parser.add_argument("--out", type=Path, help="JSONL of finished trials (default: results/zoo2_accuracy*.jsonl)")
    parser.add_argument("--table-only", action="store_true", help="print the tables of --out without training")
    args = parser.parse_args()
    args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    if args.quick:
        args.max_epochs, args.patience = min(args.max_epochs, 10), min(args.patience, 3)
        args.prefixes = min(args.prefixes, 5)
    out = args.out or Path("results") / ("zoo2_accuracy_quick.jsonl" if args.quick else "zoo2_accuracy.jsonl")
    if not args.table_only:
        run_cells(args, out)
    rows = load_rows(out)
    print("\n### Full ranking, beside SASRec (test metrics of the best-validation epoch)\n")
    print(main_table(rows))
    print("\n### ELASTIC sensitivity on ml-100k: test NDCG@10 (validation key usage rate)\n")
    print(sensitivity_table(rows))
    print("\n### Sampled protocol on ml-100k: target vs 100 uniform negatives (the LISA paper's)\n")
    print(sampled_table(rows))


if __name__ == "__main__":
    main()
