"""BERT4Rec against SASRec when both train until validation stops improving: seeds × models × datasets.

    python -m benchmarks.bert4rec_budget --ml100k-source PATH/ml-100k.inter --lastfm PATH/LastFM.txt
        [--seeds 0 1 2 3 4] [--models sasrec bert4rec] [--datasets ml-100k lastfm] [--parallel 2]
        [--out benchmarks/results/bert4rec_budget.csv] [--table-only]

Why: at a budget of ~15 epochs BERT4Rec sat at the popularity baseline on ml-100k. Cloze training supervises
only the masked ~20% of each user's newest ``max_len`` items, once per epoch, while SASRec's causal CE supervises
every position, so BERT4Rec needs several times more epochs to see as many targets. Here both models run under one
stopping rule (at most ``MAX_EPOCHS`` epochs, stop after ``PATIENCE`` epochs without a better validation
NDCG@10, test metrics of the best-validation epoch), full ranking over all items, windows of 50, Adam lr 2e-3,
batch 64, one thread per run.

Each run is one ``python -m study.train`` process; its result row's test NDCG@10 / HR@10, best epoch, epochs run
and wall time are appended to the CSV as soon as it finishes, with the load average when it started (the machine
may be shared: compare wall times only between rows of similar load). A rerun skips the (model, dataset, seed)
cells already in the CSV, so an interrupted grid continues. The table (mean ± sd over seeds, and BERT4Rec's ratio
to SASRec) is printed from whatever the CSV holds.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MAX_EPOCHS = 200
PATIENCE = 10
# the protocol both models share (SASRec's measured ml-100k setting), as `--set` keys of python -m study.train
SHARED_SETTINGS = {"max_len": 50, "lr": 2e-3, "batch_size": 64, "max_epochs": MAX_EPOCHS, "patience": PATIENCE,
                   "eval_mode": "full", "num_threads": 1, "measure_efficiency": False}
# each model's default objective (SASRec: causal CE; BERT4Rec: cloze, here with the paper's §3.6 last-item samples,
# on each user's newest window: the default when benchmarks/results/bert4rec_budget.csv was measured)
MODEL_SETTINGS = {"sasrec": {},
                  "bert4rec": {"mask_prob": 0.2, "cloze_last_item_samples": True, "cloze_window_step": 0}}
DATASETS = {"ml-100k": "ml-100k", "lastfm": "lastfm"}  # benchmark name -> data recipe
COLUMNS = ("model", "dataset", "seed", "objective", "mask_prob", "cloze_copies", "cloze_last_item_samples",
           "max_epochs", "patience", "test_ndcg@10", "test_hr@10", "valid_ndcg@10", "pop_ndcg@10", "best_epoch",
           "epochs_run", "epoch_time_s", "wall_time_s", "load_at_start")
DEFAULT_OUT = Path("benchmarks/results/bert4rec_budget.csv")


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def cell(row: dict) -> tuple[str, str, int]:
    return row["model"], row["dataset"], int(row["seed"])


def command(model: str, dataset: str, source: str, seed: int) -> list[str]:
    settings = {**SHARED_SETTINGS, **MODEL_SETTINGS[model], "seed": seed}
    argv = [sys.executable, "-m", "study.train", "--model", model, "--dataset", DATASETS[dataset],
            "--source", source, "--no-progress"]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def csv_row(result: dict, dataset: str, load: float) -> dict:
    config = result["config"]
    return {
        "model": result["model"], "dataset": dataset, "seed": result["seed"], "objective": result["objective"],
        "mask_prob": config["mask_prob"] if result["objective"] == "cloze" else "",
        "cloze_copies": config.get("cloze_copies", ""),
        "cloze_last_item_samples": config.get("cloze_last_item_samples", ""),
        "max_epochs": config["max_epochs"], "patience": config["patience"],
        **{key: f"{result[key]:.5f}" for key in ("test_ndcg@10", "test_hr@10", "valid_ndcg@10", "pop_ndcg@10")},
        "best_epoch": result["best_epoch"], "epochs_run": result["epochs_run"],
        "epoch_time_s": f"{result['epoch_time_s']:.2f}", "wall_time_s": f"{result['wall_time_s']:.0f}",
        "load_at_start": f"{load:.1f}",
    }


def run_cell(model: str, dataset: str, source: str, seed: int, out: Path, lock: threading.Lock) -> None:
    load = os.getloadavg()[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
    done = subprocess.run(command(model, dataset, source, seed), capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(f"{model}/{dataset}/{seed}: failed ({done.returncode}): {done.stderr.strip()[-500:]}", file=sys.stderr)
        return
    row = csv_row(json.loads(done.stdout.strip().splitlines()[-1]), dataset, load)
    with lock:
        new_file = not out.exists()
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=COLUMNS)
            if new_file:
                writer.writeheader()
            writer.writerow(row)
    print(f"{model}/{dataset}/{seed}: test ndcg@10 {row['test_ndcg@10']} at epoch {row['best_epoch']} "
          f"of {row['epochs_run']}, {row['wall_time_s']} s", flush=True)


def table(rows: list[dict]) -> str:
    lines = ["| dataset | model | seeds | test NDCG@10 | test HR@10 | best epoch | epochs run | wall s | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]

    def spread(values: list[float], digits: int = 4) -> str:
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"

    for dataset in DATASETS:
        means = {}
        for model in MODEL_SETTINGS:
            picked = [row for row in rows if row["dataset"] == dataset and row["model"] == model]
            if not picked:
                continue
            ndcg = [float(row["test_ndcg@10"]) for row in picked]
            means[model] = statistics.mean(ndcg)
            ratio = f"{means[model] / means['sasrec']:.3f}" if "sasrec" in means and model != "sasrec" else ""
            lines.append(f"| {dataset} | {model} | {len(picked)} | {spread(ndcg)} | "
                         f"{spread([float(row['test_hr@10']) for row in picked])} | "
                         f"{spread([float(row['best_epoch']) for row in picked], 0)} | "
                         f"{spread([float(row['epochs_run']) for row in picked], 0)} | "
                         f"{spread([float(row['wall_time_s']) for row in picked], 0)} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bert4rec_budget", description=__doc__.split("\n")[0])
    parser.add_argument("--ml100k-source", help="the ml-100k .inter file, u.data or zip")
    parser.add_argument("--lastfm", help="the S3Rec LastFM.txt")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--models", nargs="+", default=list(MODEL_SETTINGS), choices=list(MODEL_SETTINGS))
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time, one thread each")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.table_only:
        sources = {"ml-100k": args.ml100k_source, "lastfm": args.lastfm}
        done = {cell(row) for row in read_rows(args.out)}
        # seed-major order: an interrupted grid holds whole seeds of every (model, dataset) pair
        todo = [(model, dataset, seed) for seed in args.seeds for dataset in args.datasets
                for model in args.models if (model, dataset, seed) not in done]
        missing = sorted({dataset for _, dataset, _ in todo if not sources[dataset]})
        if missing:
            parser.error(f"no source for {', '.join(missing)}: give --ml100k-source / --lastfm")
        lock = threading.Lock()
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            for future in [pool.submit(run_cell, model, dataset, sources[dataset], seed, args.out, lock)
                           for model, dataset, seed in todo]:
                future.result()
    print(table(read_rows(args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
