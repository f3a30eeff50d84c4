"""Accuracy of model zoo I (and HSTU, FPMC) beside SASRec: models × datasets × seeds, full ranking, one markdown table.

    python -m benchmarks.zoo_accuracy --ml100k-source PATH/ml-100k.inter --lastfm PATH/LastFM.txt
        [--quick] [--models sasrec bert4rec ...] [--datasets ml-100k lastfm] [--seeds 0 1 2]
        [--threads 1] [--max-epochs 200] [--patience 10] [--time-budget 0] [--out FILE] [--table-only]

Datasets: ml-100k (5-core, leave-one-out, windows of 200) and the S3Rec LastFM file (windows of 50).
Protocol for every cell: full ranking over all items, history not masked, best epoch by validation
NDCG@10, test metrics of that epoch; Adam lr 1e-3, batch 128. Models use their papers' defaults
(see each model file); the variant names say which form and objective ran:

    sasrec             causal softmax attention, causal CE (the baseline)
    bert4rec           bidirectional softmax, cloze (mask_prob 0.2)
    cotten4rec         bidirectional cosine attention, cloze
    cotten4rec-causal  causal cosine attention (prefix sums), causal CE
    linrec             causal LinRec (prefix column norms), causal CE
    linrec-paper       the paper's bidirectional LinRec, `last` CE over every prefix (RecBole's)
    recgrela           causal RELA (prefix sums), causal CE
    recgrela-paper     the paper's non-causal RELA, `last` CE over every prefix (RecBole's)
    gru4rec            GRU, causal CE
    hstu               pointwise SiLU attention with relative bias and the U gate, causal CE
    fpmc               MF + factorised first-order Markov chain (reads the user id), causal CE

`--quick` is a smoke run (one seed, a few epochs) that checks the whole grid end to end. Each finished
trial is appended at once to a JSONL file (default results/zoo_accuracy.jsonl, or
results/zoo_accuracy_quick.jsonl), cells already there are skipped, and the table is printed from
everything the file holds, so an interrupted run resumes and partial grids still give a table.
The popularity baseline of each dataset is one more row.
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

VARIANTS: dict[str, tuple[str, dict]] = {
    "sasrec": ("sasrec", {}),
    "bert4rec": ("bert4rec", {}),
    "cotten4rec": ("cotten4rec", {}),
    "cotten4rec-causal": ("cotten4rec", {"causal": True}),
    "linrec": ("linrec", {"causal": True}),
    "linrec-paper": ("linrec", {"causal": False}),
    "recgrela": ("recgrela", {"causal": True}),
    "recgrela-paper": ("recgrela", {"causal": False}),
    "gru4rec": ("gru4rec", {}),
    "hstu": ("hstu", {}),
    "fpmc": ("fpmc", {}),
}
DEFAULT_MODELS = ["sasrec", "bert4rec", "cotten4rec", "linrec", "recgrela", "gru4rec", "hstu", "fpmc"]
DATASETS = {  # recipe, window length, cloze mask probability
    "ml-100k": ("ml-100k", 200, 0.2),
    "lastfm": ("lastfm", 50, 0.2),
}
METRICS = ("hr@10", "ndcg@10", "mrr@10")


def cell_key(variant: str, dataset: str, seed: int) -> str:
    return f"{variant}/{dataset}/{seed}"


def run_grid(args: argparse.Namespace, out: Path) -> None:
    done = {row["cell"] for row in load_rows(out)}
    sources = {"ml-100k": args.ml100k_source, "lastfm": args.lastfm}
    for dataset in args.datasets:
        recipe, max_len, mask_prob = DATASETS[dataset]
        if dataset == "lastfm" and not sources["lastfm"]:
            print("lastfm: skipped, give --lastfm PATH/LastFM.txt", file=sys.stderr)
            continue
        data = TrialData.from_prepared(prepare(recipe, source=sources[dataset], max_len=max_len), max_len=max_len)
        if cell_key("popularity", dataset, 0) not in done:
            popular = popularity_metrics(data.test, data.item_popularity)
            append_row(out, {"cell": cell_key("popularity", dataset, 0), "variant": "popularity", "model": "popularity",
                             "dataset": dataset, "seed": 0, **{f"test_{k}": v for k, v in popular.items()}})
        for variant in args.models:
            name, hparams = VARIANTS[variant]
            for seed in args.seeds:
                key = cell_key(variant, dataset, seed)
                if key in done:
                    continue
                settings = {**hparams, "max_len": max_len, "mask_prob": mask_prob, "seed": seed, "lr": 1e-3,
                            "batch_size": 128, "max_epochs": args.max_epochs, "patience": args.patience,
                            "time_budget_s": args.time_budget, "num_threads": args.threads,
                            "measure_efficiency": False}
                started = time.perf_counter()
                row = run_trial(name, data, settings, progress=args.progress)
                append_row(out, {"cell": key, "variant": variant, **row})
                print(f"{key:28s} test HR@10 {row['test_hr@10']:.4f} NDCG@10 {row['test_ndcg@10']:.4f} "
                      f"MRR@10 {row['test_mrr@10']:.4f}  {row['objective']}  best epoch {row['best_epoch']}/"
                      f"{row['epochs_run']}  {row['epoch_time_s']:.1f} s/epoch  {time.perf_counter() - started:.0f} s",
                      flush=True)


def mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def table(rows: list[dict], datasets: list[str]) -> str:
    """Markdown: one line per variant, per dataset mean ± std over seeds of HR/NDCG/MRR@10, plus n and epochs."""
    variants = [v for v in ["popularity", *VARIANTS] if any(r["variant"] == v for r in rows)]
    header = "| model | objective |"
    rule = "|---|---|"
    for dataset in datasets:
        header += f" {dataset} HR@10 | NDCG@10 | MRR@10 | n | best epoch | s/epoch |"
        rule += "---|---|---|---|---|---|"
    lines = [header, rule]
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        objective = next((r.get("objective", "") for r in mine), "") if variant != "popularity" else "–"
        line = f"| {variant} | {objective} |"
        for dataset in datasets:
            cell = [r for r in mine if r["dataset"] == dataset]
            line += "".join(f" {mean_std([r[f'test_{m}'] for r in cell])} |" for m in METRICS)
            if variant == "popularity" or not cell:
                line += f" {len(cell) or '–'} | – | – |"
                continue
            epochs = [r["best_epoch"] for r in cell]
            runs = [r["epochs_run"] for r in cell]
            seconds = [r["epoch_time_s"] for r in cell if r.get("epoch_time_s") is not None]
            line += (f" {len(cell)} | {statistics.mean(epochs):.0f} (of {statistics.mean(runs):.0f}) |"
                     f" {statistics.median(seconds) if seconds else math.nan:.1f} |")
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ml100k-source", help="local ml-100k file/zip (default: download from GroupLens)")
    parser.add_argument("--lastfm", help="path to the S3Rec LastFM.txt file (LastFM is skipped without it)")
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(VARIANTS))
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per trial")
    parser.add_argument("--max-epochs", type=int, default=200)
    parser.add_argument("--patience", type=int, default=10, help="epochs without a better validation NDCG@10")
    parser.add_argument("--time-budget", type=float, default=0.0, help="seconds per trial, 0 = none")
    parser.add_argument("--quick", action="store_true", help="smoke run: seed 0, 3 epochs, patience 2")
    parser.add_argument("--out", type=Path, help="JSONL of finished trials (default: results/zoo_accuracy*.jsonl)")
    parser.add_argument("--table-only", action="store_true", help="print the table of --out without training")
    parser.add_argument("--progress", action="store_true", help="per-epoch progress bars")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.max_epochs, args.patience = [0], 3, 2
    out = args.out or Path("results") / ("zoo_accuracy_quick.jsonl" if args.quick else "zoo_accuracy.jsonl")
    if not args.table_only:
        run_grid(args, out)
    print(table(load_rows(out), args.datasets))


if __name__ == "__main__":
    main()
