"""Energy counters (study.train.energy): RAPL on a sysfs tree made in tmp_path, NVML through a stand-in pynvml
module, the windows the trainer and the latency probe read them over, and the epoch each joule is booked to."""

from __future__ import annotations

import math
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import models
from study.train import efficiency, energy
from study.train import trainer as trainer_module
from study.train.step import TrainStep
from study.train.trainer import run_trial

# bce: a step scores a few items, not the whole catalogue (a full softmax step takes a second on a loaded CPU)
QUICK = {"max_epochs": 2, "batch_size": 256, "measure_efficiency": False, "num_threads": 1, "max_len": 20,
         "hidden_size": 8, "num_layers": 1, "num_heads": 1, "inner_size": 16, "objective": "bce"}


def _domain(root: Path, folder: str, name: str, energy_uj: int, range_uj: int = 10_000) -> Path:
    domain = root / folder
    domain.mkdir(parents=True)
    (domain / "name").write_text(name + "\n")
    (domain / "energy_uj").write_text(f"{energy_uj}\n")
    (domain / "max_energy_range_uj").write_text(f"{range_uj}\n")
    return domain


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    """Two packages, their sub-domains, a platform (psys) domain and the MMIO copy of package 0."""
    root = tmp_path / "powercap"
    _domain(root, "intel-rapl:0", "package-0", 1_000)
    _domain(root, "intel-rapl:0:0", "core", 500)
    _domain(root, "intel-rapl:0:1", "dram", 200)
    _domain(root, "intel-rapl:1", "package-1", 5_000)
    _domain(root, "intel-rapl:2", "psys", 7_000)
    _domain(root, "intel-rapl-mmio:0", "package-0", 1_000)
    return root


def _set(root: Path, folder: str, energy_uj: int) -> None:
    (root / folder / "energy_uj").write_text(f"{energy_uj}\n")


def test_rapl_sums_the_package_domains_only_and_undoes_a_wrap(powercap: Path) -> None:
    assert [d.name for d in energy.rapl_packages(powercap)] == ["intel-rapl:0", "intel-rapl:1"]
    counter, why = energy.probe("cpu", powercap=powercap, poll_s=None)
    assert why == "" and counter is not None and energy.method_of(counter) == "rapl"
    assert counter.read_j() == 0.0
    _set(powercap, "intel-rapl:0", 3_000)  # +2,000 uJ
    _set(powercap, "intel-rapl:1", 1_000)  # wrapped at 10,000: +6,000 uJ
    for part, value in (("intel-rapl:0:0", 900_000), ("intel-rapl:2", 9_000), ("intel-rapl-mmio:0", 9_999)):
        _set(powercap, part, value)  # parts of a package, the platform and the package's copy: not counted again
    assert counter.read_j() == pytest.approx(0.008)
    _set(powercap, "intel-rapl:1", 4_000)
    assert counter.read_j() == pytest.approx(0.011)


def test_no_readable_rapl_means_no_counter_and_says_why(tmp_path: Path) -> None:
    counter, why = energy.probe("cpu", powercap=tmp_path / "absent", poll_s=None)
    assert counter is None and "no RAPL package domain" in why
    assert energy.method_of(counter) == "unavailable"
    _domain(tmp_path / "broken", "intel-rapl:0", "package-0", 0)
    (tmp_path / "broken" / "intel-rapl:0" / "energy_uj").write_text("not a number\n")
    counter, why = energy.probe("cpu", powercap=tmp_path / "broken", poll_s=None)
    assert counter is None and "not readable" in why
    assert math.isnan(energy.read_j(None, torch.device("cpu")))


def _fake_pynvml(energy_mj: dict, *, supported: bool = True) -> types.ModuleType:
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def total_energy(handle: tuple) -> int:
        if not supported:
            raise NVMLError("Not Supported")
        return energy_mj[handle]

    module.NVMLError = NVMLError
    module.nvmlInit = lambda: None
    module.nvmlDeviceGetHandleByIndex = lambda index: ("index", index)
    module.nvmlDeviceGetHandleByUUID = lambda uuid: ("uuid", uuid)
    module.nvmlDeviceGetTotalEnergyConsumption = total_energy
    return module


@pytest.fixture
def cuda_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before CUDA starts (the sweep's driver), the GPU is found through CUDA_VISIBLE_DEVICES."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)


def test_nvml_reads_the_gpu_torch_numbers_in_joules(monkeypatch: pytest.MonkeyPatch, cuda_not_started: None) -> None:
    meter = {("index", 5): 1_000_000}
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(meter))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")  # what Ray sets: torch's cuda:1 is NVML's GPU 5
    counter, why = energy.probe("cuda:1")
    assert why == "" and energy.method_of(counter) == "nvml"
    assert counter.read_j() == pytest.approx(1000.0)
    meter[("index", 5)] += 2_500
    assert counter.read_j() == pytest.approx(1002.5)

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml({("uuid", "GPU-bbbb"): 42}))
    assert energy.open_counter("cuda:1").read_j() == pytest.approx(0.042)


def test_a_gpu_without_the_counter_or_without_pynvml_is_unavailable(monkeypatch: pytest.MonkeyPatch,
                                                                   cuda_not_started: None) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml({}, supported=False))
    counter, why = energy.probe("cuda")
    assert counter is None and "Not Supported" in why  # e.g. a pre-Volta GPU or a MIG slice
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml then fails
    counter, why = energy.probe("cuda")
    assert counter is None and "not installed" in why


class Meter:
    """A stand-in energy counter: whatever the test adds to ``joules``."""

    method = "fake"

    def __init__(self) -> None:
        self.joules = 0.0

    def read_j(self) -> float:
        return self.joules


def test_a_window_is_per_run_at_least_min_runs_long_and_stops_at_its_deadline() -> None:
    meter, runs = Meter(), []

    def run() -> None:
        runs.append(1)
        meter.joules += 2.0

    cpu = torch.device("cpu")
    assert energy.window_j(meter, run, cpu, min_runs=5, min_seconds=0.0) == pytest.approx(2.0) and len(runs) == 5
    assert energy.window_j(meter, run, cpu, min_runs=5, min_seconds=0.0, deadline=time.monotonic() - 1) == 2.0
    assert len(runs) == 6  # past the deadline: one run, not five
    assert math.isnan(energy.window_j(None, run, cpu, min_runs=5, min_seconds=0.0))
    assert energy.median_j([3.0, float("nan"), 1.0, 2.0]) == 2.0 and math.isnan(energy.median_j([float("nan")]))


def test_inference_energy_is_per_thousand_users_served() -> None:
    model = models.build("sasrec", num_items=50, max_len=10, hidden_size=8, num_layers=1, num_heads=1, inner_size=16)
    meter, weights = Meter(), model.item_weights

    def counted_weights() -> torch.Tensor:  # one call per batch served
        meter.joules += 5.0
        return weights()

    model.item_weights = counted_weights
    inputs = np.random.default_rng(0).integers(1, 50, size=(300, 10))
    per_1k = efficiency.inference_energy_j_per_1k(model, inputs, torch.device("cpu"), meter, repeats=4,
                                                  min_seconds=0.0)
    assert per_1k == pytest.approx(5.0 / 256 * 1000)  # 5 J for a batch of 256 users
    assert math.isnan(efficiency.inference_energy_j_per_1k(model, inputs, torch.device("cpu"), None))


def test_each_epoch_gets_the_energy_of_its_own_training_steps(synthetic_lastfm_prepared: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Epoch 2's steps cost 100 J each, epoch 1's 1 J, and every evaluation 1000 J: each report holds its own
    epoch's training steps and nothing of the evaluations between them."""
    meter, per_step, steps = Meter(), [1.0], [0]
    train_step, ranks = TrainStep.__call__, trainer_module.target_ranks

    def counted_step(self, *args, **kwargs):
        meter.joules += per_step[0]
        steps[-1] += 1
        return train_step(self, *args, **kwargs)

    def counted_ranks(*args, **kwargs):
        meter.joules += 1000.0
        return ranks(*args, **kwargs)

    monkeypatch.setattr(TrainStep, "__call__", counted_step)
    monkeypatch.setattr(trainer_module, "target_ranks", counted_ranks)
    monkeypatch.setattr(energy, "open_counter", lambda device: meter)
    reports = []

    def next_epoch(report) -> None:
        reports.append(report)
        per_step[0] = 100.0
        steps.append(0)

    row = run_trial("sasrec", synthetic_lastfm_prepared, QUICK, callback=next_epoch)
    first, second = steps[:2]
    assert first > 0 and first == second
    assert [r.train_energy_j for r in reports] == [first * 1.0, second * 100.0]
    assert reports[1].flat()["train_energy_j"] == second * 100.0
    assert reports[1].snapshot().train_energies == [first * 1.0, second * 100.0]  # a resumed trial keeps them
    assert row["energy_method"] == "fake"
    assert row["train_energy_j_per_epoch"] == pytest.approx((first + 100.0 * second) / 2)  # the median


def test_a_row_without_a_counter_says_unavailable(synthetic_lastfm_prepared: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(energy, "POWERCAP", tmp_path / "no-powercap")
    reports = []
    row = run_trial("sasrec", synthetic_lastfm_prepared, {**QUICK, "max_epochs": 1}, callback=reports.append)
    assert row["energy_method"] == "unavailable" and math.isnan(row["train_energy_j_per_epoch"])
    assert math.isnan(reports[0].train_energy_j)
