"""Scalability study: peak memory and latency against sequence length, one isolated Ray task per grid cell.

    python -m study.scaling search_spaces/scaling.yaml [--set key=value ...] [--dry-run] [--overwrite]

The grid is models (each with its config) × sequence lengths N × batch sizes × modes. ``train`` is one
optimisation step (forward + backward + Adam, :class:`study.train.step.TrainStep`, with the study's objective);
``inference`` is what serving a batch costs: encoder + scores over all items + top-k
(:func:`study.train.efficiency.inference_latency_ms`). Flow:

1. The YAML is read and every cell is validated before Ray starts (unknown models, keys or backends, a length
   or config the model refuses, impossible batch sizes ...): every error at once, each naming its key and
   cell, exit code 2. ``--dry-run`` stops there.
2. The dataset is prepared, and each (N, batch) gets one batch of real user histories, shared by every model,
   tiled where a history is shorter than N + 1 (recorded per cell in ``sequences``).
3. Each cell runs as its own Ray task (one GPU per cell where the cluster has GPUs), which starts a fresh
   Python process for the cell and measures in it, so no other cell's memory is in its figures. The process
   is capped at ``measure.memory_limit_mb`` (RLIMIT_DATA on a CPU, the allocator fraction on a GPU) and
   killed after ``measure.timeout_s``. In it: the model runs once at N = 4 (one-time runtime set-up), then
   the cell's model is built and the peak memory of its first run recorded
   (:func:`study.train.efficiency.measure_peak_mb`: CUDA allocator peak, or VmHWM − baseline RSS), more warm-up
   runs, then timed repeats (median and p95). Lengths of one (model, mode, batch) series run in increasing
   order; after an OOM, timeout or crash at some N the series' larger lengths are recorded as skipped.
   Any other failure is recorded with its error and the study goes on.
4. ``results/<study>/`` (or ``storage:``): ``cells.parquet`` + ``cells.csv`` (one row per cell, failures
   included), ``summary.csv``, log-log plots of memory and time against N and ratio plots against the
   reference model (PNG + SVG), ``scaling.md`` (growth exponents with R², ratios at ``compare_length``, paper
   claims holding or contradicted, with the numbers) and ``environment.json``.

The schema is in ``docs/scaling.md`` and :data:`SCHEMA_HELP`. The pieces: :mod:`study.spec.scaling_file` (the file,
step 1), :mod:`study.scaling.cells` (batches and the measuring process), :mod:`study.scaling.schedule` (Ray),
:mod:`study.scaling.analysis` (fits, ratios, claims) and :mod:`study.scaling.outputs` (step 4).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from study.errors import UserError
from study.scaling.cells import cell_specs, check_data, real_batch
from study.scaling.outputs import cell_rows, sequence_summary, write_outputs
from study.scaling.schedule import execute, per_cell_resources
from study.spec.scaling_file import ScalingStudy, load_scaling_study
from study.storage import Mirror

# torch, Ray and the data pipeline are imported inside the functions that need them, so that --help and --dry-run
# stay fast.

SCHEMA_HELP = """\
scaling YAML (docs/scaling.md has the full reference):
  name: scaling-default              # results go to results/<name>/ unless storage: is set
  dataset: {name: ml-100k, source: null, kcore: null, options: {}}   # whose user histories fill the batches
  num_items: null                    # catalogue size of every model; null = the dataset's (may only enlarge it)
  models:                            # one line per entry in every plot; label defaults to model[-backend]
    - {label: sasrec-math, model: sasrec, config: {attention_backend: math}, expected_growth: quadratic}
    - {model: elastic, config: {num_layers: 2}, expected_growth: linear}
  train: {objective: last}           # objective, lr, weight_decay, mask_prob, seed; an entry's train: overrides
  lengths: [64, 128, 256, 512, 1024]
  batch_sizes: [8]                   # or tokens_per_batch: 8192 (batch = tokens // N at each length)
  modes: [train, inference]
  measure: {warmup: 1, repeats: 3, timeout_s: 300, memory_limit_mb: 4096, top_k: 20, prewarm: true}
  fit: {min_length: 256}             # growth exponents are fitted over the lengths >= min_length
  compare_length: 1024               # the N of the ratio columns (default 1024 if in the grid, else the largest)
  reference: sasrec-math             # the label ratios are taken against
  claims:                            # checked against the measurements: max_ratio (model/reference <=) or
    - {paper: ELASTIC, text: "90% less training memory", model: elastic, reference: sasrec-math,
       mode: train, metric: memory, length: 1024, max_ratio: 0.10}   # min_factor (reference/model >=)
  resources: {cpu: 1, gpu: auto, max_concurrent: auto}              # per cell
  stop_after_failure: true           # after an OOM/timeout/crash at N, skip that series' larger N
  seed: 0
  storage: null                      # a folder, or a URI (s3://…, gs://…) mirrored as cells finish
override any field with --set key=value (dotted; values are YAML: --set lengths=[64,128])"""


def run_study(study: ScalingStudy, *, address: str = "local", num_cpus: int | None = None, progress: bool = True,
              quiet: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Prepare the data, run every cell on Ray, write ``results/<study>/``; returns paths and a summary."""
    from study.cluster import start_ray
    from study.data import load_prepared, prepare
    from study.environment import collect

    out = study.storage
    mirror = Mirror(out, study.storage_uri)
    for place, holds in ((out, (out / "cells.parquet").exists()), (mirror.uri, mirror.holds("cells.parquet"))):
        if holds and not overwrite:
            raise UserError(f"{place} already holds a scaling study; pass --overwrite to replace it, or choose "
                            "another name or storage")
    dataset = study.dataset
    path = prepare(dataset["name"], source=dataset["source"], kcore=dataset["kcore"], progress=progress,
                   **dataset["options"])
    data = load_prepared(path)
    check_data(study, int(np.count_nonzero(np.diff(data.history_indptr))), data.num_items)
    num_items = study.num_items or data.num_items
    cells = study.cells()
    batches = {(c.length, c.batch_size): None for c in cells}
    for length, batch_size in batches:
        batches[(length, batch_size)] = real_batch(data.history_indptr, data.history_indices, length, batch_size,
                                                   seed=study.seed, dataset_name=data.meta.get("name", "dataset"))
    started_ray = start_ray(address, num_cpus=num_cpus, quiet=quiet)  # local, or join a cluster: study.cluster
    import ray

    try:
        cpu, gpu, concurrent = per_cell_resources(study, ray.cluster_resources())
        out.mkdir(parents=True, exist_ok=True)
        env = collect(ray.cluster_resources())
        (out / "environment.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
        (out / "study.yaml").write_text(study.to_yaml())
        specs = cell_specs(study, cells, num_items=num_items, device="cuda" if gpu > 0 else "cpu",
                           threads=max(1, int(cpu)))
        refs = {key: ray.put(batch.windows) for key, batch in batches.items()}
        log = (out / "cells.jsonl").open("w")

        def on_row(spec: dict[str, Any], outcome: dict[str, Any]) -> None:
            # one line per finished cell, so an interrupted study still leaves its measurements behind
            log.write(json.dumps({**{k: spec[k] for k in ("label", "mode", "length", "batch_size")}, **outcome},
                                 default=str) + "\n")
            log.flush()
            mirror.push()  # throttled

        # the machine's load says how far CPU timings can be trusted (other jobs share the cores)
        load_start, cells_started = _load_average(), time.monotonic()
        try:
            outcomes = execute(specs, refs, cpu=cpu, gpu=gpu, max_concurrent=concurrent,
                               stop_after_failure=study.stop_after_failure, progress=progress, on_row=on_row)
        finally:
            log.close()
        env["scaling_run"] = {"cells_wall_s": round(time.monotonic() - cells_started, 1),
                              "load_average_1min": {"start": load_start, "end": _load_average()},
                              "cells_at_a_time": concurrent, "cpu_per_cell": cpu, "gpu_per_cell": gpu}
        (out / "environment.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
    finally:
        if started_ray:
            ray.shutdown()
    frame = cell_rows(study, cells, outcomes, batches, data.meta, num_items, specs)
    outputs = write_outputs(frame, study, env, sequence_summary(batches, data.meta))
    mirror.push(force=True)
    if mirror.uri:
        outputs["text"] += f"\nmirrored to {mirror.uri}"
    return outputs


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m study.scaling",
        description="Measure peak memory and latency against sequence length for every model of a YAML grid, one "
                    "isolated Ray task per cell; write parquet/CSV, log-log plots and scaling.md with growth "
                    "exponents, ratios and paper claims.",
        epilog=SCHEMA_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="the scaling YAML (see search_spaces/scaling.yaml and docs/scaling.md)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="override a field by its dotted path, e.g. --set lengths=[64,128] "
                             "--set measure.repeats=1 --set dataset.source=../data/ml-100k.zip")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate every cell, print the resolved study and the number of cells, and exit "
                             "without starting Ray")
    parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in the "
                                                                   "same storage folder")
    from study.cluster import add_address_argument

    add_address_argument(parser)
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs the local Ray may use (default: all)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--quiet", action="store_true", help="no worker output")
    return parser


def main(argv: list[str] | None = None) -> int:
    from study.cli import print_dry_run, run_command

    args = build_parser().parse_args(argv)

    def body() -> int:
        study = load_scaling_study(args.study, args.overrides, check_machine=args.address == "local")
        if args.dry_run:
            return print_dry_run(study, f"{len(study.cells())} cells ({len(study.models)} models × "
                                        f"{len(study.lengths)} lengths × {len(study.batch_keys())} batch setting(s) "
                                        f"× {len(study.modes)} mode(s))")
        outcome = run_study(study, address=args.address, num_cpus=args.num_cpus,
                            progress=not args.no_progress and sys.stderr.isatty(), quiet=args.quiet,
                            overwrite=args.overwrite)
        print(outcome["text"])
        return 0

    return run_command(body, address=args.address, first_line=None if args.dry_run else
                       f"study.scaling: validating {args.study}, then preparing its batches and starting Ray",
                       interrupted="the cells measured so far are in cells.jsonl of the results folder")
