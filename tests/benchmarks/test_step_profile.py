"""The step profiler: it profiles the trainer's own step, counts what that step dispatches, and its FLOP count
follows the step's size."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.profiler_util import FunctionEvent

from benchmarks.step_profile import build, device_kernels, main, profile_step, random_windows


def test_it_times_and_profiles_a_zoo_model_and_takes_trainer_and_model_keys(capsys: pytest.CaptureFixture) -> None:
    assert main(["sasrec", "--length", "8", "--batch", "4", "--items", "30", "--repeats", "2",
                 "--set", "hidden_size=16", "--set", "objective=last"]) == 0
    out = capsys.readouterr().out
    assert "sasrec step on CPU, 1 thread(s): B = 4, N = 8, 30 items, objective last, fp32" in out
    assert "step time: median" in out and "of 2 (min" in out
    dispatched = int(out.split("ATen operators dispatched: ")[1].split()[0])
    assert dispatched > 50  # forward, backward and Adam over two layers: far more than a handful of operators
    assert "aten::mm" in out  # the top-operator table


def test_a_bad_key_is_a_one_line_error(capsys: pytest.CaptureFixture) -> None:
    assert main(["sasrec", "--length", "8", "--batch", "4", "--items", "30", "--set", "hiden_size=16"]) == 2
    assert "hiden_size: unknown key for model sasrec" in capsys.readouterr().err


def test_the_matrix_product_flops_grow_with_the_batch() -> None:
    # every matrix product of SASRec's causal step (forward and backward; Adam has none) has the batch's positions
    # as one of its dimensions, so doubling the batch doubles the count
    step = build("sasrec", 8, 30, "cpu", {"hidden_size": "16", "objective": "causal"})
    _, small = profile_step(step, random_windows(4, 8, 30, "cpu"))
    _, large = profile_step(step, random_windows(8, 8, 30, "cpu"))
    assert small > 0
    assert large == pytest.approx(2 * small, rel=0.02)


def test_the_busy_time_counts_kernels_and_not_the_regions_spanning_them() -> None:
    # what a profiled CUDA step holds: kernels, a compiled graph's region spanning them with its gaps, and host ops
    def event(name: str, start: int, end: int, device: bool = True, region: bool = False) -> FunctionEvent:
        kind = torch.autograd.DeviceType.CUDA if device else torch.autograd.DeviceType.CPU
        return FunctionEvent(id=start, name=name, thread=0, start_us=start, end_us=end, device_type=kind,
                             use_device="cuda", is_user_annotation=region)

    events = [event("## Call CompiledFxGraph ##", 0, 400, region=True), event("triton_poi_fused_0", 10, 30),
              event("sm90_gemm", 300, 350), event("aten::mm", 5, 900, device=False)]
    kernels, seconds, regions = device_kernels(events)
    assert (kernels, regions) == (2, 1)
    assert seconds == pytest.approx(70e-6)
