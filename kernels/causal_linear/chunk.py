"""Triton kernels for chunked causal linear attention with optional numerator-only RoPE.

Layout follows fla's ``fused_chunk`` linear attention: one program per (batch, head) walks the sequence in
chunks of BT positions.  Inside a chunk the work is masked dot products (BT×BT); across chunks the d×dv
numerator state Σ k̃ᵀv and the d-vector denominator state Σ k are carried in fp32 registers.

RoPE without register shuffles: q and k are loaded as their even and odd feature columns, (BT, d/2) each, so
that rotating pair (2j, 2j+1) is elementwise between the two halves, q̃·k̃ = q̃ₑ·k̃ₑ + q̃ₒ·k̃ₒ, and the transposed
rotation in the backward is elementwise too.  Without RoPE the same split is used (rotation skipped).

Precision: every dot takes fp32 operands.  For fp32 inputs the precision follows torch's matmul TF32 flag
(default IEEE); for fp16/bf16 inputs TF32 is used.  Why not fp16 operands as fla does: with the denominator
the backward multiplies by 1/den, which for long ELU+1 sequences is ~1e-5 -- subnormal in fp16.

Backward (saved: inputs, o, den):
    g_t = do_t / den_t,  δ_t = −(do_t·o_t) / den_t       (g = do, δ = 0 without normalisation)
    dq̃_t = Σ_{s≤t} (g_t·v_s) k̃_s          dq_t += δ_t Σ_{s≤t} k_s
    dk̃_s = Σ_{t≥s} (g_t·v_s) q̃_t          dk_s += Σ_{t≥s} δ_t q_t
    dv_s = Σ_{t≥s} (q̃_t·k̃_s) g_t
then dq = rotᵀ(dq̃) (+ den part), likewise dk.  One forward sweep over the chunks gives dq, one reverse sweep
gives dk and dv (fla's fused_chunk backward).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_utils import autotune, dot_precision, next_pow2

_CONFIGS = [
    triton.Config({"BT": 64}, num_warps=4, num_stages=1),
    triton.Config({"BT": 32}, num_warps=2, num_stages=1),
    triton.Config({"BT": 32}, num_warps=4, num_stages=2),
    triton.Config({"BT": 64}, num_warps=8, num_stages=2),
    triton.Config({"BT": 128}, num_warps=8, num_stages=1),
]


@triton.jit
def _load_even_odd(ptr, offs_t, mt, offs_h, D):
    """Even and odd feature columns of a (BT, D) row block, as fp32 (BT, BLOCK_DH) each."""
    base = ptr + offs_t[:, None] * D + 2 * offs_h[None, :]
    even = tl.load(base, mask=mt[:, None] & (2 * offs_h < D)[None, :], other=0.0).to(tl.float32)
    odd = tl.load(base + 1, mask=mt[:, None] & (2 * offs_h + 1 < D)[None, :], other=0.0).to(tl.float32)
    return even, odd


@triton.jit
def _store_even_odd(ptr, even, odd, offs_t, mt, offs_h, D):
    base = ptr + offs_t[:, None] * D + 2 * offs_h[None, :]
    dtype = ptr.dtype.element_ty
    tl.store(base, even.to(dtype), mask=mt[:, None] & (2 * offs_h < D)[None, :])
    tl.store(base + 1, odd.to(dtype), mask=mt[:, None] & (2 * offs_h + 1 < D)[None, :])


@triton.jit
def _load_rows(ptr, offs_t, mt, offs_dv, mdv, DV):
    """A (BT, BLOCK_DV) row block of a (N, DV) tensor, as fp32."""
    return tl.load(ptr + offs_t[:, None] * DV + offs_dv[None, :], mask=mt[:, None] & mdv[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _angles(offs_t, theta):
    """cos and sin of each position's rotation angles, (BT, BLOCK_DH)."""
    ang = offs_t.to(tl.float32)[:, None] * theta[None, :]
    return tl.cos(ang), tl.sin(ang)


@triton.jit
def _rotate(even, odd, cos, sin):
    """Rotate each feature pair (even, odd) by its angle; (cos, −sin) gives the transposed rotation."""
    return even * cos - odd * sin, even * sin + odd * cos


@autotune(_CONFIGS, key=["BLOCK_DH", "BLOCK_DV", "ROPE", "NORMALIZE"])
@triton.jit
def _causal_linear_fwd_kernel(
    q_ptr, k_ptr, v_ptr, theta_ptr, o_ptr, den_ptr,
    N, H, D, DV, eps,
    BT: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr,
    ROPE: tl.constexpr, NORMALIZE: tl.constexpr, PREC: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    i_h = i_bh % H
    q_ptr += i_bh * N * D
    k_ptr += i_bh * N * D
    v_ptr += i_bh * N * DV
    o_ptr += i_bh * N * DV
    den_ptr += i_bh * N
    offs_h = tl.arange(0, BLOCK_DH)
    offs_dv = tl.arange(0, BLOCK_DV)
    mdv = offs_dv < DV
    theta = tl.load(theta_ptr + i_h * (D // 2) + offs_h, mask=offs_h < D // 2, other=0.0)

    s_even = tl.zeros((BLOCK_DH, BLOCK_DV), dtype=tl.float32)  # Σ k̃ᵀ v over previous chunks
    s_odd = tl.zeros((BLOCK_DH, BLOCK_DV), dtype=tl.float32)
    z_even = tl.zeros((BLOCK_DH,), dtype=tl.float32)  # Σ k over previous chunks (un-rotated)
    z_odd = tl.zeros((BLOCK_DH,), dtype=tl.float32)
    for start in range(0, N, BT):
        offs_t = start + tl.arange(0, BT)
        mt = offs_t < N
        causal = offs_t[:, None] >= offs_t[None, :]
        qe, qo = _load_even_odd(q_ptr, offs_t, mt, offs_h, D)
        ke, ko = _load_even_odd(k_ptr, offs_t, mt, offs_h, D)
        v = _load_rows(v_ptr, offs_t, mt, offs_dv, mdv, DV)
        if ROPE:
            cos, sin = _angles(offs_t, theta)
            qre, qro = _rotate(qe, qo, cos, sin)
            kre, kro = _rotate(ke, ko, cos, sin)
        else:
            qre, qro, kre, kro = qe, qo, ke, ko

        scores = tl.dot(qre, tl.trans(kre), input_precision=PREC)
        scores += tl.dot(qro, tl.trans(kro), input_precision=PREC)
        scores = tl.where(causal, scores, 0.0)
        num = tl.dot(scores, v, input_precision=PREC)
        num += tl.dot(qre, s_even, input_precision=PREC)
        num += tl.dot(qro, s_odd, input_precision=PREC)
        if NORMALIZE:
            plain = tl.dot(qe, tl.trans(ke), input_precision=PREC)
            plain += tl.dot(qo, tl.trans(ko), input_precision=PREC)
            den = tl.sum(tl.where(causal, plain, 0.0), axis=1)
            den += tl.sum(qe * z_even[None, :], axis=1) + tl.sum(qo * z_odd[None, :], axis=1) + eps
            num = num / den[:, None]
            tl.store(den_ptr + offs_t, den, mask=mt)
            z_even += tl.sum(ke, axis=0)
            z_odd += tl.sum(ko, axis=0)
        tl.store(o_ptr + offs_t[:, None] * DV + offs_dv[None, :], num.to(o_ptr.dtype.element_ty),
                 mask=mt[:, None] & mdv[None, :])
        s_even += tl.dot(tl.trans(kre), v, input_precision=PREC)
        s_odd += tl.dot(tl.trans(kro), v, input_precision=PREC)


@triton.jit
def _row_grads(do_ptr, o_ptr, den_ptr, offs_t, mt, offs_dv, mdv, DV, NORMALIZE: tl.constexpr):
    """g = do/den (BT, BLOCK_DV) and δ = −(do·o)/den (BT,), fp32; (do, 0) without normalisation."""
    m2 = mt[:, None] & mdv[None, :]
    do = tl.load(do_ptr + offs_t[:, None] * DV + offs_dv[None, :], mask=m2, other=0.0).to(tl.float32)
    if NORMALIZE:
        o = tl.load(o_ptr + offs_t[:, None] * DV + offs_dv[None, :], mask=m2, other=0.0).to(tl.float32)
        den = tl.load(den_ptr + offs_t, mask=mt, other=1.0)
        g = do / den[:, None]
        delta = -tl.sum(do * o, axis=1) / den
    else:
        g = do
        delta = tl.sum(do, axis=1) * 0.0
    return g, delta


@triton.jit
def _dq_sweep(
    k_ptr, v_ptr, o_ptr, den_ptr, do_ptr, dq_ptr, theta, N, D, DV,
    BT: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr,
    ROPE: tl.constexpr, NORMALIZE: tl.constexpr, PREC: tl.constexpr,
):
    """The backward's first sweep, forward in time: dq of one (batch, head)."""
    offs_h = tl.arange(0, BLOCK_DH)
    offs_dv = tl.arange(0, BLOCK_DV)
    mdv = offs_dv < DV
    s_even = tl.zeros((BLOCK_DH, BLOCK_DV), dtype=tl.float32)
    s_odd = tl.zeros((BLOCK_DH, BLOCK_DV), dtype=tl.float32)
    z_even = tl.zeros((BLOCK_DH,), dtype=tl.float32)
    z_odd = tl.zeros((BLOCK_DH,), dtype=tl.float32)
    for start in range(0, N, BT):
        offs_t = start + tl.arange(0, BT)
        mt = offs_t < N
        causal = offs_t[:, None] >= offs_t[None, :]
        ke, ko = _load_even_odd(k_ptr, offs_t, mt, offs_h, D)
        v = _load_rows(v_ptr, offs_t, mt, offs_dv, mdv, DV)
        g, delta = _row_grads(do_ptr, o_ptr, den_ptr, offs_t, mt, offs_dv, mdv, DV, NORMALIZE)
        if ROPE:
            cos, sin = _angles(offs_t, theta)
            kre, kro = _rotate(ke, ko, cos, sin)
        else:
            kre, kro = ke, ko
        gv = tl.where(causal, tl.dot(g, tl.trans(v), input_precision=PREC), 0.0)  # (t, s): g_t·v_s
        dqe = tl.dot(gv, kre, input_precision=PREC) + tl.dot(g, tl.trans(s_even), input_precision=PREC)
        dqo = tl.dot(gv, kro, input_precision=PREC) + tl.dot(g, tl.trans(s_odd), input_precision=PREC)
        if ROPE:  # transpose rotation (by −angle) of the numerator gradient
            dqe, dqo = _rotate(dqe, dqo, cos, -sin)
        if NORMALIZE:
            dmat = tl.where(causal, delta[:, None], 0.0)  # (t, s): δ_t
            dqe += tl.dot(dmat, ke, input_precision=PREC) + delta[:, None] * z_even[None, :]
            dqo += tl.dot(dmat, ko, input_precision=PREC) + delta[:, None] * z_odd[None, :]
            z_even += tl.sum(ke, axis=0)
            z_odd += tl.sum(ko, axis=0)
        _store_even_odd(dq_ptr, dqe, dqo, offs_t, mt, offs_h, D)
        s_even += tl.dot(tl.trans(kre), v, input_precision=PREC)
        s_odd += tl.dot(tl.trans(kro), v, input_precision=PREC)


@triton.jit
def _dkdv_sweep(
    q_ptr, k_ptr, v_ptr, o_ptr, den_ptr, do_ptr, dk_ptr, dv_ptr, theta, N, D, DV,
    BT: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr,
    ROPE: tl.constexpr, NORMALIZE: tl.constexpr, PREC: tl.constexpr,
):
    """The backward's second sweep, backward in time: dk and dv of one (batch, head)."""
    offs_h = tl.arange(0, BLOCK_DH)
    offs_dv = tl.arange(0, BLOCK_DV)
    mdv = offs_dv < DV
    ds_even = tl.zeros((BLOCK_DH, BLOCK_DV), dtype=tl.float32)  # Σ_{later t} q̃_tᵀ g_t
    ds_odd = tl.zeros((BLOCK_DH, BLOCK_DV), dtype=tl.float32)
    dz_even = tl.zeros((BLOCK_DH,), dtype=tl.float32)  # Σ_{later t} δ_t q_t
    dz_odd = tl.zeros((BLOCK_DH,), dtype=tl.float32)
    n_chunks = tl.cdiv(N, BT)
    for i in range(0, n_chunks):
        offs_t = (n_chunks - 1 - i) * BT + tl.arange(0, BT)
        mt = offs_t < N
        anti = offs_t[:, None] <= offs_t[None, :]  # (s, t): t ≥ s
        qe, qo = _load_even_odd(q_ptr, offs_t, mt, offs_h, D)
        ke, ko = _load_even_odd(k_ptr, offs_t, mt, offs_h, D)
        v = _load_rows(v_ptr, offs_t, mt, offs_dv, mdv, DV)
        g, delta = _row_grads(do_ptr, o_ptr, den_ptr, offs_t, mt, offs_dv, mdv, DV, NORMALIZE)
        if ROPE:
            cos, sin = _angles(offs_t, theta)
            qre, qro = _rotate(qe, qo, cos, sin)
            kre, kro = _rotate(ke, ko, cos, sin)
        else:
            qre, qro, kre, kro = qe, qo, ke, ko
        vg = tl.where(anti, tl.dot(v, tl.trans(g), input_precision=PREC), 0.0)  # (s, t): v_s·g_t
        dke = tl.dot(vg, qre, input_precision=PREC) + tl.dot(v, tl.trans(ds_even), input_precision=PREC)
        dko = tl.dot(vg, qro, input_precision=PREC) + tl.dot(v, tl.trans(ds_odd), input_precision=PREC)
        kq = tl.dot(kre, tl.trans(qre), input_precision=PREC)
        kq += tl.dot(kro, tl.trans(qro), input_precision=PREC)
        kq = tl.where(anti, kq, 0.0)  # (s, t): k̃_s·q̃_t
        dv = tl.dot(kq, g, input_precision=PREC)
        dv += tl.dot(kre, ds_even, input_precision=PREC) + tl.dot(kro, ds_odd, input_precision=PREC)
        if ROPE:
            dke, dko = _rotate(dke, dko, cos, -sin)
        if NORMALIZE:
            emat = tl.where(anti, delta[None, :], 0.0)  # (s, t): δ_t
            dke += tl.dot(emat, qe, input_precision=PREC) + dz_even[None, :]
            dko += tl.dot(emat, qo, input_precision=PREC) + dz_odd[None, :]
            dz_even += tl.sum(delta[:, None] * qe, axis=0)
            dz_odd += tl.sum(delta[:, None] * qo, axis=0)
        _store_even_odd(dk_ptr, dke, dko, offs_t, mt, offs_h, D)
        tl.store(dv_ptr + offs_t[:, None] * DV + offs_dv[None, :], dv.to(dv_ptr.dtype.element_ty),
                 mask=mt[:, None] & mdv[None, :])
        ds_even += tl.dot(tl.trans(qre), g, input_precision=PREC)
        ds_odd += tl.dot(tl.trans(qro), g, input_precision=PREC)


@autotune(_CONFIGS, key=["BLOCK_DH", "BLOCK_DV", "ROPE", "NORMALIZE"])
@triton.jit
def _causal_linear_bwd_kernel(
    q_ptr, k_ptr, v_ptr, theta_ptr, o_ptr, den_ptr, do_ptr,
    dq_ptr, dk_ptr, dv_ptr,
    N, H, D, DV,
    BT: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr,
    ROPE: tl.constexpr, NORMALIZE: tl.constexpr, PREC: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    i_h = i_bh % H
    q_ptr += i_bh * N * D
    k_ptr += i_bh * N * D
    dq_ptr += i_bh * N * D
    dk_ptr += i_bh * N * D
    v_ptr += i_bh * N * DV
    dv_ptr += i_bh * N * DV
    o_ptr += i_bh * N * DV
    do_ptr += i_bh * N * DV
    den_ptr += i_bh * N
    offs_h = tl.arange(0, BLOCK_DH)
    theta = tl.load(theta_ptr + i_h * (D // 2) + offs_h, mask=offs_h < D // 2, other=0.0)
    _dq_sweep(k_ptr, v_ptr, o_ptr, den_ptr, do_ptr, dq_ptr, theta, N, D, DV,
              BT, BLOCK_DH, BLOCK_DV, ROPE, NORMALIZE, PREC)
    _dkdv_sweep(q_ptr, k_ptr, v_ptr, o_ptr, den_ptr, do_ptr, dk_ptr, dv_ptr, theta, N, D, DV,
                BT, BLOCK_DH, BLOCK_DV, ROPE, NORMALIZE, PREC)


def _precision(dtype: torch.dtype) -> str:
    return dot_precision(dtype) if dtype == torch.float32 else "tf32"


def _theta_or_dummy(theta: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    return theta if theta is not None else torch.zeros(1, device=device, dtype=torch.float32)


def causal_linear_fwd(q, k, v, theta, normalize: bool, eps: float):
    B, H, N, D = q.shape
    DV = v.shape[-1]
    o = torch.empty_like(v)
    den = torch.empty(B, H, N, device=q.device, dtype=torch.float32) if normalize else o.new_empty(1)
    _causal_linear_fwd_kernel[(B * H,)](
        q, k, v, _theta_or_dummy(theta, q.device), o, den, N, H, D, DV, eps,
        BLOCK_DH=next_pow2((D + 1) // 2), BLOCK_DV=next_pow2(DV),
        ROPE=theta is not None, NORMALIZE=normalize, PREC=_precision(q.dtype),
    )
    return o, den


def causal_linear_bwd(q, k, v, theta, o, den, do, normalize: bool):
    B, H, N, D = q.shape
    DV = v.shape[-1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _causal_linear_bwd_kernel[(B * H,)](
        q, k, v, _theta_or_dummy(theta, q.device), o, den, do, dq, dk, dv, N, H, D, DV,
        BLOCK_DH=next_pow2((D + 1) // 2), BLOCK_DV=next_pow2(DV),
        ROPE=theta is not None, NORMALIZE=normalize, PREC=_precision(q.dtype),
    )
    return dq, dk, dv


class CausalLinearAttentionFunction(torch.autograd.Function):
    """Triton forward and backward; saves q, k, v, o and the fp32 denominators (B·H·N)."""

    @staticmethod
    def forward(ctx, q, k, v, theta, normalize, eps):
        o, den = causal_linear_fwd(q, k, v, theta, normalize, eps)
        ctx.save_for_backward(q, k, v, theta, o, den)
        ctx.normalize = normalize
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, theta, o, den = ctx.saved_tensors
        dq, dk, dv = causal_linear_bwd(q, k, v, theta, o, den, do.contiguous(), ctx.normalize)
        return dq, dk, dv, None, None, None
