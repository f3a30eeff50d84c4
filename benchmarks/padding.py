"""What skipping padding saves in training: the trainer's step on a real dataset's batches, trimming off and on.

    python -m benchmarks.padding --dataset beauty --source PATH/Beauty.txt [--model recgrela] [--max-len 50]
        [--objective causal] [--steps 40] [--rounds 3] [--threads 1] [--device cpu|cuda] [--set KEY=VALUE ...]

Both rows run :class:`study.train.step.TrainStep` (forward, loss, backward, Adam) over the same shuffled batches of
the prepared training windows (one left-padded window per user, batch 128, as the trainer draws them for
``causal``, ``bce`` and ``sampled_ce``); ``--set`` takes model and trainer fields (``causal=true`` for
RecGRELA's causal form).
- ``full``: ``trim_padding=False``, every batch at ``max_len`` columns;
- ``trimmed``: ``trim_padding=True`` (the default on a CPU; on CUDA the default is ``full``, which this
  benchmark measured faster there): each batch's all-padding columns dropped and its windows run in length groups
  (``study.train.padding.LENGTH_GROUPS``), each group as wide as its longest window.

One warm-up round, then ``--rounds`` rounds in which each row times ``--steps`` steps in turn (so a change of load
hits both); the table gives the medians, the input positions each row computes per step, and the share of them
that hold an item. Roofline columns: the matrix-product FLOPs of one step as torch's FLOP counter sees them
(forward and backward, averaged over ``--steps`` batches), their rate over the median step, and that rate against
a 2048³ fp32 matmul on the same threads (``benchmarks.speed.matmul_peak_gflops``, the larger of a measure before
and after the rounds; on ``--device cuda`` an 8192³ one, TF32 off). On CUDA each batch goes to the GPU in the step,
as in the trainer, and ``.item()`` waits for it; trimming reads the rows' lengths and each group's width back
from the GPU there, synchronisations the timing includes. Run it from two checkouts to compare code versions: the
figures are per machine and load.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import numpy as np
import torch

import models
from benchmarks.speed import matmul_peak_gflops, roof_matmul_size
from models import ConfigError
from study.data import prepare
from study.errors import UserError, print_error
from study.train.config import parse_assignments, split_settings
from study.train.objectives import computed_positions
from study.train.step import TrainStep
from study.train.trainer import TrialData, resolve_device, user_batches


def make_step(data: TrialData, args: argparse.Namespace, trim: bool) -> TrainStep:
    torch.manual_seed(args.seed)
    train, model_settings = split_settings(args.model, {"objective": args.objective, **parse_assignments(args.set)})
    model = models.build(args.model, num_items=data.num_items, max_len=args.max_len, **model_settings).to(args.device)
    return TrainStep(model, dataclasses.replace(train, seed=args.seed, trim_padding=trim))


def time_steps(step: TrainStep, batches: list[np.ndarray], device: torch.device) -> float:
    """Median seconds of one step over ``batches``, each synchronised by ``.item()`` as the trainer does."""
    times = []
    for windows in batches:
        start = time.perf_counter()
        step(torch.as_tensor(windows, dtype=torch.long, device=device)).item()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_gflop(step: TrainStep, batches: list[np.ndarray], device: torch.device) -> float:
    """Mean matrix-product GFLOP of one step (forward and backward) over ``batches``; the model's weights move
    (each counted step is a real step), which changes no count."""
    from torch.utils.flop_counter import FlopCounterMode  # imports triton: only when a benchmark counts

    with FlopCounterMode(display=False) as counter:
        for windows in batches:
            step(torch.as_tensor(windows, dtype=torch.long, device=device))
    return counter.get_total_flops() / len(batches) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="beauty", help="a data recipe: ml-100k, lastfm, beauty, ...")
    parser.add_argument("--source", help="the recipe's source file (default: the local data cache)")
    parser.add_argument("--model", default="recgrela", choices=models.available())
    parser.add_argument("--objective", default="causal", choices=["causal", "bce", "sampled_ce"])
    parser.add_argument("--max-len", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=40, help="steps timed per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a model or trainer field")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        args.device = resolve_device(args.device)
        prepared = prepare(args.dataset, source=args.source, max_len=args.max_len, progress=False)
        data = TrialData.from_prepared(prepared, args.max_len)
        rows = {"full": make_step(data, args, trim=False), "trimmed": make_step(data, args, trim=True)}
    except (ConfigError, UserError) as error:
        return print_error(error)
    batches = [batch.windows for batch in user_batches(data.train, args.batch_size, np.random.default_rng(args.seed))]
    roof = matmul_peak_gflops(args.threads, args.device)
    where = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else f"{args.threads} thread(s)"
    times: dict[str, list[float]] = {label: [] for label in rows}
    print(f"{args.model} ({args.objective}) on {args.dataset}, max_len {args.max_len}, batch {args.batch_size}, "
          f"{where}, load {os.getloadavg()[0]:.2f}", flush=True)
    for round_index in range(args.rounds + 1):
        chosen = batches[(round_index * args.steps) % len(batches):][:args.steps]
        for label, step in rows.items():
            seconds = time_steps(step, chosen, args.device)
            if round_index:  # round 0 warms up
                times[label].append(seconds)
    roof = max(roof, matmul_peak_gflops(args.threads, args.device))
    real = int(sum((b[:, :-1] > 0).sum() for b in batches))
    size = roof_matmul_size(args.device)
    print(f"roof: a {size}³ fp32 matmul on {where} runs at {roof:.1f} GFLOP/s")
    print("| row | ms/step (median of rounds) | input positions/step | real items among them | speed-up | "
          "GFLOP/step | GFLOP/s | % of roof |")
    print("|---|---|---|---|---|---|---|---|")
    base = statistics.median(times["full"])
    for label, trim in (("full", False), ("trimmed", True)):
        positions = sum(computed_positions(args.objective, b, trim=trim) for b in batches)
        seconds = statistics.median(times[label])
        gflop = step_gflop(rows[label], batches[:args.steps], args.device)
        print(f"| {label} | {1000 * seconds:.1f} | {positions / len(batches):,.0f} | {real / positions:.0%} | "
              f"{base / seconds:.2f}× | {gflop:.2f} | {gflop / seconds:.1f} | {100 * gflop / seconds / roof:.0f} |")
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
