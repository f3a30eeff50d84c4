"""Seconds per SASRec training epoch: this project's, a plain reference and (optionally) pmixer's, in one run.

    python -m benchmarks.speed --source DIR_WITH_ml-100k.inter [--max-len 200] [--dropout 0.2] [--threads 2]
        [--rounds 3] [--steps 0] [--pmixer PATH] [--pmixer-epochs 4] [--compile] [--time-to-quality]
        [--ttq-budget 900] [--profile] [--before]

Rows, each timed on ml-100k's prepared training windows (one left-padded window per user, batch 128):
- ``ours``: the platform's SASRec under its default objective (``causal``: full softmax CE at every real position),
  d = 64, 2 layers, 2 heads, inner 256, SDPA attention, the trainer's own :class:`~study.train.step.TrainStep`;
- ``plain``: :mod:`benchmarks.plain_sasrec`, the same sizes, loss and data in straightforward PyTorch;
- ``ours, pmixer's config``: ours with the ``bce`` objective (one sampled negative per position), d = 50, 1 head,
  inner 50, ReLU, dropout between the FFN linears: the configuration pmixer's SASRec.pytorch trains;
- ``pmixer`` (``--pmixer PATH``, a checkout of github.com/pmixer/SASRec.pytorch): its ``python/main.py`` run as is
  in a subprocess on the same ml-100k sequences written in its ``data/NAME.txt`` format (``user item`` lines in
  time order, 1-based ids) in a temporary folder; an epoch's time is read by wrapping its output (the time between
  the last loss line of consecutive epochs). It keeps its own defaults otherwise (3 sampler processes, Adam betas
  0.9/0.98, BCE with one negative). It runs after the in-process rounds, not interleaved with them: compare its
  row under a steady load only (the load is printed with its epochs).
- ``ours, before`` (``--before``): ours with the attention mask rebuilt in every layer, as it was before it was
  built once per forward (same results);
- ``ours, compiled`` (``--compile``): ours after ``torch.compile``; the compile time is printed on its own;
- ``ours, bf16 autocast`` (``--device cuda`` only): ours with ``precision=bf16``.

``--device cuda`` runs every row (pmixer's too) on the GPU; the roof is then an 8192³ fp32 matmul without TF32
(what the eager fp32 step computes), and a bf16 one is printed beside it.

Every implementation gets one warm-up epoch, then ``--rounds`` rounds in which each in-process row runs one epoch
in turn (so load changes hit all rows alike); the table gives the median. ``--steps N`` times N steps per round
instead of whole epochs and scales to an epoch. Dropout is ``--dropout`` everywhere (attention and hidden).

Roofline columns: ``GFLOP/step`` counts the matrix products of one mean step (embedding gathers, LayerNorm, GELU
and softmax are elementwise and left out): QKV and output projections 8·T·d², FFN 4·T·d·inner, attention scores and
mixing 4·B·L²·d per layer over the T = B·L positions the dense batch computes, plus the output layer, 2·P·d·(items
+ 1) for the full CE over the P scored positions (2·P·d·2 for one negative); backward is counted as twice the
forward. ``GFLOP/s`` is that over the measured time and ``% of peak`` compares it with a large fp32 matmul
(2048³) timed on the same threads before and after the rounds (the larger of the two): the distance from the
compute roof. A low percentage says the
step is bound by memory traffic and per-operator overhead (dropout masks, softmax over B·H·L² scores), not FLOPs.

``--time-to-quality`` trains the platform's SASRec with the trainer's and the model's defaults (``python -m
study.train``'s ``run_trial``, only ``num_threads`` set; SASRec's window is 50 items by default, whatever
``--max-len`` the rows use) and prints the wall time at which the test NDCG@10 of the best-validation
epoch first reaches 0.041 (the figure ``study.train`` would report if stopped there), or the best reached within
``--ttq-budget`` seconds.
``--profile`` splits each in-process row's operator time into matrix products, dropout random numbers and the
rest, which says what bounds a step that is far from the roof.
The load average is printed beside the table: on a shared machine every absolute figure depends on it.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import models
import models.blocks as blocks
from benchmarks.plain_sasrec import PlainSASRec, all_position_ce
from study.train.config import TrainConfig
from study.train.step import TrainStep
from study.train.trainer import EpochReport, TrialData, run_trial, user_batches

TARGET_NDCG = 0.041
CPU = torch.device("cpu")
StepFn = Callable[[torch.Tensor], torch.Tensor]  # one training step over a batch of windows; returns its loss


@dataclass
class Shape:
    """The matrix sizes of one implementation, for counting its FLOPs."""

    hidden: int
    heads: int
    inner: int
    layers: int
    items: int
    negatives: int | None  # None: full softmax over every item


def step_gflop(shape: Shape, batch: np.ndarray) -> float:
    """Matrix-product GFLOP of one training step on ``batch`` (B, L + 1): forward, and backward as 2× forward."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    rows, length = inputs.shape
    tokens = rows * length
    d = shape.hidden
    per_layer = 8 * tokens * d * d + 4 * tokens * d * shape.inner + 4 * rows * length * length * d
    scored = int(((inputs > 0) & (targets > 0)).sum())
    candidates = shape.items + 1 if shape.negatives is None else 1 + shape.negatives
    forward = shape.layers * per_layer + 2 * scored * d * candidates
    return 3 * forward / 1e9


def roof_matmul_size(device: torch.device) -> int:
    """The side of the square matmul that measures a device's compute roof (large enough to saturate it)."""
    return 8192 if device.type == "cuda" else 2048


def matmul_peak_gflops(threads: int, device: torch.device = CPU, dtype: torch.dtype = torch.float32,
                       repeats: int = 5) -> float:
    """GFLOP/s of a large square matmul: on a CPU fp32 on ``threads`` threads (2048³, the compute roof of this
    machine's share), on a GPU 8192³ in ``dtype`` (fp32 without TF32, as the eager fp32 step computes)."""
    torch.set_num_threads(threads)
    size = roof_matmul_size(device)
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        (a @ b).sum().item()  # .item() waits for the device
        times.append(time.perf_counter() - start)
    return 2 * size ** 3 / min(times) / 1e9


class Row:
    """One in-process implementation: a step function over the epoch's batches, timed per round."""

    def __init__(self, label: str, step: StepFn, shape: Shape, data: TrialData, batch_size: int, steps: int, seed: int,
                 device: torch.device = CPU):
        self.label, self.step, self.shape, self.device = label, step, shape, device
        self.batches = [batch.windows for batch in user_batches(data.train, batch_size, np.random.default_rng(seed))]
        self.steps_per_epoch = len(self.batches)
        self.steps = steps or len(self.batches)
        self.times: list[float] = []
        self.gflop_per_step = statistics.fmean(step_gflop(shape, b) for b in self.batches)

    def run(self, record: bool = True) -> float:
        start = time.perf_counter()
        for index in range(self.steps):
            # as the trainer does: the batch goes to the device each step, and .item() waits for the step
            self.step(torch.as_tensor(self.batches[index % len(self.batches)], dtype=torch.long,
                                      device=self.device)).item()
        seconds = (time.perf_counter() - start) * self.steps_per_epoch / self.steps
        if record:
            self.times.append(seconds)
        return seconds


def our_step(data: TrialData, args: argparse.Namespace, pmixer_config: bool = False, compile_model: bool = False,
             precision: str = "fp32") -> tuple[StepFn, Shape]:
    torch.manual_seed(args.seed)
    hparams = dict(num_items=data.num_items, max_len=args.max_len, dropout=args.dropout, attn_dropout=args.dropout)
    objective = "causal"
    if pmixer_config:
        hparams.update(hidden_size=50, num_heads=1, inner_size=50, activation="relu", ffn_inner_dropout=True)
        objective = "bce"
    model = models.build("sasrec", **hparams).to(args.device)
    step = TrainStep(model, TrainConfig(objective=objective, seed=args.seed, compile=compile_model,
                                        precision=precision))
    cfg = model.config
    shape = Shape(cfg.hidden_size, cfg.num_heads, cfg.inner_size, cfg.num_layers, data.num_items,
                  1 if objective == "bce" else None)
    return step, shape


def per_layer_mask(valid: torch.Tensor, causal: bool, additive: bool = False) -> torch.Tensor:
    """The attention mask as every layer built it before it was shared: fresh per layer (SDPA converted the boolean
    mask to this float form inside each call)."""
    mask = blocks.attention_mask(valid, causal)
    return torch.where(mask, 0.0, float("-inf")) if additive else mask


def before_step(data: TrialData, args: argparse.Namespace) -> tuple[StepFn, Shape]:
    """Ours as it was before the mask was built once per forward (the same weights, seed and results)."""
    step, shape = our_step(data, args)

    def run(windows: torch.Tensor) -> torch.Tensor:
        shared, blocks.shared_attention_mask = blocks.shared_attention_mask, per_layer_mask
        try:
            return step(windows)
        finally:
            blocks.shared_attention_mask = shared

    return run, shape


def plain_step(data: TrialData, args: argparse.Namespace) -> tuple[StepFn, Shape]:
    torch.manual_seed(args.seed)
    model = PlainSASRec(data.num_items, args.max_len, dropout=args.dropout).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(windows: torch.Tensor) -> torch.Tensor:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = all_position_ce(model, windows)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step, Shape(64, 2, 256, 2, data.num_items, None)


def write_pmixer_dataset(data_path: Path, folder: Path, name: str) -> None:
    """Every user's whole sequence (train + valid + test, in time order) as pmixer's ``user item`` lines."""
    from study.data import load_prepared

    dataset = load_prepared(data_path)
    indptr = np.asarray(dataset.history_indptr, dtype=np.int64)
    items = np.asarray(dataset.history_indices, dtype=np.int64)
    users = np.repeat(np.arange(1, len(indptr)), np.diff(indptr))
    (folder / "data").mkdir(parents=True, exist_ok=True)
    np.savetxt(folder / "data" / f"{name}.txt", np.stack([users, items], axis=1), fmt="%d")


def time_pmixer(checkout: Path, data_path: Path, args: argparse.Namespace) -> list[float]:
    """Seconds of each pmixer epoch after its first, read from when its last loss line of each epoch appears."""
    script = checkout.resolve() / "python" / "main.py"  # it runs from a temporary folder
    if not script.is_file():
        raise SystemExit(f"--pmixer {checkout}: no python/main.py there (expected a SASRec.pytorch checkout)")
    with tempfile.TemporaryDirectory(prefix="pmixer-") as folder:
        write_pmixer_dataset(data_path, Path(folder), "ml100k")
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
        command = [sys.executable, "-u", str(script), "--dataset=ml100k", "--train_dir=speed",
                   f"--device={args.device.type}",
                   f"--maxlen={args.max_len}", f"--dropout_rate={args.dropout}",
                   f"--num_epochs={args.pmixer_epochs + 1}"]
        last_line_at: dict[int, float] = {}
        pattern = re.compile(r"loss in epoch (\d+) iteration (\d+)")
        with subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as process:
            for line in process.stdout:
                match = pattern.search(line)
                if match:
                    last_line_at[int(match.group(1))] = time.perf_counter()
        if process.returncode:
            raise SystemExit(f"pmixer's main.py failed with exit status {process.returncode}")
    # epoch 1 has no start mark (it begins with pmixer's start-up): it is the warm-up, left out
    return [last_line_at[epoch] - last_line_at[epoch - 1]
            for epoch in sorted(last_line_at) if epoch - 1 in last_line_at]


MATMULS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")


def operator_shares(row: Row, steps: int = 2, top: int = 8) -> str:
    """Where one implementation's step time goes: torch.profiler's self CPU time per operator, as shares."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for index in range(steps):
            row.step(torch.as_tensor(row.batches[index % len(row.batches)], dtype=torch.long)).item()
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMULS) / total
    rng = sum(e.self_cpu_time_total for e in events if e.key in ("aten::bernoulli_", "aten::uniform_")) / total
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    listing = ", ".join(f"{e.key[6:]} {100 * e.self_cpu_time_total / total:.0f}%" for e in ranked)
    return (f"{row.label}: matrix products {100 * matmul:.0f}%, dropout random numbers {100 * rng:.0f}%, "
            f"everything else (elementwise, softmax, copies) {100 * (1 - matmul - rng):.0f}% of operator time; "
            f"top: {listing}")


class QualityReached(Exception):
    pass


def time_to_quality(data: TrialData, threads: int, budget_s: float, device: torch.device = CPU,
                    precision: str = "fp32") -> tuple[float | None, float, int]:
    """(wall seconds when the reported test NDCG@10 first reaches the target or None, best test NDCG@10, epochs)."""
    reports: list[EpochReport] = []

    def watch(report: EpochReport) -> None:
        reports.append(report)
        if report.best_test.get("ndcg@10", 0.0) >= TARGET_NDCG:
            raise QualityReached

    try:
        run_trial("sasrec", data, {"num_threads": threads, "time_budget_s": budget_s, "measure_efficiency": False,
                                   "device": str(device), "precision": precision}, callback=watch)
    except QualityReached:
        return reports[-1].wall_time_s, reports[-1].best_test["ndcg@10"], len(reports)
    best = max((r.best_test.get("ndcg@10", 0.0) for r in reports), default=float("nan"))
    return None, best, len(reports)


def load_text() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def prepared_recipe(dataset: str, source: str | None, max_len: int) -> Path:
    """``dataset`` prepared with windows of ``max_len`` items, in ``$SEQREC_DATA`` if set, else in a private cache,
    so that a benchmark writes nowhere else."""
    from study.data import prepare

    if "SEQREC_DATA" not in os.environ:
        os.environ["SEQREC_DATA"] = tempfile.mkdtemp(prefix="seqrec-bench-")
    return prepare(dataset, source=source, max_len=max_len, progress=False)


def prepared_ml100k(args: argparse.Namespace) -> Path:
    return prepared_recipe("ml-100k", args.source, max(args.max_len, 200))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed", description=__doc__.split("\n")[0])
    parser.add_argument("--source", help="ml-100k source (folder with ml-100k.inter or u.data); default: download")
    parser.add_argument("--max-len", type=int, default=200)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", type=torch.device, default=CPU,
                        help="cpu (default) or cuda: on cuda a bf16-autocast row of ours is added")
    parser.add_argument("--rounds", type=int, default=3, help="timed epochs per row after one warm-up epoch")
    parser.add_argument("--steps", type=int, default=0, help="time this many steps per round (0 = a whole epoch)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pmixer", type=Path, help="a local checkout of pmixer/SASRec.pytorch to time beside ours")
    parser.add_argument("--pmixer-epochs", type=int, default=4, help="pmixer epochs timed after its warm-up epoch")
    parser.add_argument("--compile", action="store_true", help="also time ours under torch.compile")
    parser.add_argument("--time-to-quality", action="store_true",
                        help=f"also measure the wall time to test NDCG@10 >= {TARGET_NDCG} with default settings")
    parser.add_argument("--ttq-budget", type=float, default=900.0)
    parser.add_argument("--before", action="store_true",
                        help="also time ours with the attention mask rebuilt in every layer, as before")
    parser.add_argument("--profile", action="store_true",
                        help="also print where each in-process row's step time goes, by operator")
    return parser


def timed_rows(data: TrialData, args: argparse.Namespace) -> tuple[list[Row], float | None]:
    """Every in-process row, warmed up and timed for ``args.rounds`` rounds; the compile time when asked for."""
    def row(label: str, made: tuple, steps: int = args.steps) -> Row:
        return Row(label, *made, data, args.batch_size, steps, args.seed, args.device)

    rows = [row("ours", our_step(data, args)), row("plain", plain_step(data, args)),
            row("ours, pmixer's config (bce, d=50, 1 head)", our_step(data, args, pmixer_config=True))]
    if args.device.type == "cuda":
        rows.insert(1, row("ours, bf16 autocast", our_step(data, args, precision="bf16")))
    if args.before:
        rows.insert(1, row("ours, before (one mask per layer)", before_step(data, args)))
    compile_s = None
    if args.compile:
        compiled = row("ours, compiled", our_step(data, args, compile_model=True), steps=1)
        start = time.perf_counter()
        compiled.run(record=False)  # the first step compiles
        compile_s = time.perf_counter() - start
        compiled.steps = args.steps or compiled.steps_per_epoch
        rows.append(compiled)
    for timed in rows:
        timed.run(record=False)  # warm-up: allocator, lazy initialisation, oneDNN primitive caches
    for round_index in range(args.rounds):
        for timed in rows:
            timed.run()
        print(f"round {round_index + 1}: " + ", ".join(f"{r.label} {r.times[-1]:.2f} s" for r in rows)
              + f"; {load_text()}", flush=True)
    return rows, compile_s


def print_table(rows: list[Row], pmixer_times: list[float] | None, peak: float) -> None:
    """The median epoch of each row, relative to ours, with its FLOP rate against the measured peak."""
    ours = statistics.median(rows[0].times)
    print("\n| implementation | s/epoch | relative to ours | GFLOP/step | GFLOP/s | % of peak |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        seconds = statistics.median(row.times)
        rate = row.gflop_per_step * row.steps_per_epoch / seconds
        print(f"| {row.label} | {seconds:.2f} | {seconds / ours:.2f}× | {row.gflop_per_step:.1f} | {rate:.1f} | "
              f"{100 * rate / peak:.1f} |")
    if pmixer_times:
        seconds = statistics.median(pmixer_times)
        like_pmixer = next(row for row in rows if "pmixer" in row.label)  # its matrix sizes are pmixer's
        pmixer_gflop = like_pmixer.gflop_per_step
        rate = pmixer_gflop * like_pmixer.steps_per_epoch / seconds
        print(f"| pmixer SASRec.pytorch (bce, d=50, 1 head) | {seconds:.2f} | {seconds / ours:.2f}× | "
              f"{pmixer_gflop:.1f} | {rate:.1f} | {100 * rate / peak:.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.profile and args.device.type != "cpu":
        parser.error("--profile reads CPU operator times: use it with --device cpu")

    data_path = prepared_ml100k(args)
    data = TrialData.from_prepared(data_path, args.max_len)
    torch.set_num_threads(args.threads)
    on_gpu = args.device.type == "cuda"
    where = torch.cuda.get_device_name(args.device) if on_gpu else f"{args.threads} threads"
    print(f"ml-100k: {len(data.train)} users, {data.num_items} items, L = {args.max_len}, dropout {args.dropout}, "
          f"{where}; {load_text()}", flush=True)
    peak = matmul_peak_gflops(args.threads, args.device)
    print(f"measured peak: {peak:.1f} GFLOP/s (fp32 matmul, {where})", flush=True)
    if on_gpu:
        print(f"measured bf16 peak: {matmul_peak_gflops(args.threads, args.device, torch.bfloat16):.1f} GFLOP/s",
              flush=True)
    rows, compile_s = timed_rows(data, args)

    pmixer_times = None
    if args.pmixer:
        pmixer_times = time_pmixer(args.pmixer, data_path, args)
        print(f"pmixer epochs: {', '.join(f'{t:.2f}' for t in pmixer_times)} s; {load_text()}", flush=True)

    # the roof as measured at the start and again now: on a shared machine the load moves in between, and the
    # larger of the two is the closer estimate of what this share of the CPU can do
    peak_after = matmul_peak_gflops(args.threads, args.device)
    print(f"measured peak again: {peak_after:.1f} GFLOP/s; {load_text()}", flush=True)
    print_table(rows, pmixer_times, max(peak, peak_after))
    if args.profile:
        print()
        for row in rows:
            if "compiled" not in row.label:
                print(operator_shares(row), flush=True)
    if compile_s is not None:
        print(f"\ntorch.compile: the first step took {compile_s:.1f} s (compilation included)")
    print(f"\n{load_text()}")

    if args.time_to_quality:
        seconds, best, epochs = time_to_quality(data if args.max_len == 200 else TrialData.from_prepared(
            data_path, 200), args.threads, args.ttq_budget, args.device)
        if seconds is None:
            print(f"time to quality: test NDCG@10 {best:.4f} < {TARGET_NDCG} after {epochs} epochs "
                  f"within {args.ttq_budget:.0f} s; {load_text()}")
        else:
            print(f"time to quality: test NDCG@10 {best:.4f} >= {TARGET_NDCG} after {seconds:.1f} s "
                  f"({epochs} epochs, defaults, {where}); {load_text()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
