"""Kernel tests run the Triton kernels on CPU through the Triton interpreter when no CUDA GPU is present.

``triton.jit`` picks compiled or interpreted kernels when a kernel module is imported, so the switch has to be
made before anything imports triton: pytest imports this conftest before the test modules of this folder.
On a GPU machine the kernels are compiled as usual; an explicit ``TRITON_INTERPRET`` in the environment
always wins, so ``TRITON_INTERPRET=0 pytest tests/kernels`` tests the reference paths only.
"""

from __future__ import annotations

import os

import torch

# If triton was already imported by an earlier test folder, flipping the variable has no effect; the kernels then
# refuse CPU tensors with a RuntimeError that names TRITON_INTERPRET (kernels._triton_utils.ensure_launchable).
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
