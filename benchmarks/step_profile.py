"""Where one training step of a zoo model spends its time: step time, operator and kernel counts, FLOPs, top operators.

    python -m benchmarks.step_profile MODEL [--length 50] [--batch 128] [--items 1682] [--device cpu|cuda]
        [--threads 1] [--repeats 10] [--rows 15] [--set KEY=VALUE ...]

The step is the trainer's own (:class:`study.train.step.TrainStep`: forward, loss, backward, clipping, Adam) on
random full windows of ``--length`` items, with the model's and the trainer's defaults; ``--set`` takes the keys
``python -m study.train --set`` takes (a model field, or ``objective``, ``precision``, ``compile``, ...).
Printed:

- the median step time of ``--repeats`` steps after two warm-up steps, each timed to a synchronised end;
- per step, the ATen operators dispatched and, on CUDA, the kernels launched; the device time those kernels took
  against the wall time (``busy``): a step whose kernels keep the GPU busy a small part of its wall time is bound
  by launching them (Python and dispatcher overhead per operator), not by arithmetic or memory;
- the matrix-product FLOPs the profiler counts (mm, addmm, bmm, baddbmm: the forward's and the backward's) and the
  rate they run at, the number to hold against the device's matrix-product roofline;
- the top operators by self time (device time on CUDA, CPU time on a CPU).

Defaults match the ml-100k reproduction protocol (windows of 50, batch 128, 1,682 items).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import models
from models import ConfigError
from study.errors import print_error
from study.train.config import parse_assignments, split_settings
from study.train.step import TrainStep

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def build(model_name: str, length: int, items: int, device: str, settings: dict[str, str]) -> TrainStep:
    """The trainer's step over a fresh model; ``settings`` are ``--set`` pairs (trainer or model keys)."""
    train, hparams = split_settings(model_name, settings)
    torch.manual_seed(0)
    model = models.build(model_name, **{"max_len": length, **hparams, "num_items": items}).to(device)
    return TrainStep(model, train)


def random_windows(batch: int, length: int, items: int, device: str) -> torch.Tensor:
    """(batch, length + 1) item ids with no padding: every position is a real one."""
    ids = torch.randint(1, items + 1, (batch, length + 1), generator=torch.Generator().manual_seed(length))
    return ids.to(device)


def synchronise(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def step_seconds(step: TrainStep, windows: torch.Tensor, repeats: int, warmup: int = 2) -> list[float]:
    """Wall seconds of ``repeats`` steps after ``warmup`` steps, each ended by a device synchronisation."""
    device = str(windows.device)
    for _ in range(warmup):
        step(windows)
    synchronise(device)
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(windows)
        synchronise(device)
        timings.append(time.perf_counter() - start)
    return timings


def device_kernels(events: list) -> tuple[int, float, int]:
    """The kernels among a profile's events, their summed device seconds, and the annotated regions left out.

    Annotated regions (Adam's step, a compiled graph's call) also sit on the device timeline, each a span from its
    first kernel to its last with the gaps inside; summed with the kernels, they would count that time twice.
    """
    on_device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = [e for e in on_device if not e.is_user_annotation]
    return len(kernels), sum(e.device_time for e in kernels) / 1e6, len(on_device) - len(kernels)  # µs → s


def profile_step(step: TrainStep, windows: torch.Tensor, rows: int = 15) -> tuple[str, float]:
    """One profiled step (after the timed ones): its counts, busy share and top operators as text, and its
    matrix-product FLOPs."""
    from torch.profiler import ProfilerActivity, profile

    on_cuda = windows.is_cuda
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    synchronise(str(windows.device))
    start = time.perf_counter()
    with profile(activities=activities, with_flops=True) as prof:
        step(windows)
        synchronise(str(windows.device))
    wall = time.perf_counter() - start
    events = prof.key_averages()
    aten = sum(e.count for e in events if e.key.startswith("aten::"))
    flops = sum(e.flops for e in events if e.key in MATMULS)
    lines = [f"ATen operators dispatched: {aten}"]
    if on_cuda:
        kernels, busy, spans = device_kernels(prof.events())
        lines.append(f"CUDA kernels launched: {kernels}; their device time {1000 * busy:.2f} ms of the profiled "
                     f"step's {1000 * wall:.2f} ms wall (busy {100 * busy / wall:.0f} %; the profiler's own cost is "
                     f"in the wall); annotated regions on the device, not counted: {spans}")
    lines.append(f"matrix-product FLOPs: {flops / 1e9:.2f} GFLOP a step")
    sort_by = "self_device_time_total" if on_cuda else "self_cpu_time_total"
    lines.append(events.table(sort_by=sort_by, row_limit=rows, max_name_column_width=48))
    return "\n".join(lines), flops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=models.available())
    parser.add_argument("--length", type=int, default=50, help="window length N")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--items", type=int, default=1682, help="catalogue size (ml-100k has 1,682 items)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (on a CPU device)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rows", type=int, default=15, help="operators listed")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a trainer or model key, as python -m study.train takes it (e.g. precision=bf16)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to torch")
    torch.set_num_threads(args.threads)

    try:
        step = build(args.model, args.length, args.items, args.device, parse_assignments(args.set))
    except ConfigError as error:
        return print_error(error)
    windows = random_windows(args.batch, args.length, args.items, args.device)
    timings = step_seconds(step, windows, args.repeats)
    median = statistics.median(timings)
    where = (torch.cuda.get_device_name() if args.device.startswith("cuda")
             else f"CPU, {args.threads} thread(s)")
    one, five, _ = os.getloadavg()
    compiled = ", compiled" if step.train.compile else ""
    print(f"{args.model} step on {where}: B = {args.batch}, N = {args.length}, {args.items} items, objective "
          f"{step.objective}, {step.train.precision}{compiled}; load average {one:.1f} / {five:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(f"step time: median {1000 * median:.2f} ms of {args.repeats} (min {1000 * min(timings):.2f}, max "
          f"{1000 * max(timings):.2f}) after 2 warm-up steps")
    report, flops = profile_step(step, windows, args.rows)
    print(f"matrix products run at {flops / median / 1e12:.3f} TFLOP/s over the median step")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
