"""Backend selection shared by every op: Triton kernels or the pure-torch reference.

Rules (see also kernels/README.md):

* ``backend=`` argument of an op wins; otherwise the ``SEQREC_KERNELS`` env var (read at every call,
  so a trainer may flip it); default ``auto``.
* ``auto``: Triton when the inputs live on a CUDA device and triton is importable, otherwise the reference.
  An input the Triton kernels do not support (e.g. float64, head dim above the supported maximum) silently
  falls back to the reference under ``auto`` -- the fallback is recorded in :func:`backend_used`, so a
  trainer can log which path really ran.
* ``triton`` (forced): runs the kernels on CUDA tensors, or on CPU tensors through the Triton interpreter when
  ``TRITON_INTERPRET=1`` was set *before* ``triton`` was first imported (that is how the test-suite runs).
  Anything unsupported raises a ``ValueError``/``TypeError``/``RuntimeError`` instead of falling back.
* ``reference``: always the pure-torch implementation (differentiable by autograd, any device/dtype).

The triton package is never imported by ``import kernels``: the Triton modules are imported lazily on the
first Triton call.  ``triton.jit`` decides between compiled and interpreted kernels at decoration time, so
importing it late is what lets a test module set ``TRITON_INTERPRET=1`` after ``import kernels``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Literal

import torch

Backend = Literal["triton", "reference"]

ENV_VAR = "SEQREC_KERNELS"
_CHOICES = ("auto", "triton", "reference")

# op name -> backend of the most recent call (forward).  Module-level on purpose: a trainer reads it after a
# step to record which path ran; it is tiny and only ever overwritten.
_LAST_BACKEND: dict[str, Backend] = {}


class UnsupportedByTriton(ValueError):
    """Raised by an op's Triton support check; under ``auto`` it turns into a fallback to the reference."""


def triton_available() -> bool:
    """True when the ``triton`` package can be imported (it is absent e.g. on macOS)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def requested_backend(backend: str | None = None) -> str:
    """The requested mode (``auto``/``triton``/``reference``) from the argument or the env var."""
    choice = backend if backend is not None else os.environ.get(ENV_VAR, "auto")
    choice = choice.strip().lower()
    if choice not in _CHOICES:
        source = "backend=" if backend is not None else f"${ENV_VAR}="
        raise ValueError(f"{source}{choice!r} is not one of {_CHOICES}")
    return choice


def resolve_backend(tensor: torch.Tensor, backend: str | None = None) -> Backend:
    """Decide which implementation runs for inputs living where ``tensor`` lives.

    Returns ``"triton"`` or ``"reference"``.  Forcing ``"triton"`` where it cannot run raises a
    ``RuntimeError`` that says why (no triton package, or CPU tensors without ``TRITON_INTERPRET=1``).
    """
    choice = requested_backend(backend)
    if choice == "reference":
        return "reference"
    if choice == "auto":
        return "triton" if tensor.is_cuda and triton_available() else "reference"
    if not triton_available():
        raise RuntimeError(
            "backend='triton' was forced but the triton package is not installed; "
            f"use backend='reference' (or {ENV_VAR}=reference)"
        )
    if tensor.is_cuda or interpreter_enabled():
        return "triton"
    raise RuntimeError(
        f"backend='triton' was forced for tensors on {tensor.device} but no CUDA device is used and the "
        "Triton interpreter is off; set TRITON_INTERPRET=1 before triton is imported to run the kernels on "
        "CPU (slow, for tests), or use backend='reference'"
    )


def _record(op: str, path: Backend) -> None:
    _LAST_BACKEND[op] = path


def backend_used() -> dict[str, Backend]:
    """Backend of the most recent call of each op, e.g. ``{"cosine_attention": "triton"}`` (a copy)."""
    return dict(_LAST_BACKEND)


def last_backend(op: str | None = None) -> Backend | None:
    """Backend of the most recent call of ``op`` (or of any op when ``op`` is None)."""
    if op is not None:
        return _LAST_BACKEND.get(op)
    return next(reversed(_LAST_BACKEND.values()), None) if _LAST_BACKEND else None


def reset_backend_record() -> None:
    """Forget what :func:`backend_used` reports (e.g. at the start of a run)."""
    _LAST_BACKEND.clear()


def dispatch(op: str, tensor: torch.Tensor, backend: str | None, check_triton: Callable[[], None]) -> Backend:
    """Resolve the backend for one call of ``op`` and record it.

    ``check_triton()`` raises :class:`UnsupportedByTriton` (a ``ValueError``) when the Triton kernels cannot
    take these (otherwise valid) inputs: that error propagates when Triton was forced, and becomes a recorded
    fallback to the reference under ``auto``.  Inputs that are invalid for every backend must be rejected by
    the op *before* calling this.
    """
    path = resolve_backend(tensor, backend)
    if path == "triton":
        try:
            check_triton()
        except UnsupportedByTriton:
            if requested_backend(backend) == "triton":
                raise
            path = "reference"
    # last call wins; keep insertion order = recency so last_backend() without op works
    _LAST_BACKEND.pop(op, None)
    _record(op, path)
    return path
