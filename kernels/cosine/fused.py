"""Fused Triton kernels for Cotten4Rec's bidirectional cosine attention (spec cotten4rec.md §2, §10.2).

One program per (batch, head) does everything in a single launch, as the paper claims for its CUDA kernel:

* forward, loop 1 over N-tiles: row-normalise K in registers (fp32 norms), mask, scale V by 1/c, and
  accumulate the d×dv state S = K̂ᵀV′ in fp32;
* forward, loop 2 over N-tiles: normalise Q, O = Q̂ S, store O.  S (B·H·d·dv fp32, tiny) is saved for the
  backward so that it does not re-read K and V for it.
* backward, loop 1: dS = Q̂ᵀ dO;  loop 2: dQ̂ = dO Sᵀ, dK̂ = V′ dSᵀ, dV′ = K̂ dS, then the normalisation
  Jacobian dx = r·(dx̂ − x̂ (x̂·dx̂)) with r = 1/sqrt(|x|² + eps), dV = dV′/c, and d(1/c) = Σ_i v_i·dV′_i.

No normalised N×d copy of Q/K/V and no N×N matrix is ever written.  The value scale 1/c = n_valid^-σ(m) is a
(B, H) tensor computed by torch outside the kernel, so autograd turns d(1/c) into dm without a hand-written
sigmoid/log derivative.  This module imports triton at import time; kernels/cosine/__init__.py imports it
lazily.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_utils import autotune, dot_precision, next_pow2

_CONFIGS = [
    triton.Config({"BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_N": 128}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_N": 64}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_N": 128}, num_warps=8, num_stages=3),
]


@autotune(_CONFIGS, key=["BLOCK_D", "BLOCK_DV"])
@triton.jit
def _cosine_fwd_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, inv_c_ptr, o_ptr, s_ptr,
    N, H, D, DV, eps,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PREC: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    i_b = i_bh // H
    q_ptr += i_bh * N * D
    k_ptr += i_bh * N * D
    v_ptr += i_bh * N * DV
    o_ptr += i_bh * N * DV
    mask_ptr += i_b * N
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    md = offs_d < D
    mdv = offs_dv < DV
    inv_c = tl.load(inv_c_ptr + i_bh)
    dtype = q_ptr.dtype.element_ty

    state = tl.zeros((BLOCK_D, BLOCK_DV), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mn = offs_n < N
        keep = tl.load(mask_ptr + offs_n, mask=mn, other=0) != 0
        k = tl.load(k_ptr + offs_n[:, None] * D + offs_d[None, :], mask=mn[:, None] & md[None, :], other=0.0)
        k = k.to(tl.float32)
        rk = tl.where(keep, tl.rsqrt(tl.sum(k * k, axis=1) + eps), 0.0)
        k_hat = k * rk[:, None]
        m_dv = mn[:, None] & mdv[None, :]
        v = tl.load(v_ptr + offs_n[:, None] * DV + offs_dv[None, :], mask=m_dv, other=0.0)
        v_s = v.to(tl.float32) * tl.where(keep, inv_c, 0.0)[:, None]
        state += tl.dot(tl.trans(k_hat.to(dtype)), v_s.to(dtype), input_precision=PREC)

    s_ptrs = s_ptr + i_bh * BLOCK_D * BLOCK_DV + offs_d[:, None] * BLOCK_DV + offs_dv[None, :]
    tl.store(s_ptrs, state)

    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mn = offs_n < N
        keep = tl.load(mask_ptr + offs_n, mask=mn, other=0) != 0
        q = tl.load(q_ptr + offs_n[:, None] * D + offs_d[None, :], mask=mn[:, None] & md[None, :], other=0.0)
        q = q.to(tl.float32)
        rq = tl.where(keep, tl.rsqrt(tl.sum(q * q, axis=1) + eps), 0.0)
        o = tl.dot((q * rq[:, None]).to(dtype), state.to(dtype), input_precision=PREC)
        m_dv = mn[:, None] & mdv[None, :]
        tl.store(o_ptr + offs_n[:, None] * DV + offs_dv[None, :], o.to(dtype), mask=m_dv)


@autotune(_CONFIGS, key=["BLOCK_D", "BLOCK_DV"])
@triton.jit
def _cosine_bwd_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, inv_c_ptr, s_ptr, do_ptr,
    dq_ptr, dk_ptr, dv_ptr, dinv_c_ptr,
    N, H, D, DV, eps,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PREC: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    i_b = i_bh // H
    q_ptr += i_bh * N * D
    k_ptr += i_bh * N * D
    dq_ptr += i_bh * N * D
    dk_ptr += i_bh * N * D
    v_ptr += i_bh * N * DV
    dv_ptr += i_bh * N * DV
    do_ptr += i_bh * N * DV
    mask_ptr += i_b * N
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    md = offs_d < D
    mdv = offs_dv < DV
    inv_c = tl.load(inv_c_ptr + i_bh)
    dtype = q_ptr.dtype.element_ty
    state = tl.load(s_ptr + i_bh * BLOCK_D * BLOCK_DV + offs_d[:, None] * BLOCK_DV + offs_dv[None, :])

    # loop 1: dS = Σ_i q̂_iᵀ do_i  (d×dv, fp32)
    d_state = tl.zeros((BLOCK_D, BLOCK_DV), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mn = offs_n < N
        keep = tl.load(mask_ptr + offs_n, mask=mn, other=0) != 0
        q = tl.load(q_ptr + offs_n[:, None] * D + offs_d[None, :], mask=mn[:, None] & md[None, :], other=0.0)
        q = q.to(tl.float32)
        rq = tl.where(keep, tl.rsqrt(tl.sum(q * q, axis=1) + eps), 0.0)
        m_dv = mn[:, None] & mdv[None, :]
        do = tl.load(do_ptr + offs_n[:, None] * DV + offs_dv[None, :], mask=m_dv, other=0.0)
        d_state += tl.dot(tl.trans((q * rq[:, None]).to(dtype)), do.to(dtype), input_precision=PREC)

    # loop 2: per-tile gradients; the 1/c partial is reduced in registers and written once.
    d_inv_c = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mn = offs_n < N
        keep = tl.load(mask_ptr + offs_n, mask=mn, other=0) != 0
        m_d = mn[:, None] & md[None, :]
        m_dv = mn[:, None] & mdv[None, :]
        q = tl.load(q_ptr + offs_n[:, None] * D + offs_d[None, :], mask=m_d, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + offs_n[:, None] * D + offs_d[None, :], mask=m_d, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs_n[:, None] * DV + offs_dv[None, :], mask=m_dv, other=0.0).to(tl.float32)
        do = tl.load(do_ptr + offs_n[:, None] * DV + offs_dv[None, :], mask=m_dv, other=0.0)
        rq = tl.where(keep, tl.rsqrt(tl.sum(q * q, axis=1) + eps), 0.0)
        rk = tl.where(keep, tl.rsqrt(tl.sum(k * k, axis=1) + eps), 0.0)
        q_hat = q * rq[:, None]
        k_hat = k * rk[:, None]
        v_s = v * tl.where(keep, inv_c, 0.0)[:, None]

        dq_hat = tl.dot(do.to(dtype), tl.trans(state.to(dtype)), input_precision=PREC)
        dq = (dq_hat - q_hat * tl.sum(q_hat * dq_hat, axis=1)[:, None]) * rq[:, None]
        dk_hat = tl.dot(v_s.to(dtype), tl.trans(d_state.to(dtype)), input_precision=PREC)
        dk = (dk_hat - k_hat * tl.sum(k_hat * dk_hat, axis=1)[:, None]) * rk[:, None]
        dv_s = tl.dot(k_hat.to(dtype), d_state.to(dtype), input_precision=PREC)
        dv = dv_s * tl.where(keep, inv_c, 0.0)[:, None]
        d_inv_c += tl.where(keep, tl.sum(v * dv_s, axis=1), 0.0)

        tl.store(dq_ptr + offs_n[:, None] * D + offs_d[None, :], dq.to(dtype), mask=m_d)
        tl.store(dk_ptr + offs_n[:, None] * D + offs_d[None, :], dk.to(dtype), mask=m_d)
        tl.store(dv_ptr + offs_n[:, None] * DV + offs_dv[None, :], dv.to(dtype), mask=m_dv)
    tl.store(dinv_c_ptr + i_bh, tl.sum(d_inv_c, axis=0))


def cosine_fwd(q, k, v, mask_u8, inv_c, eps):
    B, H, N, D = q.shape
    DV = v.shape[-1]
    BLOCK_D, BLOCK_DV = next_pow2(D), next_pow2(DV)
    o = torch.empty_like(v)
    state = torch.empty(B * H, BLOCK_D, BLOCK_DV, device=q.device, dtype=torch.float32)
    _cosine_fwd_kernel[(B * H,)](
        q, k, v, mask_u8, inv_c, o, state, N, H, D, DV, eps,
        BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV, PREC=dot_precision(q.dtype),
    )
    return o, state


def cosine_bwd(q, k, v, mask_u8, inv_c, state, do, eps):
    B, H, N, D = q.shape
    DV = v.shape[-1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    d_inv_c = torch.empty(B, H, device=q.device, dtype=torch.float32)
    _cosine_bwd_kernel[(B * H,)](
        q, k, v, mask_u8, inv_c, state, do, dq, dk, dv, d_inv_c, N, H, D, DV, eps,
        BLOCK_D=next_pow2(D), BLOCK_DV=next_pow2(DV), PREC=dot_precision(q.dtype),
    )
    return dq, dk, dv, d_inv_c


class CosineAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: Triton forward, Triton backward.  ``inv_c`` (B, H) fp32 receives a gradient so that
    torch differentiates the (tiny) ``inv_c = n_valid ** -sigmoid(m)`` expression into dm."""

    @staticmethod
    def forward(ctx, q, k, v, mask_u8, inv_c, eps):
        o, state = cosine_fwd(q, k, v, mask_u8, inv_c, eps)
        ctx.save_for_backward(q, k, v, mask_u8, inv_c, state)
        ctx.eps = eps
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, mask_u8, inv_c, state = ctx.saved_tensors
        dq, dk, dv, d_inv_c = cosine_bwd(q, k, v, mask_u8, inv_c, state, do.contiguous(), ctx.eps)
        return dq, dk, dv, None, d_inv_c, None
