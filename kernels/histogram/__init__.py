"""LISA causal codeword-histogram attention (spec lisa.md §1.5-1.6).

For every position i and codebook c (W codewords per codebook)::

    F̃[i,c,:] = γ·F̃[i−1,c,:] + assign[i,c,:]        (decay=None: γ = 1, plain prefix sums, Eq. 10)
    a[i,c,:]  = softmax_w( M_c[q_ic, :] + log F̃[i,c,:] )   (log 0 = −∞; an all-empty row gives a = 0)
    o_i       = Σ_c Σ_w a[i,c,w] · values[c,w,:]

This is Eq. 11 with the histogram as multiplicative weights; the code's decayed histogram uses
γ = exp(−0.1).  Time O(N·C·W·D), memory O(N·C·W): no N×N tensor exists on either path.

Conventions the caller owns:

* ``assign`` (B, N, C, W) float ≥ 0: the straight-through one-hot ĥ (Base/Mini) or the softmax π (Soft).
  Rows at padding must be zero: then, with the project's LEFT padding, padded positions see an empty
  histogram and output exactly 0.  The current position is included (no self-exclusion).
* ``query_codes`` (B, N, C) int64/int32 in [0, W): the query's hard code per codebook (no gradient).
* ``logits_table`` (C, W, W): M_c = scaled inner products of projected codewords, *including* the 1/√D.
* ``values`` (C, W, D): the projected value codewords C_c·P^V_c.

Gradients flow to assign (also to its zero entries: a straight-through one-hot needs them),
logits_table and values.  Files: ``naive.py`` (torch reference, chunked scan), ``chunk.py`` (Triton).
"""

from __future__ import annotations

import numbers

import torch

from .._common import _triton_check, check_float, check_ndim
from .._dispatch import dispatch
from .naive import decayed_cumsum, gather_logits, naive_causal_histogram_attention

__all__ = ["causal_histogram_attention", "naive_causal_histogram_attention", "decayed_cumsum", "gather_logits"]

OP = "causal_histogram_attention"
MAX_TRITON_W = 256
MAX_TRITON_D = 256


def _validate(assign: torch.Tensor, query_codes: torch.Tensor, logits_table: torch.Tensor, values: torch.Tensor,
              decay: float | None) -> None:
    for name, t in (("assign", assign), ("logits_table", logits_table), ("values", values)):
        check_float(name, t)
    check_ndim("assign", assign, 4, "(B, N, C, W)")
    check_ndim("logits_table", logits_table, 3, "(C, W, W)")
    check_ndim("values", values, 3, "(C, W, D)")
    B, N, C, W = assign.shape
    if not isinstance(query_codes, torch.Tensor) or query_codes.dtype not in (torch.int64, torch.int32):
        got = query_codes.dtype if isinstance(query_codes, torch.Tensor) else type(query_codes).__name__
        raise TypeError(f"query_codes must be an int64/int32 tensor, got {got}")
    if query_codes.shape != (B, N, C):
        raise ValueError(f"query_codes must be (B, N, C) = {(B, N, C)}, got {tuple(query_codes.shape)}")
    if logits_table.shape != (C, W, W):
        raise ValueError(f"logits_table must be (C, W, W) = {(C, W, W)}, got {tuple(logits_table.shape)}")
    if values.shape[:2] != (C, W):
        raise ValueError(f"values must be (C, W, D) with (C, W) = {(C, W)}, got {tuple(values.shape)}")
    devices = {t.device for t in (assign, query_codes, logits_table, values)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    if decay is not None:
        if isinstance(decay, bool) or not isinstance(decay, numbers.Real):
            raise TypeError(f"decay must be None or a Python float in (0, 1], got {type(decay).__name__}")
        if not 0.0 < float(decay) <= 1.0:
            raise ValueError(f"decay must lie in (0, 1], got {decay}")
    if query_codes.numel() and W:
        # An out-of-range code would read outside the table on the Triton path: refuse loudly.  (One device
        # sync per call; the op runs once per layer per step.)
        lo, hi = int(query_codes.min()), int(query_codes.max())
        if lo < 0 or hi >= W:
            raise ValueError(f"query_codes must lie in [0, W={W}), got values in [{lo}, {hi}]")


def causal_histogram_attention(
    assign: torch.Tensor,
    query_codes: torch.Tensor,
    logits_table: torch.Tensor,
    values: torch.Tensor,
    *,
    decay: float | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """LISA causal histogram attention; returns (B, N, D) in the dtype of ``values``.

    Args:
        assign: (B, N, C, W) non-negative code assignments (zero rows at padding).
        query_codes: (B, N, C) int64/int32 hard query codes in [0, W).
        logits_table: (C, W, W) logit table M.
        values: (C, W, D) value codewords.
        decay: None (plain causal histogram) or γ in (0, 1] (F̃_i = γF̃_{i−1} + assign_i), a Python float.
        backend: ``"triton"``, ``"reference"`` or ``"auto"``/None.
    """
    _validate(assign, query_codes, logits_table, values, decay)
    decay = None if decay is None else float(decay)
    sizes = {"codewords per codebook W": (assign.shape[-1], MAX_TRITON_W),
             "value dim D": (values.shape[-1], MAX_TRITON_D)}
    empty = "empty sequence or no codebooks" if assign.shape[1] == 0 or assign.shape[2] == 0 else None
    path = dispatch(OP, assign, backend, lambda: _triton_check(assign, logits_table, values, sizes=sizes, empty=empty))
    if path == "reference":
        return naive_causal_histogram_attention(assign, query_codes, logits_table, values, decay=decay)
    from .._triton_utils import ensure_launchable
    from .chunk import CausalHistogramAttentionFunction

    ensure_launchable(assign)

    return CausalHistogramAttentionFunction.apply(
        assign.contiguous(), query_codes.contiguous(), logits_table.contiguous(), values.contiguous(), decay
    )
