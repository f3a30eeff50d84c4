"""Kernel tests run the Triton kernels on CPU through the Triton interpreter when no CUDA GPU is present.

``triton.jit`` picks compiled or interpreted kernels when a kernel module is imported, so the switch has to be
made before anything imports triton (torch's FLOP counter does, for one): ``tests/conftest.py`` makes it, before
pytest imports any test module.
On a GPU machine the kernels are compiled as usual, and a test that takes the ``backend`` or ``triton_backend``
fixture creates its tensors on the GPU (the fixture makes CUDA torch's default device for the test), so the
compiled kernels are tested against the reference on the same device. An explicit ``TRITON_INTERPRET`` in the
environment always wins, so ``TRITON_INTERPRET=0 pytest tests/kernels`` tests the reference paths only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

import kernels

# On a GPU, test the first autotuning config of each kernel: autotuning every test shape costs ~10 s a test.
# SEQREC_TRITON_AUTOTUNE=1 pytest tests/kernels tests every config the benchmarks may pick (slow).
os.environ.setdefault("SEQREC_TRITON_AUTOTUNE", "0")


def skip_without_triton() -> None:
    pytest.importorskip("triton", reason="triton is not installed: only the reference path is tested")
    if not (torch.cuda.is_available() or kernels.interpreter_enabled()):
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")


TEST_DEVICE = "cuda" if torch.cuda.is_available() and not kernels.interpreter_enabled() else "cpu"


@pytest.fixture
def triton_backend() -> Iterator[str]:
    skip_without_triton()
    with torch.device(TEST_DEVICE):
        yield "triton"


@pytest.fixture(params=["reference", "triton"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test runs on the torch reference and on the Triton kernel (skipped where Triton cannot run)."""
    if request.param == "triton":
        skip_without_triton()
    with torch.device(TEST_DEVICE):
        yield request.param
