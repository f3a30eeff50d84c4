"""Energy counters: the joules a device used over a measured window, read from the device's own counter.

- **NVIDIA GPU**: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``: millijoules since the
  driver loaded, Volta and newer), through NVIDIA's own bindings ``nvidia-ml-py`` (module ``pynvml``). The GPU is
  found by the UUID torch gives for its device, so ``CUDA_VISIBLE_DEVICES`` (which Ray sets per trial) is honoured;
  NVML itself numbers every GPU of the machine.
- **CPU**: RAPL, read from the kernel's powercap sysfs (``/sys/class/powercap/intel-rapl:N/energy_uj``, also used
  for AMD's RAPL). Only the *package* domains are summed (one per socket: cores and uncore); their sub-domains
  (``intel-rapl:N:M``: core, uncore, DRAM) are parts of the package and would count twice, and ``psys`` and the
  ``intel-rapl-mmio`` copy of the package are left out for the same reason. The counter wraps at
  ``max_energy_range_uj``, which a busy package reaches in tens of minutes: a wrap between two reads is undone, and
  a thread reads every :data:`RAPL_POLL_S` seconds so that a long window never holds two wraps.
- **Neither** (no NVML device with the counter, no readable RAPL: e.g. a container without powercap, or a kernel
  that makes ``energy_uj`` root-only, as Linux does since 5.10): no counter, so no number (NaN) and
  ``energy_method: unavailable``. A figure is never estimated from a nominal TDP.

Why no library for the whole job: CodeCarbon and similar trackers fall back to TDP estimates where no counter
exists, and add a CO2 model and a process of their own. NVML is read through NVIDIA's maintained bindings; RAPL is two
sysfs files per socket, which no binding would make simpler.

Both counters measure the whole device: another process on the same GPU or CPU package (a concurrent trial, another
user's job) is counted too, and so is the device's idle power over the window.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Protocol

import torch

METHOD_NVML = "nvml"
METHOD_RAPL = "rapl"
UNAVAILABLE = "unavailable"
POWERCAP = Path("/sys/class/powercap")
RAPL_POLL_S = 60.0  # well under one wrap of the counter (262 kJ: over 10 minutes even at 400 W)


class EnergyCounter(Protocol):
    """A device's cumulative energy: ``read_j`` only ever grows; what a window used is the difference of two reads."""

    method: str

    def read_j(self) -> float: ...


# ---------------------------------------------------------------------------------------------------------------
# NVML


class NvmlCounter:
    method = METHOD_NVML

    def __init__(self, nvml: ModuleType, handle: object):
        self._nvml, self._handle = nvml, handle

    def read_j(self) -> float:
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0


def _nvml_handle(nvml: ModuleType, device: torch.device) -> object:
    """The NVML handle of torch's ``device``: by the UUID torch reports once CUDA is up, else by
    ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs), which maps torch's numbering onto NVML's."""
    index = device.index or 0
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible):
        if not visible[index].isdigit():
            return nvml.nvmlDeviceGetHandleByUUID(visible[index])
        index = int(visible[index])
    return nvml.nvmlDeviceGetHandleByIndex(index)


def _open_nvml(device: torch.device) -> tuple[NvmlCounter | None, str]:
    try:
        import pynvml
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
        counter = NvmlCounter(pynvml, _nvml_handle(pynvml, device))
        counter.read_j()  # NOT_SUPPORTED here on GPUs older than Volta and on MIG slices
    except Exception as error:  # NVMLError and its many subclasses, or a device torch cannot describe
        return None, f"no NVML energy counter for {device} ({type(error).__name__}: {error})"
    return counter, ""


# ---------------------------------------------------------------------------------------------------------------
# RAPL


class RaplCounter:
    """The summed package domains of RAPL, each wrap of a domain's counter undone."""

    method = METHOD_RAPL

    def __init__(self, domains: Sequence[Path], poll_s: float | None = RAPL_POLL_S):
        self._files = [domain / "energy_uj" for domain in domains]
        self._ranges = [int((domain / "max_energy_range_uj").read_text()) for domain in domains]
        self._lock = threading.Lock()
        self._last = [int(path.read_text()) for path in self._files]
        self._total_uj = 0
        if poll_s:
            # holds the counter weakly: the thread ends once the counter is gone
            threading.Thread(target=_poll, args=(weakref.ref(self), poll_s), daemon=True,
                             name="rapl-poll").start()

    def read_j(self) -> float:
        with self._lock:
            for i, path in enumerate(self._files):
                raw = int(path.read_text())
                delta = raw - self._last[i]
                if delta < 0:  # wrapped once since the last read (the poll makes sure it was only once)
                    delta += self._ranges[i]
                self._last[i] = raw
                self._total_uj += delta
            return self._total_uj / 1e6


def _poll(counter_ref: weakref.ref, poll_s: float) -> None:
    while True:
        time.sleep(poll_s)
        counter = counter_ref()
        if counter is None:
            return
        try:
            counter.read_j()
        except (OSError, ValueError):
            return
        del counter


def rapl_packages(powercap: Path = POWERCAP) -> list[Path]:
    """The package domains (``intel-rapl:N`` named ``package-N``), not their sub-domains nor ``psys``."""
    domains = []
    for domain in sorted(powercap.glob("intel-rapl:*")):
        if domain.name.count(":") != 1:  # intel-rapl:N:M is a part of package N
            continue
        try:
            name = (domain / "name").read_text().strip()
        except OSError:
            continue
        if name.startswith("package"):
            domains.append(domain)
    return domains


def _open_rapl(powercap: Path, poll_s: float | None) -> tuple[RaplCounter | None, str]:
    domains = rapl_packages(powercap)
    if not domains:
        return None, f"no RAPL package domain under {powercap}"
    try:
        return RaplCounter(domains, poll_s), ""
    except PermissionError:
        return None, f"RAPL's energy_uj under {powercap} is readable by root only (Linux 5.10 and later)"
    except (OSError, ValueError) as error:
        return None, f"RAPL under {powercap} is not readable ({type(error).__name__}: {error})"


# ---------------------------------------------------------------------------------------------------------------
# The interface the trainer and the studies use


def probe(device: torch.device | str, *, powercap: Path | None = None,
          poll_s: float | None = RAPL_POLL_S) -> tuple[EnergyCounter | None, str]:
    """The counter of ``device`` and ``""``, or ``None`` and why there is none. ``powercap``: where RAPL's sysfs
    tree is (default :data:`POWERCAP`); ``poll_s``: see :data:`RAPL_POLL_S` (``None``: no polling thread)."""
    device = torch.device(device)
    if device.type == "cuda":
        return _open_nvml(device)
    if device.type == "cpu":
        return _open_rapl(Path(powercap or POWERCAP), poll_s)
    return None, f"no energy counter is read for {device.type} devices"


def open_counter(device: torch.device | str) -> EnergyCounter | None:
    """The energy counter of ``device`` (NVML on an NVIDIA GPU, RAPL on a CPU), or ``None`` where there is none."""
    return probe(device)[0]


def method_of(counter: EnergyCounter | None) -> str:
    """The row's ``energy_method``: the counter's, or ``unavailable``."""
    return counter.method if counter is not None else UNAVAILABLE


def read_j(counter: EnergyCounter | None, device: torch.device) -> float:
    """The counter now, after the device's queued work (CUDA runs asynchronously); NaN without a counter, and NaN
    when a read fails mid-run (the window then has no figure rather than the trial failing)."""
    if counter is None:
        return float("nan")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    try:
        return float(counter.read_j())
    except Exception:  # NVMLError, OSError: a driver or sysfs hiccup must not end the trial
        return float("nan")


def window_j(counter: EnergyCounter | None, run: Callable[[], object], device: torch.device, *, min_runs: int,
             min_seconds: float, deadline: float | None = None) -> float:
    """Joules per call of ``run()``, over a window of at least ``min_runs`` calls lasting at least ``min_seconds``
    (NVML's counter advances in steps of tens of milliseconds, so a shorter window reads mostly its steps), cut
    short, after one call, where another would end past ``deadline`` (``time.monotonic``). ``run`` finishes its work
    on the device before it returns. NaN without a counter."""
    if counter is None:
        return float("nan")
    runs, last_s, started, before = 0, 0.0, time.perf_counter(), read_j(counter, device)
    while runs < min_runs or time.perf_counter() - started < min_seconds:
        if runs and deadline is not None and time.monotonic() + last_s > deadline:
            break
        begin = time.perf_counter()
        run()
        runs, last_s = runs + 1, time.perf_counter() - begin
    return (read_j(counter, device) - before) / runs


def median_j(values: Sequence[float]) -> float:
    """The median of the measured values (NaN ones left out: epochs without a counter), NaN when none is."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(statistics.median(finite)) if finite else float("nan")
