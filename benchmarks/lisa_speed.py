"""LISA against SASRec-SDPA: training step time over the window length N, before and after the histogram rewrite.

    python -m benchmarks.lisa_speed [--lengths 64 128 256 512 1024 2048] [--tokens 32768] [--items 3700]
        [--objective last] [--repeats 3] [--threads 1] [--no-before] [--profile N] [--device cuda]

Each cell times the one training step the trainer runs (:class:`study.train.step.TrainStep`: forward, loss,
backward, Adam) on random left-aligned windows, each model with its own defaults (SASRec: 2 layers, d = 64,
SDPA attention; LISA-Base: D = 128, 8 codebooks × 128 codewords, decay 0.1). The batch is scaled so that every
step holds ``--tokens`` window positions (B = tokens / N, at least 1): the linear-time model's step should
then stay flat in N while SASRec's grows with its N×N attention. Time is the median of ``--repeats`` steps
after one warm-up step, on CPU (or ``--device cuda``: there LISA's histogram runs the Triton kernel, which the
dispatcher picks for CUDA tensors, and the ``before`` rows are skipped).

``LISA before`` swaps the histogram attention back to the autograd formulation with the blocked-matmul scan
(:func:`kernels.histogram.naive.autograd_causal_histogram_attention`, what the reference was before the
rewrite); ``LISA`` is the current reference. Both rows run the current quantizer (its r·(U·Cᵀ) logits and
straight-through gather are not switchable), so the speed-up column is the histogram path's share alone.
The last line names the smallest N at which LISA's step is faster than SASRec's, or says that it is not up to
the largest N measured. ``--profile N`` profiles one current LISA step at that N on the chosen device
(:func:`benchmarks.step_profile.profile_step`: operator and kernel counts, matrix-product FLOPs, top operators).
The load average is printed with the table: on a shared CPU every absolute figure depends on it (other
people's jobs come and go between rows), the ratios less so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections.abc import Iterator

import torch

import kernels.histogram
from benchmarks.step_profile import build, profile_step, random_windows, step_seconds
from kernels.histogram.naive import autograd_causal_histogram_attention
from study.train.step import TrainStep


@contextlib.contextmanager
def previous_histogram_path() -> Iterator[None]:
    """Route the dispatcher's reference call to the pre-rewrite implementation for the duration of the block."""
    current = kernels.histogram.naive_causal_histogram_attention
    kernels.histogram.naive_causal_histogram_attention = autograd_causal_histogram_attention
    try:
        yield
    finally:
        kernels.histogram.naive_causal_histogram_attention = current


def median_step(step: TrainStep, windows: torch.Tensor, repeats: int) -> float:
    """Median seconds of ``repeats`` steps after one warm-up step."""
    return statistics.median(step_seconds(step, windows, repeats, warmup=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    parser.add_argument("--tokens", type=int, default=128 * 256, help="window positions per step (B = tokens / N)")
    parser.add_argument("--items", type=int, default=3700, help="catalogue size (LastFM has 3,646 items)")
    parser.add_argument("--objective", default="last", choices=["last", "causal", "bce", "sampled_ce"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-before", action="store_true", help="skip the pre-rewrite LISA rows")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile one LISA step at this N")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args(argv)
    if args.device != "cpu":
        args.no_before = True  # the pre-rewrite path is a CPU reference: on a GPU the kernel runs instead
    torch.set_num_threads(args.threads)

    objective = {"objective": args.objective}
    if args.profile:
        batch = max(1, args.tokens // args.profile)
        step = build("lisa", args.profile, args.items, args.device, objective)
        step(random_windows(batch, args.profile, args.items, args.device))  # warm-up: the Triton kernels compile here
        print(profile_step(step, random_windows(batch, args.profile, args.items, args.device))[0])
    rows = []
    for length in args.lengths:
        batch = max(1, args.tokens // length)
        data = random_windows(batch, length, args.items, args.device)
        row = {"N": length, "B": batch,
               "sasrec": median_step(build("sasrec", length, args.items, args.device, objective), data,
                                   args.repeats),
               "lisa": median_step(build("lisa", length, args.items, args.device, objective), data,
                                 args.repeats)}
        if not args.no_before:
            with previous_histogram_path():
                row["before"] = median_step(build("lisa", length, args.items, "cpu", objective), data, args.repeats)
        rows.append(row)
        print(f"N = {length}: " + ", ".join(f"{k} {v:.3f} s" for k, v in row.items() if k not in ("N", "B")),
              flush=True)

    load = os.getloadavg()
    where = torch.cuda.get_device_name() if args.device != "cpu" else f"CPU, {args.threads} thread(s)"
    print(f"\nstep time on {where} (objective {args.objective}, {args.items} items, "
          f"{args.tokens} positions per step); load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
          f"on {os.cpu_count()} CPUs\n")
    before = "" if args.no_before else " LISA before (ms) | before / SASRec | speed-up |"
    print(f"| N | B | SASRec (ms) | LISA (ms) | LISA / SASRec |{before}")
    print("|---" * (5 + (0 if args.no_before else 3)) + "|")
    for r in rows:
        line = (f"| {r['N']} | {r['B']} | {1000 * r['sasrec']:.0f} | {1000 * r['lisa']:.0f} | "
                f"{r['lisa'] / r['sasrec']:.2f} |")
        if not args.no_before:
            line += f" {1000 * r['before']:.0f} | {r['before'] / r['sasrec']:.2f} | {r['before'] / r['lisa']:.2f}× |"
        print(line)
    overtakes = next((r["N"] for r in rows if r["lisa"] < r["sasrec"]), None)
    if overtakes is None:
        print(f"\nLISA is not faster than SASRec at any N measured (up to {rows[-1]['N']}).")
    else:
        print(f"\nLISA's step is faster than SASRec's from N = {overtakes} on (smallest such N measured).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
