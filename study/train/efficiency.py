"""Efficiency figures recorded with every trial: parameters, peak training memory, inference latency and energy.

Peak memory of one training step (forward + backward + optimizer step, optimizer state included):
- CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, in the trial process.
- CPU: measured in a **fresh spawned process**, because glibc keeps freed memory mapped and a
  long-lived process would reuse it without raising its peak. The child builds the model and one real
  batch, resets the kernel's resident-set high-water mark (``/proc/self/clear_refs`` ← 5), reads its
  current RSS as the baseline, runs the step, and reports ``VmHWM − baseline``. Where clear_refs is
  unavailable (non-Linux), it falls back to ``ru_maxrss − baseline`` and says so in the method string.
  This counts everything the step touches (activations, gradients, Adam moments, allocator slack),
  so it is an upper bound on what PyTorch itself asked for.

Inference energy is read from the device's own counter (:mod:`study.train.energy`) around the batch the latency is
measured on, served back to back for at least :data:`ENERGY_WINDOW_S`; training energy per epoch is the trainer's.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

import numpy as np
import torch

from models import SeqRecModel
from study.train import energy
from study.train.batches import epoch_windows, user_batches
from study.train.config import TrainConfig
from study.train.objectives import resolve_auto_settings, resolve_objective
from study.train.padding import trim_padding, trims_padding
from study.train.trial_data import TrialData

CUDA_METHOD = "cuda max_memory_allocated, one training step"
CPU_METHOD = "fresh process VmHWM - baseline RSS, one training step"
CPU_FALLBACK_METHOD = "fresh process ru_maxrss - baseline RSS, one training step (no clear_refs)"
ENERGY_WINDOW_S = 1.0  # the shortest window inference energy is read over (see study.train.energy.window_j)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def _rss_kib() -> int:
    if os.path.exists("/proc/self/status"):
        return _status_kib("VmRSS")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)


def measure_peak_mb(run: Callable[[], object], device: torch.device) -> tuple[float, bool]:
    """Peak memory (MiB) that ``run()`` adds to this process, and whether it was measured exactly.

    CUDA: the allocator peak above what was allocated before. CPU: VmHWM - baseline RSS after resetting the
    high-water mark; ``False`` means the ``ru_maxrss`` fallback (no clear_refs). On a CPU the figure is only
    right in a fresh process (see the module docstring), which the caller provides: the spawned child below,
    or the scaling study's one-process-per-cell measurement.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20, True
    exact = _reset_peak_rss()
    baseline = _rss_kib()
    run()
    if exact:
        peak = _status_kib("VmHWM")
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)
    return (peak - baseline) / 1024.0, exact


def _cpu_step_child(model_name: str, model_hparams: dict, train_settings: dict, windows: np.ndarray,
                    num_threads: int, queue: multiprocessing.Queue, users: np.ndarray | None = None) -> None:
    try:
        torch.set_num_threads(max(1, num_threads))
        from study.train.step import build_step  # imported here: the child starts from a fresh interpreter

        step = build_step(model_name, model_hparams, train_settings, torch.device("cpu"))
        batch = torch.as_tensor(windows, dtype=torch.long)
        batch_users = None if users is None else torch.as_tensor(users, dtype=torch.long)
        peak_mb, exact = measure_peak_mb(lambda: step(batch, users=batch_users), torch.device("cpu"))
        queue.put((peak_mb, CPU_METHOD if exact else CPU_FALLBACK_METHOD, None))
    except Exception as error:  # reported to the parent, which records it with the trial
        queue.put((float("nan"), CPU_METHOD, f"{type(error).__name__}: {error}"))


def peak_train_memory_mb(model_name: str, model_hparams: dict, train_settings: dict, windows: np.ndarray,
                         device: torch.device, *, num_threads: int = 1, timeout_s: float = 300.0,
                         users: np.ndarray | None = None) -> tuple[float, str]:
    """Peak memory (MiB) of one training step on ``windows`` (B, L + 1), and how it was measured.

    ``users`` (B,): the windows' user ids, for models that read them (``needs_users``)."""
    if device.type == "cuda":
        from study.train.step import build_step

        step = build_step(model_name, model_hparams, train_settings, device)
        batch = torch.as_tensor(windows, dtype=torch.long, device=device)
        batch_users = None if users is None else torch.as_tensor(users, dtype=torch.long, device=device)
        return measure_peak_mb(lambda: step(batch, users=batch_users), device)[0], CUDA_METHOD
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_cpu_step_child,
                            args=(model_name, model_hparams, train_settings, windows, num_threads, queue, users))
    child.start()
    try:
        peak_mb, method, error = queue.get(timeout=timeout_s)
    except Exception:
        child.kill()
        raise RuntimeError(f"peak-memory child gave no answer within {timeout_s:.0f} s") from None
    finally:
        child.join(timeout=30)
    if error:
        raise RuntimeError(f"peak-memory child failed: {error}")
    return peak_mb, method


def _server(model: SeqRecModel, inputs: np.ndarray, device: torch.device, batch_users: int, top_k: int,
            users: np.ndarray | None, trim: bool) -> tuple[Callable[[], None], int]:
    """A function serving one batch of real users' inputs (the top-k of all items, finished on the device), and
    how many users it serves. ``trim`` serves the batch without its all-padding leading columns, as the evaluator
    does (:mod:`study.train.padding`)."""
    batch = inputs[:batch_users]
    batch = torch.as_tensor(trim_padding(batch) if trim else batch, dtype=torch.long, device=device)
    # the trainer passes each row's user for models that read user ids (FPMC); without them FPMC serves its
    # Markov-chain term, whose cost is the same up to one (B, d) lookup
    user_kwargs = {} if users is None else model.user_inputs(torch.as_tensor(users[:batch_users], device=device))

    def serve() -> None:
        scores = model.last_hidden(batch, **user_kwargs) @ model.item_weights().T
        scores[:, 0] = float("-inf")
        scores.topk(min(top_k, scores.shape[1] - 1), dim=1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return serve, len(batch)


@torch.no_grad()
def inference_latency_ms(model: SeqRecModel, inputs: np.ndarray, device: torch.device, *, batch_users: int = 256,
                         warmup: int = 3, repeats: int = 20, top_k: int = 20,
                         users: np.ndarray | None = None, trim: bool = True) -> tuple[float, float]:
    """p50 and p95 milliseconds to recommend the top-k of all items for one batch of users.

    The batch is real users' inputs; timing covers the encoder, the full scoring matmul and top-k,
    i.e. what serving one batch costs. ``trim`` serves the batch without its all-padding leading columns, as the
    evaluator does (:mod:`study.train.padding`).
    """
    was_training = model.training
    model.eval()
    serve, _ = _server(model, inputs, device, batch_users, top_k, users, trim)
    timings = []
    for i in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        serve()
        if i >= warmup:
            timings.append((time.perf_counter() - start) * 1000.0)
    model.train(was_training)
    return float(np.percentile(timings, 50)), float(np.percentile(timings, 95))


@torch.no_grad()
def inference_energy_j_per_1k(model: SeqRecModel, inputs: np.ndarray, device: torch.device,
                              counter: energy.EnergyCounter | None, *, batch_users: int = 256, repeats: int = 20,
                              min_seconds: float = ENERGY_WINDOW_S, top_k: int = 20,
                              users: np.ndarray | None = None, trim: bool = True) -> float:
    """Joules the device uses to serve 1,000 users: the batch :func:`inference_latency_ms` times, served back to
    back for at least ``repeats`` batches and ``min_seconds``, the energy of that window per user × 1,000. Run right
    after the latency measurement (the model is warm). NaN without a counter."""
    if counter is None:
        return float("nan")
    was_training = model.training
    model.eval()
    serve, served = _server(model, inputs, device, batch_users, top_k, users, trim)
    joules = energy.window_j(counter, serve, device, min_runs=repeats, min_seconds=min_seconds)
    model.train(was_training)
    return joules / served * 1000.0


def efficiency_figures(model_name: str, model_hparams: dict, train_cfg: TrainConfig, data: TrialData,
                       model: SeqRecModel, device: torch.device,
                       counter: energy.EnergyCounter | None = None) -> dict:
    """The figures measured once per trial: peak memory of one training step, inference latency and, with a
    ``counter``, inference energy per 1,000 users (NaN without one)."""
    windows = user_batches(data.train, train_cfg.batch_size, np.random.default_rng(0))
    objective = resolve_objective(model, train_cfg.objective)
    train_cfg = resolve_auto_settings(train_cfg, objective, model.config.max_len, model_name)
    settings = {**asdict(train_cfg), "objective": objective}
    # the memory of a full first batch: scoring fewer targets of a window does not shrink its activations
    batch, users, _ = next(epoch_windows(data, windows, objective, train_cfg, np.random.default_rng(0)))
    try:
        threads = train_cfg.num_threads or torch.get_num_threads()
        peak_mb, method = peak_train_memory_mb(model_name, model_hparams, settings, batch, device,
                                               num_threads=threads, users=users)
    except RuntimeError as error:
        peak_mb, method = float("nan"), f"failed: {error}"
    test_users = np.arange(len(data.test.inputs)) if model.needs_users else None  # split rows are users 0..U-1
    trim = trims_padding(train_cfg.trim_padding, device, train_cfg.compile)
    p50, p95 = inference_latency_ms(model, data.test.inputs, device, users=test_users, trim=trim)
    infer_j = inference_energy_j_per_1k(model, data.test.inputs, device, counter, users=test_users, trim=trim)
    return {"peak_mem_mb": peak_mb, "peak_mem_method": method, "infer_ms_p50": p50, "infer_ms_p95": p95,
            "infer_energy_j_per_1k": infer_j}
