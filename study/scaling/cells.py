"""One cell of a scaling study: its batch of real histories, and its measurement in a fresh, memory-capped process.

:func:`run_cell` (a Ray task, see :mod:`study.scaling.schedule`) starts ``python -c "from study.scaling.cells import
_child_main; ..."``, which runs the model once at N = 4 (one-time runtime set-up), builds the cell's model, records
the peak memory of its first run (:func:`study.train.efficiency.measure_peak_mb`: CUDA allocator peak, or VmHWM −
baseline RSS) under ``measure.memory_limit_mb`` (RLIMIT_DATA on a CPU, the allocator fraction on a GPU), then times
warm-up and repeated runs (median and p95), and, where the device has an energy counter (:mod:`study.train.energy`),
reads the joules of one run over a window of back-to-back runs. Both find these functions by this module's importable
path.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from study.errors import UserError
from study.spec.yaml_io import ConfigErrors, StudyConfigError, read_yaml

if TYPE_CHECKING:
    from study.spec.scaling_file import Cell, ScalingStudy

# torch and the model zoo are imported inside the functions that need them: Ray workers and the measuring process
# import this module first, and torch alone takes seconds to load.

# ---------------------------------------------------------------------------------------------------------------
# Real sequences: what every model of a cell sees


@dataclass
class RealBatch:
    windows: np.ndarray  # (B, N + 1) int64, real item ids, no padding
    users: np.ndarray  # (B,) the users whose histories fill the rows
    tiled_rows: int  # rows whose history was shorter than N + 1 and was repeated end to end
    description: str


def real_batch(history_indptr: np.ndarray, history_indices: np.ndarray, length: int, batch_size: int, *,
               seed: int, dataset_name: str = "the dataset") -> RealBatch:
    """``batch_size`` distinct users' chronological histories as full windows of ``length + 1`` real items.

    A row is a user's most recent ``length + 1`` items; a shorter history is tiled (repeated end to end, so the
    row still ends with the user's newest item). Every id is a real one and no position is padding, so every
    model pays for all N positions. The draw depends only on (seed, length, batch_size): every model of a
    study sees the same batch at a given cell.
    """
    indptr = np.asarray(history_indptr, dtype=np.int64)
    lengths = np.diff(indptr)
    candidates = np.flatnonzero(lengths > 0)
    if batch_size > len(candidates):
        raise UserError(f"batch {batch_size} needs that many distinct users; {dataset_name} has {len(candidates)}")
    rng = np.random.default_rng([seed, length, batch_size])
    users = np.sort(rng.choice(candidates, size=batch_size, replace=False))
    width = length + 1
    windows = np.empty((batch_size, width), dtype=np.int64)
    tiled = 0
    for row, user in enumerate(users):
        history = np.asarray(history_indices[indptr[user]:indptr[user + 1]], dtype=np.int64)
        if len(history) < width:
            history = np.tile(history, -(-width // len(history)))
            tiled += 1
        windows[row] = history[-width:]
    how = (f"{tiled} of {batch_size} histories shorter than {width} items tiled (repeated end to end)" if tiled
           else f"each row a user's most recent {width} items, none tiled")
    description = f"{dataset_name}: {batch_size} users' histories (seed {seed}); {how}"
    return RealBatch(windows=windows, users=users, tiled_rows=tiled, description=description)


def check_data(study: ScalingStudy, num_users: int, dataset_items: int) -> None:
    """Checks that need the prepared dataset: enough distinct users per batch, a catalogue that holds its ids."""
    errors = ConfigErrors(study.source, {}, set())
    if study.source is not None:
        _, errors.lines = read_yaml(study.source)
    name = study.dataset["name"]
    for index, batch in enumerate(study.batch_sizes):
        if batch > num_users:
            errors.add(("batch_sizes", index), f"cells with batch {batch}: a batch holds distinct users and "
                                               f"{name} has {num_users}")
    if study.tokens_per_batch:
        for length in study.lengths:
            batch = study.tokens_per_batch // length
            if batch > num_users:
                errors.add(("tokens_per_batch",), f"cells at N={length} get batch {batch}, but a batch holds "
                                                  f"distinct users and {name} has {num_users}")
    if study.num_items is not None and study.num_items < dataset_items:
        errors.add(("num_items",), f"{study.num_items} is fewer than the {dataset_items} items of {name}; "
                                   "num_items may only enlarge the catalogue (real ids must stay valid)")
    if errors.items:
        raise StudyConfigError(errors.items)


# ---------------------------------------------------------------------------------------------------------------
# One cell: a Ray task supervising a fresh, memory-capped measuring process


def _status_value(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _limit_memory(limit_mb: float | None, device: Any) -> tuple[str, Any]:
    """Cap what this process may allocate from now on, so that a cell too big for the budget fails with an
    allocation error (recorded as OOM) instead of pushing the machine into swap or the kernel's OOM killer.

    Called once the model is built, right before the measured runs: the cap bounds what ``peak_mem_mb``
    measures. Returns (description, undo).
    """
    if not limit_mb:
        return "none", None
    import torch

    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        allowed = torch.cuda.memory_allocated(device) + limit_mb * 2**20
        torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total), device)
        return (f"{limit_mb:g} MiB above the built model (CUDA allocator fraction)",
                lambda: torch.cuda.set_per_process_memory_fraction(1.0, device))
    data_kib = _status_value("VmData")
    if data_kib is None:
        return "not enforced (no /proc/self/status)", None
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = data_kib * 1024 + int(limit_mb * 2**20)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    return (f"{limit_mb:g} MiB above the built model (RLIMIT_DATA)",
            lambda: resource.setrlimit(resource.RLIMIT_DATA, (soft, hard)))


def _is_oom(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        marker in text for marker in ("out of memory", "can't allocate memory", "cannot allocate memory",
                                      "not enough memory"))


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``, as a cell's ``error`` column records it (also for Ray's errors)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


PREWARM_LENGTH = 4  # the tiny twin's window: every op of the model runs, at a negligible size


def _cell_runner(spec: dict[str, Any], windows: np.ndarray, length: int) -> Any:
    """A fresh model for ``spec`` at window ``length``, and a function that runs one training step or serves
    one batch on the end of ``windows`` and returns its milliseconds."""
    import torch

    import models
    from study.train import efficiency
    from study.train.step import build_step

    device = torch.device(spec["device"])
    hparams = {**spec["config"], "num_items": spec["num_items"], "max_len": length}
    window = np.ascontiguousarray(windows[:, -(length + 1):])
    if spec["mode"] == "train":
        step = build_step(spec["model"], hparams, spec["train"], device)
        batch = torch.as_tensor(window, dtype=torch.long, device=device)

        def run() -> float:
            begin = time.perf_counter()
            step(batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return (time.perf_counter() - begin) * 1000.0

        return run
    model = models.build(spec["model"], **hparams).to(device)
    inputs = window[:, :-1]

    def serve() -> float:
        # one timed serving per call (the operation inference_latency_ms times), so the deadline can be checked
        return efficiency.inference_latency_ms(model, inputs, device, batch_users=len(inputs), warmup=0, repeats=1,
                                               top_k=spec["top_k"])[0]

    return serve


def _measure(spec: dict[str, Any], windows: np.ndarray) -> dict[str, Any]:
    """In this fresh process: warm the runtime up on a tiny twin, build the cell's model, record the peak memory
    of its first run (:func:`study.train.efficiency.measure_peak_mb`), then time warm-up and repeated runs."""
    import gc

    import torch

    import models
    from study.train import efficiency, energy
    from study.train.results import kernel_path

    started = time.monotonic()
    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    torch.manual_seed(spec["seed"])
    if spec.get("prewarm", True):
        # A fresh process's first step also pays one-time runtime set-up (kernel selection, allocator and
        # autograd structures: about 10-25 MB on a CPU) that does not depend on N; running the same model once
        # at a tiny length first keeps that constant out of the peak, so the growth with N is what is measured.
        twin = _cell_runner(spec, windows, min(PREWARM_LENGTH, spec["length"]))
        twin()
        del twin
        gc.collect()
    run = _cell_runner(spec, windows, spec["length"])
    limit, undo = _limit_memory(spec["memory_limit_mb"], device)
    try:
        peak_mb, exact = efficiency.measure_peak_mb(run, device)  # the first run is also the first warm-up
        for _ in range(spec["warmup"] - 1):
            run()
        timings: list[float] = []
        deadline = started + 0.8 * spec["timeout_s"]  # leave time to report before the supervisor gives up
        while len(timings) < spec["repeats"]:
            if timings and time.monotonic() + timings[-1] / 1000.0 > deadline:
                break
            timings.append(run())
        # the energy of one run: the counter's steps need a window of about a second (ENERGY_WINDOW_S), not one run
        counter = energy.open_counter(device)
        joules = energy.window_j(counter, run, device, min_runs=len(timings),
                                 min_seconds=efficiency.ENERGY_WINDOW_S, deadline=deadline)
    finally:
        if undo is not None:
            undo()
    what = "training step" if spec["mode"] == "train" else "inference batch"
    if device.type == "cuda":
        method = f"cuda max_memory_allocated, first {what}"
    else:
        method = f"fresh process {'VmHWM' if exact else 'ru_maxrss'} - baseline RSS, first {what}"
    if spec.get("prewarm", True):
        method += f" after a warm-up at N={min(PREWARM_LENGTH, spec['length'])}"
    # counted on a separate copy once everything is measured, so counting cannot touch the figures
    params = efficiency.count_parameters(models.build(spec["model"], **spec["config"], num_items=spec["num_items"],
                                                      max_len=spec["length"]))
    return {
        "status": "ok", "error": "", "peak_mem_mb": float(peak_mb), "mem_method": method,
        "time_ms_median": float(np.median(timings)), "time_ms_p95": float(np.percentile(timings, 95)),
        "time_ms_min": float(np.min(timings)), "runs": len(timings), "params": int(params),
        "energy_j_per_run": float(joules), "energy_method": energy.method_of(counter),
        "memory_limit": limit, "threads": torch.get_num_threads(),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "kernel_path": kernel_path(device),
    }


def _die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel kill this process when the Ray worker that spawned it dies (a cancelled cell),
    so no orphan keeps a core busy while other cells are being timed."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _restore_priority(target: int | None) -> int:
    """Bring this process back to the study's scheduling priority; returns the niceness it runs at.

    Ray starts its workers at niceness 15 and the measuring process inherits it: on a shared machine the timed
    runs would then wait behind every other job. Raising priority needs privileges; without them the cell
    runs as it is, and the row says so.
    """
    current = os.nice(0)
    if target is not None and current > target:
        try:
            return os.nice(target - current)
        except OSError:
            pass
    return current


def _child_main() -> None:
    """Entry point of the measuring process: (spec, windows, parent pid, result fd) pickled on stdin, the
    outcome pickled to the result fd. Every failure becomes an outcome: the supervisor must always hear back."""
    spec, windows, parent_pid, result_fd = pickle.load(sys.stdin.buffer)
    _die_with_parent(parent_pid)
    niceness = _restore_priority(spec.get("niceness"))
    try:
        outcome = _measure(spec, windows)
    except BaseException as error:
        outcome = {"status": "oom" if _is_oom(error) else "failed", "error": first_line(error)}
    outcome["niceness"] = niceness
    with os.fdopen(result_fd, "wb") as result:
        pickle.dump(outcome, result)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def run_cell(spec: dict[str, Any], windows: np.ndarray) -> dict[str, Any]:
    """Measure one cell in a fresh interpreter; never raises for a failing cell (its status says why).

    Runs as a Ray task. The measurement gets a fresh process of its own, rather than running in the Ray worker,
    because VmHWM must count nothing but this cell (a worker that ran earlier cells keeps their freed memory),
    and the memory cap (RLIMIT_DATA) must not apply to Ray's own threads. It is started with subprocess rather
    than multiprocessing, whose spawn would also start a resource-tracker process and re-run Ray's worker
    script in the child.
    """
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the measuring process imports study.scaling.cells
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    child = subprocess.Popen([sys.executable, "-c", "from study.scaling.cells import _child_main; _child_main()"],
                             stdin=subprocess.PIPE, pass_fds=(write_fd,), env=env)
    os.close(write_fd)  # the child holds the only writer now: its exit reads as end-of-file here
    try:
        child.stdin.write(pickle.dumps((spec, np.array(windows), os.getpid(), write_fd)))
        child.stdin.close()
        try:
            code = child.wait(timeout=spec["timeout_s"])
        except subprocess.TimeoutExpired:
            outcome = {"status": "timeout", "error": f"no result within measure.timeout_s={spec['timeout_s']:g} s"}
        else:
            payload = _read_all(read_fd)
            if payload:
                outcome = pickle.loads(payload)
            elif code == -signal.SIGKILL:
                outcome = {"status": "oom", "error": "the measuring process was killed by SIGKILL, most likely by "
                                                     "the kernel's out-of-memory killer"}
            else:
                outcome = {"status": "crashed", "error": f"the measuring process exited with code {code} before "
                                                         "reporting"}
    except BrokenPipeError:  # the child died before reading its input
        child.wait()
        outcome = {"status": "crashed", "error": f"the measuring process exited with code {child.returncode} "
                                                 "before reading the cell"}
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(read_fd)
    outcome.update(wall_s=time.monotonic() - started, node=socket.gethostname())
    return outcome


def cell_specs(study: ScalingStudy, cells: list[Cell], *, num_items: int, device: str,
               threads: int) -> list[dict[str, Any]]:
    """What each cell's measuring process needs, as plain data (it crosses Ray and a process boundary)."""
    specs = []
    for cell in cells:
        entry = study.entry(cell.label)
        specs.append({
            "cell": cell.index, "series": list(cell.series), "label": cell.label, "model": cell.model,
            "mode": cell.mode, "length": cell.length, "batch_size": cell.batch_size, "config": dict(entry.config),
            "train": dict(entry.train), "num_items": num_items, "device": device, "threads": threads,
            "seed": study.seed, "niceness": os.nice(0), **study.measure,
        })
    return specs
