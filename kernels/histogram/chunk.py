"""Triton kernels for LISA's causal codeword-histogram attention.

Three kernels, all O(N·C·W) work (plus O(N·C·W·D) for the value mix), never an N×N tensor:

* ``_decayed_scan_kernel`` -- F[i] = γF[i−1] + x[i] along N (or the reverse scan, for the gradient), one
  program per (batch, slab of C·W columns).  Inside a chunk of BT rows it is one BT×BT decay-matrix dot
  (IEEE fp32: histogram counts stay exact); the last row is carried to the next chunk in fp32.
* ``_hist_attn_fwd_kernel`` -- one program per (batch, chunk of BT positions); loops over the C codebooks:
  gathers the query's logit row M_c[q_ic, :], takes softmax_w(M + log F̃) in log space, mixes the values
  (BT×W)·(W×D) and sums over codebooks in registers.  Stores o and the per-(i, c) log-sum-exp.
* ``_hist_attn_bwd_kernel`` -- same grid; recomputes the weights from F̃ and the saved log-sum-exp and
  writes three (B, N, C, W) fp32 buffers: the weights a (→ dvalues = Σ aᵀ·do, one einsum), the logit
  gradient a·(g·V − g·o_c) (→ scattered into dM with index_add_) and dF̃ = exp(M − lse)·(g·V − g·o_c)
  (→ dassign by the reverse decayed scan).

Recompute strategy: the forward saves only its inputs and the (B, N, C) log-sum-exp; the backward rescans
the histogram (one cheap kernel) instead of keeping the fp32 (B, N, C, W) F̃ alive between the passes.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._triton_utils import autotune, dot_precision, next_pow2
from .naive import EXP_CLAMP

SCAN_BT = 64

_SCAN_CONFIGS = [
    triton.Config({"BR": 32}, num_warps=4),
    triton.Config({"BR": 64}, num_warps=4),
    triton.Config({"BR": 128}, num_warps=4),
    triton.Config({"BR": 128}, num_warps=8),
]
_ATTN_CONFIGS = [
    triton.Config({"BT": 32}, num_warps=4),
    triton.Config({"BT": 16}, num_warps=4),
    triton.Config({"BT": 64}, num_warps=4),
    triton.Config({"BT": 64}, num_warps=8),
]


@autotune(_SCAN_CONFIGS, key=["R", "HAS_DECAY", "REVERSE"])
@triton.jit
def _decayed_scan_kernel(
    x_ptr, y_ptr, N, R, log2_gamma,
    HAS_DECAY: tl.constexpr, REVERSE: tl.constexpr, BT: tl.constexpr, BR: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    i_r = tl.program_id(1)
    x_ptr += i_b * N * R
    y_ptr += i_b * N * R
    offs_r = i_r * BR + tl.arange(0, BR)
    mr = offs_r < R
    rows = tl.arange(0, BT)
    diff = rows[:, None] - rows[None, :]
    if REVERSE:
        diff = -diff
    if HAS_DECAY:
        mat = tl.where(diff >= 0, tl.exp2(tl.maximum(diff, 0).to(tl.float32) * log2_gamma), 0.0)
        # weight of the carried row: γ^(t+1) forward (carry = previous chunk's last row),
        # γ^(BT−t) reverse (carry = next chunk's first row)
        if REVERSE:
            carry_w = tl.exp2((BT - rows).to(tl.float32) * log2_gamma)
        else:
            carry_w = tl.exp2((rows + 1).to(tl.float32) * log2_gamma)
    else:
        mat = tl.where(diff >= 0, 1.0, 0.0)
        carry_w = tl.full((BT,), 1.0, tl.float32)
    carry = tl.zeros((BR,), dtype=tl.float32)
    n_chunks = tl.cdiv(N, BT)
    for i in range(0, n_chunks):
        if REVERSE:
            start = (n_chunks - 1 - i) * BT
        else:
            start = i * BT
        offs_t = start + rows
        m2 = (offs_t < N)[:, None] & mr[None, :]
        x = tl.load(x_ptr + offs_t[:, None] * R + offs_r[None, :], mask=m2, other=0.0).to(tl.float32)
        y = tl.dot(mat, x, input_precision="ieee") + carry_w[:, None] * carry[None, :]
        tl.store(y_ptr + offs_t[:, None] * R + offs_r[None, :], y.to(y_ptr.dtype.element_ty), mask=m2)
        if REVERSE:
            carry = tl.sum(tl.where(rows[:, None] == 0, y, 0.0), axis=0)
        else:
            carry = tl.sum(tl.where(rows[:, None] == BT - 1, y, 0.0), axis=0)


@autotune(_ATTN_CONFIGS, key=["C", "BW", "BD"])
@triton.jit
def _hist_attn_fwd_kernel(
    f_ptr, codes_ptr, table_ptr, values_ptr, o_ptr, lse_ptr,
    N, C, W, D,
    BT: tl.constexpr, BW: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    offs_t = tl.program_id(1) * BT + tl.arange(0, BT)
    mt = offs_t < N
    offs_w = tl.arange(0, BW)
    mw = offs_w < W
    offs_d = tl.arange(0, BD)
    md = offs_d < D
    row = i_b * N + offs_t  # flat (b, i) index
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    for c in range(0, C):
        m2 = mt[:, None] & mw[None, :]
        hist = tl.load(f_ptr + (row[:, None] * C + c) * W + offs_w[None, :], mask=m2, other=0.0)
        code = tl.load(codes_ptr + row * C + c, mask=mt, other=0)
        logits = tl.load(table_ptr + (c * W + code[:, None]) * W + offs_w[None, :], mask=m2, other=0.0)
        occupied = m2 & (hist > 0)
        log_hist = tl.log(tl.where(occupied, hist, 1.0))
        scores = tl.where(occupied, logits.to(tl.float32) + log_hist, -float("inf"))
        top = tl.max(scores, axis=1)
        nonempty = top > -float("inf")
        top = tl.where(nonempty, top, 0.0)
        p = tl.where(occupied, tl.exp(scores - top[:, None]), 0.0)
        total = tl.sum(p, axis=1)
        attn = p / tl.where(nonempty, total, 1.0)[:, None]
        vals = tl.load(values_ptr + (c * W + offs_w[:, None]) * D + offs_d[None, :],
                       mask=mw[:, None] & md[None, :], other=0.0)
        acc += tl.dot(attn, vals.to(tl.float32), input_precision=PREC)
        lse = tl.where(nonempty, top + tl.log(tl.where(nonempty, total, 1.0)), -float("inf"))
        tl.store(lse_ptr + row * C + c, lse, mask=mt)
    tl.store(o_ptr + row[:, None] * D + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=mt[:, None] & md[None, :])


@autotune(_ATTN_CONFIGS, key=["C", "BW", "BD"])
@triton.jit
def _hist_attn_bwd_kernel(
    f_ptr, codes_ptr, table_ptr, values_ptr, lse_ptr, do_ptr,
    attn_ptr, dlogit_ptr, dhist_ptr,
    N, C, W, D, exp_clamp,
    BT: tl.constexpr, BW: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    offs_t = tl.program_id(1) * BT + tl.arange(0, BT)
    mt = offs_t < N
    offs_w = tl.arange(0, BW)
    mw = offs_w < W
    offs_d = tl.arange(0, BD)
    md = offs_d < D
    row = i_b * N + offs_t
    do = tl.load(do_ptr + row[:, None] * D + offs_d[None, :], mask=mt[:, None] & md[None, :], other=0.0)
    do = do.to(tl.float32)
    for c in range(0, C):
        m2 = mt[:, None] & mw[None, :]
        ptrs = (row[:, None] * C + c) * W + offs_w[None, :]
        hist = tl.load(f_ptr + ptrs, mask=m2, other=0.0)
        code = tl.load(codes_ptr + row * C + c, mask=mt, other=0)
        logits = tl.load(table_ptr + (c * W + code[:, None]) * W + offs_w[None, :], mask=m2, other=0.0)
        logits = logits.to(tl.float32)
        lse = tl.load(lse_ptr + row * C + c, mask=mt, other=-float("inf"))
        nonempty = lse > -float("inf")
        lse = tl.where(nonempty, lse, 0.0)
        occupied = m2 & (hist > 0)
        attn = tl.where(occupied, tl.exp(logits + tl.log(tl.where(occupied, hist, 1.0)) - lse[:, None]), 0.0)
        vals = tl.load(values_ptr + (c * W + offs_w[:, None]) * D + offs_d[None, :],
                       mask=mw[:, None] & md[None, :], other=0.0)
        gv = tl.dot(do, tl.trans(vals.to(tl.float32)), input_precision=PREC)  # (BT, BW): g·V_w
        centred = gv - tl.sum(attn * gv, axis=1)[:, None]  # g·V_w − g·o_c
        live = m2 & nonempty[:, None]
        expo = tl.where(live, tl.exp(tl.minimum(logits - lse[:, None], exp_clamp)), 0.0)
        tl.store(attn_ptr + ptrs, attn, mask=m2)
        tl.store(dlogit_ptr + ptrs, attn * centred, mask=m2)
        tl.store(dhist_ptr + ptrs, tl.where(live, expo * centred, 0.0), mask=m2)


def _precision(dtype: torch.dtype) -> str:
    return dot_precision(dtype) if dtype == torch.float32 else "tf32"


def decayed_scan(x: torch.Tensor, gamma: float | None, reverse: bool = False, out_dtype=torch.float32):
    """Triton decayed prefix sum along dim 1 of x (B, N, ...) (suffix sum when reverse)."""
    B, N = x.shape[:2]
    R = x[0, 0].numel()
    y = torch.empty(x.shape, device=x.device, dtype=out_dtype)
    has_decay = gamma is not None and gamma != 1.0
    log2_gamma = math.log2(gamma) if has_decay else 0.0
    grid = lambda meta: (B, triton.cdiv(R, meta["BR"]))  # noqa: E731
    _decayed_scan_kernel[grid](x, y, N, R, log2_gamma, HAS_DECAY=has_decay, REVERSE=reverse, BT=SCAN_BT)
    return y


def hist_attn_fwd(assign, codes, table, values, decay):
    B, N, C, W = assign.shape
    D = values.shape[-1]
    hist = decayed_scan(assign, decay)
    o = torch.empty(B, N, D, device=assign.device, dtype=values.dtype)
    lse = torch.empty(B, N, C, device=assign.device, dtype=torch.float32)
    grid = lambda meta: (B, triton.cdiv(N, meta["BT"]))  # noqa: E731
    _hist_attn_fwd_kernel[grid](
        hist, codes, table, values, o, lse, N, C, W, D,
        BW=next_pow2(W), BD=next_pow2(D), PREC=_precision(values.dtype),
    )
    return o, lse


def hist_attn_bwd(assign, codes, table, values, decay, lse, do):
    B, N, C, W = assign.shape
    D = values.shape[-1]
    hist = decayed_scan(assign, decay)  # recompute (see module docstring)
    attn = torch.empty_like(hist)
    dlogit = torch.empty_like(hist)
    dhist = torch.empty_like(hist)
    grid = lambda meta: (B, triton.cdiv(N, meta["BT"]))  # noqa: E731
    _hist_attn_bwd_kernel[grid](
        hist, codes, table, values, lse, do, attn, dlogit, dhist, N, C, W, D, EXP_CLAMP,
        BW=next_pow2(W), BD=next_pow2(D), PREC=_precision(values.dtype),
    )
    del hist
    dassign = decayed_scan(dhist, decay, reverse=True, out_dtype=assign.dtype)
    del dhist
    dvalues = torch.einsum("bncw,bnd->cwd", attn, do.float()).to(values.dtype)
    del attn
    flat_index = (torch.arange(C, device=codes.device) * W + codes.long()).reshape(-1)
    dtable = torch.zeros(C * W, W, device=table.device, dtype=torch.float32)
    dtable.index_add_(0, flat_index, dlogit.reshape(-1, W))
    return dassign, dtable.reshape(C, W, W).to(table.dtype), dvalues


class CausalHistogramAttentionFunction(torch.autograd.Function):
    """Triton forward and backward (with histogram recompute); saves inputs + (B, N, C) fp32 lse."""

    @staticmethod
    def forward(ctx, assign, codes, table, values, decay):
        o, lse = hist_attn_fwd(assign, codes, table, values, decay)
        ctx.save_for_backward(assign, codes, table, values, lse)
        ctx.decay = decay
        return o

    @staticmethod
    def backward(ctx, do):
        assign, codes, table, values, lse = ctx.saved_tensors
        grads = hist_attn_bwd(assign, codes, table, values, ctx.decay, lse, do.contiguous())
        dassign, dtable, dvalues = grads
        return dassign, None, dtable, dvalues, None
