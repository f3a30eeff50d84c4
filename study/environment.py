"""``environment.json``: what a study ran on, so its numbers can be read in context.

Versions (Python, torch, Ray, Optuna, numpy, pandas, pyarrow, triton), the code revision, the hardware
(CPU model and the instruction set torch's CPU kernels run, cores this process may use, memory, GPUs with their
memory and compute capability), the environment settings that change CPU timings or arithmetic, and the Ray
cluster's resources when a sweep runs on Ray.

The CPU kernels are recorded because they change results, not only speed: torch picks AVX2 or AVX-512 code for its
own elementwise maths, softmax and reductions, which round differently, and training can carry a last-bit
difference into another trajectory. A seeded run repeats to the last digit under the same kernels; under others it may
repeat only in distribution (over seeds).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "ray", "optuna", "numpy", "pandas", "pyarrow", "triton", "pyyaml", "scipy")
# ATEN_CPU_CAPABILITY caps the CPU kernels torch dispatches to (``avx2`` on an AVX-512 machine), so that a run can
# repeat one made elsewhere
RUN_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "ATEN_CPU_CAPABILITY", "CUDA_VISIBLE_DEVICES",
           "RAY_ADDRESS")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_kernels() -> str:
    """The instruction set torch's CPU kernels run here (``AVX2``, ``AVX512``, ``DEFAULT`` ...): see the module
    docstring for why results depend on it."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def cpu_text() -> str:
    """The CPU in one phrase for a benchmark's header line: its model and the kernels torch runs on it."""
    return f"{_cpu_model()}, torch CPU kernels {cpu_kernels()}"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        pass
    return None


def _git_revision(repo: Path) -> dict[str, Any]:
    """The commit and whether the working tree differs from it (read-only git queries)."""
    def git(*args: str) -> str | None:
        try:
            # --no-optional-locks: `git status` must not refresh (write) the index of someone's checkout
            done = subprocess.run(["git", "--no-optional-locks", "-C", str(repo), *args], capture_output=True,
                                  text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def _gpus() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append({"index": index, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 2),
                        "capability": f"{props.major}.{props.minor}"})
    return devices


def collect(ray_resources: dict[str, float] | None = None) -> dict[str, Any]:
    """A JSON-ready description of this machine and software; ``ray_resources`` from ``ray.cluster_resources()``."""
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = _gpus()
    return {
        "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()
                  if torch.cuda.is_available() else None, "threads": torch.get_num_threads()},
        "code": _git_revision(Path(__file__).resolve().parents[1]),
        "hardware": {
            "accelerator": "gpu" if gpus else "cpu",
            "cpu_model": _cpu_model(),
            "cpu_kernels": cpu_kernels(),
            "cpus_usable": cpus,
            "cpus_total": os.cpu_count(),
            "memory_gib": _memory_gib(),
            "gpus": gpus,
        },
        "env": {name: os.environ[name] for name in RUN_ENV if name in os.environ},
        "ray_cluster": dict(ray_resources) if ray_resources is not None else None,
    }
