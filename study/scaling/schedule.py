"""Executing a scaling study's cells on Ray: per-cell resources, in-flight supervision, and skipping the larger
lengths of a series after an OOM, timeout or crash.

Each cell is a Ray task running :func:`study.scaling.cells.run_cell`, which Ray pickles by reference: workers
import it from ``study.scaling.cells``, never from ``__main__``.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from study.errors import UserError
from study.scaling.cells import first_line, run_cell

if TYPE_CHECKING:
    from study.spec.scaling_file import ScalingStudy

STOPPING_STATUSES = ("oom", "timeout", "crashed")
STARTUP_GRACE_S = 180.0  # worker + interpreter start-up allowed on top of a cell's timeout before it is cancelled


def per_cell_resources(study: ScalingStudy, cluster: dict[str, float]) -> tuple[float, float, int]:
    """(CPUs, GPUs) per cell and how many cells run at once on this cluster; ``gpu: auto`` takes one if there is one."""
    cpu = float(study.resources["cpu"])
    gpu = study.resources["gpu"]
    cluster_gpus = float(cluster.get("GPU", 0))
    if gpu == "auto":
        gpu = 1.0 if cluster_gpus >= 1 else 0.0
    elif gpu > cluster_gpus:
        raise UserError(f"resources.gpu={gpu:g} per cell, but the Ray cluster has {cluster_gpus:g} GPU(s)")
    fits = [int(float(cluster.get("CPU", 1)) // cpu)]
    if gpu > 0:
        fits.append(int(cluster_gpus // gpu))
    concurrent = study.resources["max_concurrent"]
    limit = max(1, min(fits))
    return cpu, gpu, limit if concurrent == "auto" else min(int(concurrent), limit)


def _ray_failure(error: Exception) -> dict[str, Any]:
    import ray.exceptions as rex

    if isinstance(error, rex.OutOfMemoryError):
        return {"status": "oom", "error": "Ray's memory monitor killed the cell's worker (node memory nearly full)"}
    if isinstance(error, rex.TaskCancelledError):
        return {"status": "timeout", "error": "cancelled after its timeout plus start-up grace"}
    if isinstance(error, (rex.WorkerCrashedError, rex.NodeDiedError)):
        return {"status": "crashed", "error": first_line(error)}
    cause = getattr(error, "cause", None)
    return {"status": "failed", "error": first_line(cause if isinstance(cause, BaseException) else error)}


def execute(specs: list[dict[str, Any]], windows: dict[tuple[int, int], Any], *, cpu: float, gpu: float,
            max_concurrent: int, stop_after_failure: bool = True, progress: bool = False,
            on_row: Any = None) -> list[dict[str, Any]]:
    """Run cell specs as Ray tasks; returns one outcome per spec (``cell`` = its index), in order.

    A spec's ``series`` (model label, mode, batch) runs its lengths one after another in the order given, so
    that after an OOM, timeout or crash the larger lengths can be skipped rather than run. Different series
    run side by side, at most ``max_concurrent`` cells at a time. ``windows`` maps (length, batch_size) to the
    batch (an array or an ObjectRef to one).
    """
    import ray
    from tqdm.auto import tqdm

    # Workers are reused: every cell already measures in a fresh process of its own (run_cell), and one-shot
    # workers (max_calls=1) cost a Ray start-up per cell, make Ray prestart idle workers on a small machine, and
    # in Ray 2.60 abort at exit now and then ("Mutex corrupt", after the result is delivered). No retries: a
    # cell whose worker died is recorded as such, not silently measured again.
    task = ray.remote(run_cell).options(num_cpus=cpu, num_gpus=gpu, max_retries=0)
    queues: dict[tuple, deque] = {}
    for spec in specs:
        queues.setdefault(tuple(spec["series"]), deque()).append(spec)
    outcomes: dict[int, dict[str, Any]] = {}
    in_flight: dict[Any, tuple[dict[str, Any], float]] = {}
    busy: set[tuple] = set()
    bar = tqdm(total=len(specs), desc="cells", unit="cell", disable=not progress, file=sys.stderr)

    def finish(spec: dict[str, Any], outcome: dict[str, Any]) -> None:
        outcome = {"cell": spec["cell"], **outcome}
        outcomes[spec["cell"]] = outcome
        if on_row is not None:
            on_row(spec, outcome)
        bar.update(1)
        bar.set_postfix_str(f"{spec['label']} {spec['mode']} N={spec['length']}: {outcome['status']}")
        series = tuple(spec["series"])
        if stop_after_failure and outcome["status"] in STOPPING_STATUSES:
            while queues.get(series):
                skipped = queues[series].popleft()
                finish(skipped, {"status": "skipped", "error": f"skipped: {outcome['status']} at the smaller "
                                                               f"N={spec['length']}"})

    try:
        while any(queues.values()) or in_flight:
            for series, pending in queues.items():
                if len(in_flight) >= max_concurrent:
                    break
                if pending and series not in busy:
                    spec = pending.popleft()
                    ref = task.remote(spec, windows[(spec["length"], spec["batch_size"])])
                    in_flight[ref] = (spec, time.monotonic())
                    busy.add(series)
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            for ref in ready:
                spec, _ = in_flight.pop(ref)
                busy.discard(tuple(spec["series"]))
                try:
                    outcome = ray.get(ref)
                except Exception as error:  # a lost worker or a bug in the supervisor is still a data point
                    outcome = _ray_failure(error)
                finish(spec, outcome)
            now = time.monotonic()
            for ref, (spec, submitted) in list(in_flight.items()):
                if now - submitted > spec["timeout_s"] + STARTUP_GRACE_S:  # the supervisor itself is stuck
                    ray.cancel(ref, force=True)
                    in_flight.pop(ref)
                    busy.discard(tuple(spec["series"]))
                    finish(spec, {"status": "timeout", "error": f"cancelled: no answer within timeout_s + "
                                                                f"{STARTUP_GRACE_S:g} s of start-up grace"})
    finally:
        for ref in in_flight:
            ray.cancel(ref, force=True)
        bar.close()
    return [outcomes[spec["cell"]] for spec in specs if spec["cell"] in outcomes]
