"""Triton helpers; importing this module imports triton (only done lazily, on the first Triton call)."""

from __future__ import annotations

import os

import torch
import triton

from ._dispatch import interpreter_enabled

AUTOTUNE_ENV = "SEQREC_TRITON_AUTOTUNE"


def gpu_tuning() -> bool:
    """Autotune only on a real GPU: the interpreter cannot benchmark (and several configs break it).
    ``$SEQREC_TRITON_AUTOTUNE=0`` compiles the first config alone on a GPU too: the GPU test run sets it, since
    every test shape would otherwise compile and benchmark every config, a large share of each test's time."""
    wanted = os.environ.get(AUTOTUNE_ENV, "1").lower() not in ("0", "false", "no", "off")
    return wanted and torch.cuda.is_available() and not interpreter_enabled()


def autotune(configs: list[triton.Config], key: list[str]):
    """``triton.autotune`` over ``configs`` on GPU, and over ``configs[0]`` alone otherwise (see gpu_tuning)."""
    return triton.autotune(configs=configs if gpu_tuning() else configs[:1], key=key)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 dots follow torch's own matmul setting (default: exact IEEE, i.e. no TF32) so that the Triton and
    reference paths agree; fp16/bf16 dots ignore it."""
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


def next_pow2(n: int, minimum: int = 16) -> int:
    """Block size for a feature dim: ``tl.dot`` needs power-of-two blocks of at least 16."""
    return max(minimum, triton.next_power_of_2(n))


# triton.jit picks "interpreted" or "compiled" when a kernel module is imported (all of them import this
# module first), so remember the mode of that moment: flipping TRITON_INTERPRET later has no effect.
INTERPRETED = interpreter_enabled()


def ensure_launchable(t: torch.Tensor) -> None:
    """Clear error instead of a crash deep inside triton when compiled kernels get CPU tensors."""
    if not t.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "the Triton kernels were loaded without TRITON_INTERPRET=1 and cannot run on CPU tensors; "
            "set TRITON_INTERPRET=1 before the first Triton call of the process, or use backend='reference'"
        )
