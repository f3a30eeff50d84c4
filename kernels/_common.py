"""Input validation and the references' compute dtype, shared by the ops (no triton import here)."""

from __future__ import annotations

import torch

from ._dispatch import UnsupportedByTriton, interpreter_enabled

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Triton kernels take these; float64 has no tensor-core dot and goes to the reference.
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Largest head/feature dim a Triton program keeps in registers (d x d fp32 state).
MAX_TRITON_HEAD_DIM = 128


def check_float(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating tensor (fp16/bf16/fp32/fp64), got {t.dtype}")


def check_ndim(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name} must have shape {layout} ({ndim} dims), got {tuple(t.shape)}")


def check_same(names: str, *tensors: torch.Tensor) -> None:
    """Same dtype and device for every tensor (mixed precision is the caller's cast to make, not ours)."""
    first = tensors[0]
    for t in tensors[1:]:
        if t.dtype != first.dtype:
            raise TypeError(f"{names} must share one dtype, got {[x.dtype for x in tensors]}")
        if t.device != first.device:
            raise ValueError(f"{names} must be on one device, got {[str(x.device) for x in tensors]}")


def triton_dtype_check(t: torch.Tensor) -> None:
    """Raise UnsupportedByTriton for dtypes the kernels cannot handle here (fallback under ``auto``)."""
    if t.dtype not in TRITON_DTYPES:
        raise UnsupportedByTriton(f"the Triton kernels support fp16/bf16/fp32, got {t.dtype}")
    if t.dtype == torch.bfloat16 and not t.is_cuda and interpreter_enabled():
        # numpy has no bfloat16: the interpreter silently computes garbage, so refuse rather than be wrong.
        raise UnsupportedByTriton("bfloat16 is not supported by the Triton CPU interpreter; use fp16/fp32")


def triton_dim_check(name: str, size: int, max_size: int = MAX_TRITON_HEAD_DIM) -> None:
    if not 1 <= size <= max_size:
        raise UnsupportedByTriton(f"{name}={size} is outside the Triton kernels' range 1..{max_size}")


def _triton_check(*tensors: torch.Tensor, sizes: dict[str, tuple[int, int]], empty: str | None = None) -> None:
    """An op's Triton support check: every tensor's dtype, each ``name: (size, max_size)`` in ``sizes``, and
    ``empty`` (the reason, when the inputs have no element to launch over).  Raises UnsupportedByTriton."""
    for t in tensors:
        triton_dtype_check(t)
    for name, (size, max_size) in sizes.items():
        triton_dim_check(name, size, max_size)
    if empty is not None:
        raise UnsupportedByTriton(empty)


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The references compute in fp32, or fp64 when any input is fp64 (mirroring the kernels' fp32 accumulation)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
