"""Pure-torch reference for LISA's causal codeword-histogram attention (spec lisa.md §1.5-1.6).

    F̃[i,c,:] = γ F̃[i−1,c,:] + assign[i,c,:]          (γ = 1 without decay: plain prefix sums, Eq. 10)
    a[i,c,w]  = F̃[i,c,w]·exp(M_c[q_ic, w]) / Σ_w' F̃[i,c,w']·exp(M_c[q_ic, w'])
    o_i       = Σ_c Σ_w a[i,c,w] · values[c,w,:]

Numerics shared with the Triton kernels:

* The softmax is taken in log space, softmax_w(M + log F̃) with log 0 = −∞, so no exp overflows.
* The weights are formed as F̃·exp(M − max) rather than exp(M + log F̃ − max) *for the gradient*: that
  way an empty bin (F̃ = 0) still receives dL/dF̃ = exp(M − lse)·(g·V_w − g·o_c), which is what a
  straight-through one-hot assignment needs (the code that would be chosen gets a gradient).
* Bins with F̃ ≤ 0 are empty (assignments are expected to be ≥ 0).  A row whose histogram is all empty
  (left padding before the first item) outputs 0 and passes no gradient.
* The decayed histogram is the recurrence itself, row by row in place (:func:`decayed_cumsum`), never the
  cumsum(γ^-i·x)·γ^i trick, which under/overflows past ~870 positions.

Two implementations, equal within float rounding (tests/kernels/test_kernels_histogram_reference.py checks
outputs and gradients to 1e-5 of the largest entry in float32, 1e-10 in float64; they differ only where the
EXP_CLAMP below bites, which the hand-written one applies to M − lse, like the Triton kernel):

* :func:`naive_causal_histogram_attention` -- the reference the dispatcher runs off CUDA. A hand-written
  ``autograd.Function`` with the Triton kernels' backward (weights a, dM = a·(g·V − g·o_c), dF̃ = exp(M − lse)·
  (g·V − g·o_c), dassign = the reverse decayed scan of dF̃). It keeps ONE (B, N, C, W) tensor (the weights) from
  forward to backward and mixes the values as one (B·N, C·W) × (C·W, D) matmul. The autograd version below
  makes ~20 (B, N, C, W) temporaries in the forward and keeps most of them alive for its backward: on CPU
  those passes, not the O(N·C·W·D) arithmetic, were most of LISA's step.
* :func:`autograd_causal_histogram_attention` -- the same formula written for autograd (the derivative is
  torch's, not ours): the independent check of the hand-written backward, and the "before" of
  ``benchmarks/lisa_speed.py``.
"""

from __future__ import annotations

import math

import torch

from .._common import _compute_dtype

# exp(M − lse) is clamped at exp(60) in the gradient of *empty* bins only: an empty bin whose logit beats the
# whole occupied row by > 60 nats would otherwise overflow to inf·0 = NaN.  Forward values are never clamped.
EXP_CLAMP = 60.0



def decayed_cumsum(x: torch.Tensor, gamma: float | None, reverse: bool = False) -> torch.Tensor:
    """F[:, i] = γ F[:, i−1] + x[:, i] along dim 1 of x (B, N, ...); plain prefix sums when gamma is None.

    ``reverse`` gives the suffix scan F[:, i] = γ F[:, i+1] + x[:, i] (the gradient of the prefix scan).
    The recurrence itself, one in-place ``add_`` of a (B, ...) row per position: on CPU this costs about one copy
    of x, where ``torch.cumsum`` along a middle dim costs ~4 copies and the old blocked 64×64 decay-matrix matmul
    (:func:`matmul_decayed_cumsum`) more still. No power of γ beyond γ itself is formed, so nothing can overflow
    at any length.
    """
    y = x.clone(memory_format=torch.contiguous_format)
    step = 1.0 if gamma is None else float(gamma)
    length = y.shape[1]
    for i in range(length - 2, -1, -1) if reverse else range(1, length):
        y[:, i].add_(y[:, i + 1] if reverse else y[:, i - 1], alpha=step)
    return y


def matmul_decayed_cumsum(x: torch.Tensor, gamma: float | None, chunk: int = 64) -> torch.Tensor:
    """The previous scan, kept as the "before" of ``benchmarks/lisa_speed.py``: a T×T decay matrix per chunk.

    Within a chunk of T rows F = L·x with L[t, s] = γ^(t−s) (s ≤ t); the chunk's last row is carried into the
    next one. Same values as :func:`decayed_cumsum` within float rounding.
    """
    if gamma is None or gamma == 1.0:
        return torch.cumsum(x, dim=1)
    B, N = x.shape[:2]
    flat = x.reshape(B, N, -1)
    idx = torch.arange(chunk, device=x.device)
    diff = idx[:, None] - idx[None, :]
    powers = torch.exp(diff.clamp(min=0).to(torch.float64) * math.log(gamma))
    L = torch.where(diff >= 0, powers, torch.zeros_like(powers)).to(x.dtype)
    carry_w = L[:, :1] * gamma  # γ^(t+1): weight of the previous chunk's last row at row t
    out, carry = [], None
    for start in range(0, N, chunk):
        xc = flat[:, start : start + chunk]
        T = xc.shape[1]
        yc = L[:T, :T] @ xc
        if carry is not None:
            yc = yc + carry_w[:T] * carry[:, None, :]
        out.append(yc)
        carry = yc[:, -1]
    return torch.cat(out, dim=1).reshape(x.shape)


def gather_logits(logits_table: torch.Tensor, query_codes: torch.Tensor) -> torch.Tensor:
    """M_c[q_ic, :] for every position: (C, W, W) x (B, N, C) -> (B, N, C, W)."""
    C = logits_table.shape[0]
    return logits_table[torch.arange(C, device=logits_table.device), query_codes.long()]


def autograd_causal_histogram_attention(
    assign: torch.Tensor,
    query_codes: torch.Tensor,
    logits_table: torch.Tensor,
    values: torch.Tensor,
    *,
    decay: float | None = None,
) -> torch.Tensor:
    """The formula under autograd: O(N·C·W) memory and time (plus O(N·C·W·D) for the output), returns values.dtype."""
    dt = _compute_dtype(assign, logits_table, values)
    hist = matmul_decayed_cumsum(assign.to(dt), decay)  # (B, N, C, W)
    logits = gather_logits(logits_table.to(dt), query_codes)  # (B, N, C, W)
    occupied = hist > 0
    hist_c = hist.detach()
    scores = torch.where(occupied, logits + torch.log(torch.where(occupied, hist_c, 1.0)), -math.inf)
    top = scores.amax(dim=-1, keepdim=True)
    nonempty = top > -math.inf
    top = torch.where(nonempty, top, 0.0).detach()  # a constant shift; empty rows are zeroed below
    # value: exp(M + log F̃ − top) (0 on empty bins); d/dF̃ = exp(M − top) on every bin, empty ones included
    soft = torch.exp(scores - top)
    expo = torch.where(nonempty, torch.exp((logits - top).clamp(max=EXP_CLAMP)), 0.0).detach()
    weights = soft + (hist - hist_c) * expo
    total = weights.sum(dim=-1, keepdim=True)
    attn = weights / torch.where(nonempty, total, 1.0) * nonempty
    return torch.einsum("bncw,cwd->bnd", attn, values.to(dt)).to(values.dtype)


def _gathered_logits(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    return gather_logits(table, codes)  # (B, N, C, W), recomputed in backward rather than kept


class _HistogramAttention(torch.autograd.Function):
    """Forward and backward of the histogram attention in compute dtype; saves the weights and the lse only."""

    @staticmethod
    def forward(ctx, assign, query_codes, logits_table, values, decay):
        B, N, C, W = assign.shape
        D = values.shape[-1]
        hist = decayed_cumsum(assign, decay)
        # −∞ marks the empty bins (a bin ≤ 0 is empty: rounding can never make a count negative from non-negative
        # assignments, but the contract says ≤ 0 is empty, so say it). The log runs on 1 there and the −∞ is filled
        # in after: most bins are empty, and the CPU's log of 0 is ~10× slower than of a positive number
        empty = hist <= 0
        scores = hist.masked_fill_(empty, 1.0).log_().add_(_gathered_logits(logits_table, query_codes))
        scores.masked_fill_(empty, -math.inf)
        del hist, empty
        top = scores.amax(dim=-1, keepdim=True)
        nonempty = top > -math.inf
        top = torch.where(nonempty, top, 0.0)
        attn = scores.sub_(top).exp_()  # in place: scores are not needed again
        total = attn.sum(dim=-1, keepdim=True)
        total = torch.where(nonempty, total, 1.0)  # an all-empty row has attn = 0 everywhere: output 0
        attn.div_(total)
        lse = torch.where(nonempty, top + total.log(), -math.inf)  # (B, N, C, 1)
        out = (attn.reshape(B * N, C * W) @ values.reshape(C * W, D)).reshape(B, N, D)
        ctx.save_for_backward(attn, lse, query_codes, logits_table, values)
        ctx.decay = decay
        return out

    @staticmethod
    def backward(ctx, grad_out):
        attn, lse, query_codes, logits_table, values = ctx.saved_tensors
        B, N, C, W = attn.shape
        D = values.shape[-1]
        g = grad_out.reshape(B * N, D).to(attn.dtype)
        grad_values = (attn.reshape(B * N, C * W).T @ g).reshape(C, W, D)
        centred = (g @ values.reshape(C * W, D).T).reshape(B, N, C, W)  # g·V_w
        centred -= (attn * centred).sum(dim=-1, keepdim=True)  # − g·o_c
        grad_logits = attn * centred  # a·(g·V − g·o_c); not in place: a retained graph may run backward again
        flat_index = (torch.arange(C, device=query_codes.device) * W + query_codes.long()).reshape(-1)
        grad_table = torch.zeros(C * W, W, device=attn.device, dtype=attn.dtype)
        grad_table.index_add_(0, flat_index, grad_logits.reshape(-1, W))
        del grad_logits
        nonempty = lse > -math.inf
        # dF̃ = exp(M − lse)·(g·V − g·o_c) on every bin of a non-empty row, empty bins included (straight-through)
        grad_hist = _gathered_logits(logits_table, query_codes).sub_(torch.where(nonempty, lse, 0.0))
        grad_hist = grad_hist.clamp_(max=EXP_CLAMP).exp_().mul_(centred).mul_(nonempty)
        del centred
        grad_assign = decayed_cumsum(grad_hist, ctx.decay, reverse=True)
        return grad_assign, None, grad_table.reshape(C, W, W), grad_values, None


def naive_causal_histogram_attention(
    assign: torch.Tensor,
    query_codes: torch.Tensor,
    logits_table: torch.Tensor,
    values: torch.Tensor,
    *,
    decay: float | None = None,
) -> torch.Tensor:
    """Reference: O(N·C·W) memory and time (plus O(N·C·W·D) for the output), returns values.dtype.

    Same value and gradients as :func:`autograd_causal_histogram_attention`, with the backward written out (see
    the module docstring); no double backward.
    """
    dt = _compute_dtype(assign, logits_table, values)
    out = _HistogramAttention.apply(assign.to(dt), query_codes, logits_table.to(dt), values.to(dt), decay)
    return out.to(values.dtype)
