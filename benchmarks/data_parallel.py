"""Epoch time and start-up of the same trial as one process and as a two-worker data-parallel trial.

    python -m benchmarks.data_parallel --source PATH/TO/ml-100k.inter [--epochs 3] [--num-cpus 2]

Runs one SASRec trial on ml-100k (the recipe's download when ``--source`` is left out) through
:func:`study.search.runner.run_study` twice, each on its own embedded Ray as ``python -m study.sweep`` would: with
``workers_per_trial: 1`` (a Tune trial training in its own process) and ``workers_per_trial: 2`` (a Ray Train
``TorchTrainer`` whose two workers each train on a Ray Data shard); one CPU and one torch thread per worker, the
same per-worker batch size (so two workers take half the steps of twice the batch). Printed per trial:

* **epoch**: the median epoch time over epochs 2.. (the first carries one-off costs), and its training part
  (rank 0's sequences over its throughput); evaluation is not split: every worker scores the full validation set;
* **epoch 1**: the first epoch's time, which for the data-parallel trial includes starting the shard's stream;
* **start-up**: from the trainable's first line to the first step's batch in hand, in parts. The reports give the
  time to ``run_trial``'s start (``trial_compute_s - wall_time_s``, both taken at the same report) and then to
  epoch 1's first batch request (``wall_time_s - epoch_time_s`` at epoch 1: model, optimizer, evaluation
  negatives). A one-process trial has its first batch at once (one permutation of the window indices); for the
  two workers the shard log (``$SEQREC_SHARD_LOG``) gives the time each got its first batch from its Ray Data
  shard, and the later of the two counts, since the first step waits for both.

The figures depend on the machine's load: the load average is printed with them. Compare the two trials by their
ratio, which this one run measures under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from study.search.data_parallel import SHARD_LOG_ENV  # noqa: E402
from study.search.records import read_records  # noqa: E402
from study.spec.study_file import resolve  # noqa: E402

MODEL = {"max_len": 200, "batch_size": 64, "hidden_size": 64, "num_layers": 2, "num_heads": 2, "inner_size": 256,
         "lr": 1e-3, "dropout": 0.2, "measure_efficiency": False, "patience": 0, "seed": 0}


def run_one(workers: int, source: str | None, epochs: int, num_cpus: int, work: Path) -> dict[str, float]:
    """One trial with ``workers`` workers; its figures from its record (and the shard log when data-parallel)."""
    from study.search.runner import run_study

    study = resolve({
        "name": f"workers-{workers}",
        "model": "sasrec",
        "dataset": {"name": "ml-100k", "source": source},
        "fixed": {key: value for key, value in MODEL.items() if key != "lr"},
        "search": {"lr": {"choice": [MODEL["lr"]]}},
        "sampler": "random",
        "budget": {"num_samples": 1, "max_epochs": epochs},
        "scheduler": None,
        "resources": {"cpu": 1, "workers_per_trial": workers},
        "storage": str(work / f"results-{workers}"),
    })
    run_study(study, num_cpus=num_cpus, quiet=True)
    ((trial_id, record),) = read_records(study.storage / "trials").items()
    if record["status"] != "ok":
        raise SystemExit(f"the {workers}-worker trial failed: {record['error']}")
    history = sorted(record["history"], key=lambda row: row["epoch"])
    first, last, steady = history[0], record["last_report"], history[1:]  # --epochs is at least 2
    # run_trial's clock (wall_time_s) against the trainable's (trial_compute_s), read at the same report
    to_run_trial = last["trial_compute_s"] - last["wall_time_s"]
    figures = {"workers": workers, "epochs": len(history),
               "epoch_s": statistics.median(row["epoch_time_s"] for row in steady),
               "epoch_1_s": first["epoch_time_s"],
               "startup_to_run_trial_s": to_run_trial,
               # then run_trial's own set-up (model, optimizer, evaluation negatives) until epoch 1's loop starts
               "startup_to_epoch_1_s": to_run_trial + first["wall_time_s"] - first["epoch_time_s"],
               "trial_s": last["trial_compute_s"]}
    if workers == 1:
        sequences = float(_trainable_count(source))
        # the first in-memory batch is one permutation of the window indices: no measurable wait
        figures["startup_to_first_batch_s"] = figures["startup_to_epoch_1_s"]
    else:
        log = Path(os.environ[SHARD_LOG_ENV]) / trial_id
        sequences = float(len(np.load(log / "epoch-2-rank-0.npz")["windows"]))  # rank 0 reports the throughput
        first_batches = [float(np.load(log / f"epoch-1-rank-{rank}.npz")["first_batch_at"]) for rank in range(workers)]
        figures["startup_to_first_batch_s"] = max(first_batches) - last["trial_started_at"]
    figures["train_s"] = statistics.median(sequences / row["throughput"] for row in steady)
    return figures


def _trainable_count(source: str | None) -> int:
    from study.data import prepare
    from study.train.trainer import TrialData

    windows = TrialData.from_prepared(prepare("ml-100k", source=source, max_len=MODEL["max_len"], progress=False),
                                      MODEL["max_len"]).train
    return int(((windows[:, :-1] > 0).any(1) & (windows[:, -1] > 0)).sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=None, help="ml-100k's file (ml-100k.inter, u.data or the zip)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch is reported on its own")

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's classic output is silent at verbose 0
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    work = Path(tempfile.mkdtemp(prefix="data-parallel-"))
    os.environ.setdefault("SEQREC_DATA", str(work / "cache"))
    os.environ[SHARD_LOG_ENV] = str(work / "shards")  # the embedded Ray's workers inherit it
    load_before = os.getloadavg()[0]
    trials = [run_one(workers, args.source, args.epochs, args.num_cpus, work) for workers in (1, 2)]
    load_after = os.getloadavg()[0]

    columns = ["workers", "epoch_s", "train_s", "epoch_1_s", "startup_to_run_trial_s", "startup_to_epoch_1_s",
               "startup_to_first_batch_s", "trial_s"]
    for name in columns:
        print(f"{name:>25}" + "".join(f"{trial[name]:>10.2f}" if isinstance(trial[name], float) else
                                      f"{trial[name]:>10}" for trial in trials))
    one, two = trials
    ratios = {"epoch_2_over_1": two["epoch_s"] / one["epoch_s"], "train_2_over_1": two["train_s"] / one["train_s"],
              "startup_2_minus_1_s": two["startup_to_first_batch_s"] - one["startup_to_first_batch_s"]}
    print("  ".join(f"{name}: {value:.2f}" for name, value in ratios.items()))
    print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after; {args.num_cpus} Ray CPUs")
    if args.json:
        args.json.write_text(json.dumps({"trials": trials, "ratios": ratios, "load_before": load_before,
                                         "load_after": load_after}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
