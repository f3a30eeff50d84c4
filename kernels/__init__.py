"""Triton kernels (with pure-torch references) for the study's efficient sequence mixers.

Public ops -- each dispatches to Triton on CUDA tensors and to its torch reference elsewhere
(``backend=`` or ``SEQREC_KERNELS=triton|reference|auto`` forces a path, see :mod:`kernels._dispatch`):

* :func:`cosine_attention` -- Cotten4Rec bidirectional cosine attention (fused, one launch per pass).
* :func:`causal_linear_attention` -- chunked causal linear attention, optional denominator and
  numerator-only RoPE (RecGRELA, LinRec, causal cosine attention).
* :func:`causal_histogram_attention` -- LISA causal codeword-histogram attention (optionally decayed).

``import kernels`` never imports triton; the Triton modules load on the first Triton call.  Which path ran
last is available from :func:`backend_used` (op -> "triton"/"reference").
"""

from __future__ import annotations

from ._dispatch import (
    ENV_VAR,
    UnsupportedByTriton,
    backend_used,
    interpreter_enabled,
    last_backend,
    reset_backend_record,
    resolve_backend,
    triton_available,
)
from .causal_linear import (
    apply_rope,
    causal_linear_attention,
    naive_chunk_causal_linear_attention,
    naive_quadratic_causal_linear_attention,
    rope_theta,
)
from .cosine import COSINE_EPS, cosine_attention, naive_cosine_attention, naive_quadratic_cosine_attention
from .histogram import causal_histogram_attention, decayed_cumsum, naive_causal_histogram_attention

__all__ = [
    "ENV_VAR",
    "COSINE_EPS",
    "UnsupportedByTriton",
    "apply_rope",
    "backend_used",
    "causal_histogram_attention",
    "naive_causal_histogram_attention",
    "causal_linear_attention",
    "naive_quadratic_causal_linear_attention",
    "naive_chunk_causal_linear_attention",
    "cosine_attention",
    "naive_quadratic_cosine_attention",
    "naive_cosine_attention",
    "decayed_cumsum",
    "interpreter_enabled",
    "last_backend",
    "reset_backend_record",
    "resolve_backend",
    "rope_theta",
    "triton_available",
]
