"""Every zoo model trains and ranks on every device this machine has: the CPU always, a CUDA GPU where present.

On a GPU each model also trains under bf16 and fp16 autocast, the efficient mixers must run their Triton kernels
(the dispatcher's ``auto`` picks them for CUDA tensors), and one step's autocast loss must differ from the fp32
loss (autocast engaged) by no more than mixed-precision rounding. The CUDA cases are added, not skipped, so a CPU
machine runs the CPU cases alone.
"""

from __future__ import annotations

import math

import pytest
import torch

import models
from study.train.config import TrainConfig
from study.train.step import TrainStep
from study.train.trainer import run_trial

ON_GPU = torch.cuda.is_available()
CASES = [("cpu", "fp32")] + ([("cuda", p) for p in ("fp32", "bf16", "fp16")] if ON_GPU else [])
# the zoo models whose default configuration calls a custom kernel, and the op it calls
KERNEL_OPS = {"cotten4rec": "cosine_attention", "lisa": "causal_histogram_attention"}


@pytest.mark.parametrize(("device", "precision"), CASES)
@pytest.mark.parametrize("name", models.available())
def test_every_model_trains_and_ranks_on_every_device(name, device, precision, synthetic_prepared):
    row = run_trial(name, synthetic_prepared, {"max_epochs": 1, "max_len": 20, "device": device,
                                               "precision": precision, "measure_efficiency": False})
    assert row["status"] == "ok" and row["device"].startswith(device)
    assert row["config"]["precision"] == precision
    for key in ("valid_ndcg@10", "test_ndcg@10", "test_hr@10"):
        assert math.isfinite(row[key]) and 0.0 <= row[key] <= 1.0, (key, row[key])
    op = KERNEL_OPS.get(name)
    if op is None:
        assert row["kernel_path"] == "none"
    else:
        assert row["kernel_path"] == f"{op}={'triton' if device == 'cuda' else 'reference'}"


@pytest.mark.parametrize(("device", "precision"), [case for case in CASES if case[1] != "fp32"] or [("cpu", "bf16")])
def test_autocast_changes_the_loss_by_rounding_only(device, precision):
    """On CUDA the autocast step's loss is within 2% of fp32's and not bit-equal; on a CPU the option is a no-op."""
    windows = torch.randint(1, 301, (64, 33), generator=torch.Generator().manual_seed(1)).to(device)
    losses = {}
    for mode in ("fp32", precision):
        torch.manual_seed(0)
        model = models.build("sasrec", num_items=300, max_len=32, dropout=0.0, attn_dropout=0.0).to(device)
        losses[mode] = TrainStep(model, TrainConfig(precision=mode))(windows).item()
    if device == "cpu":
        assert losses[precision] == losses["fp32"]
    else:
        assert losses[precision] != losses["fp32"]
        assert abs(losses[precision] - losses["fp32"]) <= 0.02 * losses["fp32"]


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA GPU")
def test_cuda_graph_steps_train_as_the_compiled_step_does():
    """Under ``compile_mode: reduce-overhead`` the ``last`` loss's forward and backward replay as CUDA graphs
    (Inductor skips none of them), five steps give the plain compiled step's losses, and each returned loss is
    still the step's own when read after the replays that followed it (a graph output would have been
    overwritten)."""
    from torch._dynamo.utils import counters

    windows = torch.randint(1, 301, (64, 33), generator=torch.Generator().manual_seed(1)).cuda()
    losses = {}
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = models.build("sasrec", num_items=300, max_len=32, dropout=0.0, attn_dropout=0.0).cuda()
        step = TrainStep(model, TrainConfig(compile=True, compile_mode=mode, objective="last"))
        returned = [step(windows) for _ in range(5)]
        losses[mode] = [loss.item() for loss in returned]
        assert step.cuda_graphs is (mode == "reduce-overhead")
        assert counters["inductor"]["cudagraph_skips"] == 0
    torch._dynamo.reset()
    assert losses["reduce-overhead"] == pytest.approx(losses["default"], rel=1e-5)
    assert losses["default"][-1] < losses["default"][0]
