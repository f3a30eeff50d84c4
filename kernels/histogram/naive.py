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
* The decayed histogram is a chunked scan (64-row chunks: a T×T decay matrix inside a chunk, a carried row
  between chunks), never the cumsum(γ^-i·x)·γ^i trick, which under/overflows past ~870 positions.
"""

from __future__ import annotations

import math

import torch

from .._common import _compute_dtype

SCAN_CHUNK = 64
# exp(M − lse) is clamped at exp(60) in the gradient of *empty* bins only: an empty bin whose logit beats the
# whole occupied row by > 60 nats would otherwise overflow to inf·0 = NaN.  Forward values are never clamped.
EXP_CLAMP = 60.0



def decay_matrix(size: int, gamma: float, device, dtype, reverse: bool = False) -> torch.Tensor:
    """L[t, s] = γ^(t−s) for s ≤ t (γ^(s−t) for s ≥ t when reverse), else 0; no negative powers."""
    idx = torch.arange(size, device=device)
    diff = idx[:, None] - idx[None, :]
    if reverse:
        diff = -diff
    powers = torch.exp(diff.clamp(min=0).to(torch.float64) * math.log(gamma))
    return torch.where(diff >= 0, powers, torch.zeros_like(powers)).to(dtype)


def decayed_cumsum(x: torch.Tensor, gamma: float | None, chunk: int = SCAN_CHUNK) -> torch.Tensor:
    """F[:, i] = γ F[:, i−1] + x[:, i] along dim 1 of x (B, N, ...); plain cumsum when gamma is None."""
    if gamma is None or gamma == 1.0:
        return torch.cumsum(x, dim=1)
    B, N = x.shape[:2]
    flat = x.reshape(B, N, -1)
    L = decay_matrix(chunk, gamma, x.device, x.dtype)
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


def naive_causal_histogram_attention(
    assign: torch.Tensor,
    query_codes: torch.Tensor,
    logits_table: torch.Tensor,
    values: torch.Tensor,
    *,
    decay: float | None = None,
) -> torch.Tensor:
    """Reference: O(N·C·W) memory and time (plus O(N·C·W·D) for the output), returns values.dtype."""
    dt = _compute_dtype(assign, logits_table, values)
    hist = decayed_cumsum(assign.to(dt), decay)  # (B, N, C, W)
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
