"""How much of a sweep's time goes into trials, and how long a warm actor takes to start the next trial.

    python -m benchmarks.sweep_overhead [--trials 8] [--epochs 5] [--source ../shared/datasets/s3rec/LastFM.txt]

Runs a real study (SASRec, two 1-CPU trials at a time, no scheduler so every trial runs all its epochs) through
:func:`study.search.runner.run_study` on an embedded Ray with ``--num-cpus`` CPUs, then reads each trial's record:

* **trial compute**: from the trainable's first line to its last report (``trial_compute_s``), i.e. data crop,
  model build, (optional) efficiency probe and every epoch; **epoch compute** counts the epochs only;
* **share of the sweep inside trials**: the sum of trial compute over ``concurrency x Tuner.fit() wall time``;
  ``share_of_command`` divides by the whole :func:`run_study` call instead (data, Ray's start, the final tables),
  so that work moved out of ``Tuner.fit()`` shows there;
* **warm start-up**: for consecutive trials on the same reused actor (same pid), the gap between one trial's
  last report and the next trial's first line: Tune's bookkeeping, the recorder's table rewrite, Optuna's
  suggestion, the actor reset and fetching the shared data from the object store.

``--recorder-trials N`` measures instead, without Ray, what the driver's :class:`~study.search.recorder.SweepRecorder`
costs Tune's loop (the thread that also starts the next trial) at each of N trials' ends, and the wait for the
complete tables at the experiment's end.

Targets (CPU, 2 cores): warm start-up <= 1 s; >= 90 % of the sweep's wall time inside trial compute.
The default dataset is the synthetic recipe (no files needed); pass ``--dataset lastfm --source PATH`` for real data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from study.search.records import read_records  # noqa: E402
from study.spec.resolved import Study  # noqa: E402
from study.spec.study_file import resolve  # noqa: E402


def _round(value: float) -> float:
    return round(value, 2)


def recorder_cost(trials: int, epochs: int) -> int:
    """Seconds Tune's loop spends in the recorder when a trial ends (first, median of the last ten, total)."""
    from types import SimpleNamespace

    import models
    from study.search.recorder import SweepRecorder

    out = Path(tempfile.mkdtemp(prefix="sweep-recorder-"))
    context = {"study": "overhead", "model": "sasrec", "dataset_meta": {"name": "synthetic"},
               "model_defaults": models.model_class("sasrec").config_class().to_dict(),
               "base_settings": {"max_epochs": epochs, "patience": 0}, "study_time_budget_s": 0}
    recorder = SweepRecorder(str(out), context)
    recorder.setup()
    spent = []
    for number in range(trials):
        trial = SimpleNamespace(trial_id=f"{number:05d}", config={"lr": 1e-3 * (1 + number % 7), "dropout": 0.2})
        for epoch in range(1, epochs + 1):
            recorder.on_trial_result(epoch, [], trial, {
                "epoch": epoch, "best_epoch": epoch, "train_loss": 1.0 / epoch, "epoch_time_s": 1.0,
                "best_valid_ndcg@10": 0.01 * epoch, "valid_ndcg@10": 0.01 * epoch, "test_ndcg@10": 0.01 * epoch,
                "trial_started_at": time.time(), "trial_compute_s": 1.0, "done": False})
        started = time.perf_counter()
        recorder.on_trial_complete(epochs, [], trial)
        spent.append(time.perf_counter() - started)
    started = time.perf_counter()
    recorder.on_experiment_end(trials=[])
    figures = {"trials": trials, "at_trial_end_s_first": round(spent[0], 4),
               "at_trial_end_s_median_last10": round(statistics.median(spent[-10:]), 4),
               "at_trial_ends_s_total": round(sum(spent), 2),
               "at_experiment_end_s": round(time.perf_counter() - started, 3),
               "load_average_1m": round(os.getloadavg()[0], 2)}
    for key, value in figures.items():
        print(f"{key:>29}: {value}")
    return 0


def overhead_study(args: argparse.Namespace, work: Path) -> Study:
    """The measured sweep: small SASRec trials on the chosen dataset, two at a time, no early stopping."""
    options = {"users": 1000, "items": 2000, "length": 40} if args.dataset == "synthetic" else {}
    return resolve({
        "name": "overhead",
        "model": "sasrec",
        "dataset": {"name": args.dataset, "source": args.source, "options": options},
        "fixed": {"max_len": 50, "batch_size": 128, "hidden_size": 32, "num_layers": 1, "num_heads": 1,
                  "inner_size": 64, "measure_efficiency": args.measure, "patience": 0},
        "search": {"lr": {"loguniform": [1e-3, 1e-2]}, "dropout": {"uniform": [0.1, 0.5]}},
        "budget": {"num_samples": args.trials, "max_epochs": args.epochs},
        "scheduler": None,
        "resources": {"cpu": 1, "max_concurrent": 2},
        "storage": str(work / "results"),
    })


def overhead_figures(records: list[dict], outcome: dict, total_wall: float) -> dict:
    """Where the sweep's wall time went: trial compute, the gaps between an actor's trials, start-up and
    the tail."""
    compute = [r["last_report"]["trial_compute_s"] for r in records]
    epochs = [r["last_report"]["wall_time_s"] for r in records]  # run_trial's own clock: the epochs
    concurrency = 2
    fit_wall = outcome["fit_wall_s"]
    by_actor: dict[int, list[tuple[float, float]]] = {}
    for r in records:
        start = r["last_report"]["trial_started_at"]
        by_actor.setdefault(r["last_report"]["pid"], []).append((start, start + r["last_report"]["trial_compute_s"]))
    gaps = []
    for spans in by_actor.values():
        spans.sort()
        gaps += [nxt[0] - prev[1] for prev, nxt in zip(spans, spans[1:])]
    first_start = min(r["last_report"]["trial_started_at"] for r in records)
    firsts = [min(spans)[0] for spans in by_actor.values()]  # each actor's first trial
    born = [r["last_report"]["process_started_at"] for r in records if r["last_report"].get("process_started_at")]
    in_process = [start - r["last_report"]["process_started_at"] for r in records for start in firsts
                  if r["last_report"].get("process_started_at") and r["last_report"]["trial_started_at"] == start]
    last_end = max(r["last_report"]["trial_started_at"] + r["last_report"]["trial_compute_s"] for r in records)
    fit_end = outcome["fit_started_at"] + fit_wall
    figures = {
        "trials_ok": len(records),
        "actors": len(by_actor),
        "fit_wall_s": round(fit_wall, 2),
        "total_wall_s": round(total_wall, 2),
        "trial_compute_s_median": round(statistics.median(compute), 2),
        "share_in_trial_compute": round(sum(compute) / (concurrency * fit_wall), 3),
        "share_in_epochs": round(sum(epochs) / (concurrency * fit_wall), 3),
        "share_of_command": round(sum(compute) / (concurrency * total_wall), 3),
        # once both actors are up: from the first trial's start to the last trial's end
        "share_in_trial_compute_warm": round(sum(compute) / (concurrency * (last_end - first_start)), 3),
        "warm_startup_s_median": round(statistics.median(gaps), 3) if gaps else None,
        "warm_startup_s_max": round(max(gaps), 3) if gaps else None,
        "cold_start_s": round(first_start - outcome["fit_started_at"], 2),  # Tuner.fit() to the first trial
        # of which: until the first actor process existed (placement, spawn), then inside it (imports, setup)
        "cold_start_scheduling_s": _round(min(born) - outcome["fit_started_at"]) if born else None,
        "cold_start_in_process_s": _round(statistics.median(in_process)) if in_process else None,
        "tail_s": round(fit_end - last_end, 2),  # the last trial's end to Tuner.fit() returning
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--source", default=None)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--measure", action="store_true", help="include the per-trial efficiency probe")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--recorder-trials", type=int, default=0, help="time the recorder alone over N trials")
    args = parser.parse_args(argv)
    if args.recorder_trials:
        return recorder_cost(args.recorder_trials, args.epochs)

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's classic output is silent at verbose 0
    work = Path(tempfile.mkdtemp(prefix="sweep-overhead-"))
    os.environ.setdefault("SEQREC_DATA", str(work / "cache"))
    from study.search.runner import run_study

    study = overhead_study(args, work)
    started = time.time()
    outcome = run_study(study, num_cpus=args.num_cpus, quiet=True)
    total_wall = time.time() - started
    records = [r for r in read_records(study.storage / "trials").values() if r["status"] == "ok"]
    figures = overhead_figures(records, outcome, total_wall)
    for key, value in figures.items():
        print(f"{key:>24}: {value}")
    ok_startup = figures["warm_startup_s_median"] is not None and figures["warm_startup_s_median"] <= 1.0
    print(f"target warm start-up <= 1 s: {'met' if ok_startup else 'NOT met'}; "
          f"target >= 90% in trial compute: {'met' if figures['share_in_trial_compute'] >= 0.9 else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
