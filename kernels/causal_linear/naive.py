"""Pure-torch references for causal linear attention with optional numerator-only RoPE (RecGRELA's RELA,
spec recgrela.md §1.3, made causal as this project does; LinRec's causal form with normalize=False).

    o_t = Σ_{s≤t} (rot_t(q_t)·rot_s(k_s)) v_s / (Σ_{s≤t} q_t·k_s + eps)     (normalize=True)
    o_t = Σ_{s≤t} (rot_t(q_t)·rot_s(k_s)) v_s                                (normalize=False)

rot_t is the identity when rope=False.  Both references compute in fp32 (fp64 for fp64 inputs) and return
the dtype of ``v``:

* :func:`naive_quadratic_causal_linear_attention` -- the O(N²) masked form (materialises N×N; tests only);
* :func:`naive_chunk_causal_linear_attention`   -- the chunked form used as the dispatch reference: inter-chunk
  d×dv prefix states plus intra-chunk masked T×T products, O(N·T·d + N·d·dv/T·...) memory.
"""

from __future__ import annotations

import torch

from .._common import _compute_dtype


def rope_theta(
    num_heads: int, head_dim: int, base: float, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Rotation frequencies, shape (H, d/2), fp32.

    Convention (RecGRELA, spec §1.3 item 3-4): RoPE is applied over the *full* model width H·d **before** the
    head split, pairing dims (2j, 2j+1) of the concatenated vector with θ_j = base^(−j / (H·d/2)).  Head h
    therefore owns the global pairs j = h·d/2 … (h+1)·d/2 − 1 (head 0 the fastest frequencies).  With H = 1
    this is ordinary per-head RoPE; to get per-head RoPE for H > 1, fold the heads into the batch:
    ``q.reshape(B*H, 1, N, d)``.
    """
    half = head_dim // 2
    j = torch.arange(num_heads * half, dtype=torch.float32, device=device)
    theta = torch.pow(torch.tensor(float(base), dtype=torch.float64), -(j.double() / (num_heads * half)))
    return theta.to(device=device, dtype=torch.float32).reshape(num_heads, half)


def apply_rope(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (2j, 2j+1) of x (B, H, N, d) by angle pos·θ[h, j], pos = 0..N−1 (the padded index).

    Angles are formed in fp32 (pos·θ) exactly as the Triton kernel forms them; the rotation is computed in
    fp32 (fp64 for fp64 x) -- an fp16 angle of a few thousand radians would be meaningless -- and the result
    has the dtype of x."""
    N = x.shape[2]
    compute = torch.promote_types(x.dtype, torch.float32)
    pos = torch.arange(N, dtype=torch.float32, device=x.device)
    ang = (pos[None, :, None] * theta[:, None, :]).to(compute)  # (H, N, d/2)
    cos, sin = ang.cos(), ang.sin()
    xe, xo = x[..., 0::2].to(compute), x[..., 1::2].to(compute)
    return torch.stack((xe * cos - xo * sin, xe * sin + xo * cos), dim=-1).flatten(-2).to(x.dtype)


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: bool,
             rope_base: float) -> tuple[torch.Tensor, ...]:
    dt = _compute_dtype(v)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    if rope:
        theta = rope_theta(q.shape[1], q.shape[-1], rope_base, q.device)
        return q, k, v, apply_rope(q, theta), apply_rope(k, theta)
    return q, k, v, q, k


def _exclusive_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    zero = torch.zeros_like(x.narrow(dim, 0, 1))
    return torch.cat((zero, torch.cumsum(x, dim=dim).narrow(dim, 0, x.shape[dim] - 1)), dim=dim)


def naive_quadratic_causal_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    normalize: bool = True,
    rope: bool = False,
    rope_base: float = 10000.0,
    eps: float = 1e-6,
) -> torch.Tensor:
    """O(N²) masked reference: materialises the N×N score matrix."""
    out_dtype = v.dtype
    q, k, v, qr, kr = _prepare(q, k, v, rope, rope_base)
    N = q.shape[2]
    causal = torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    num = (qr @ kr.transpose(-1, -2)).masked_fill(~causal, 0.0) @ v
    if not normalize:
        return num.to(out_dtype)
    den = (q @ k.transpose(-1, -2)).masked_fill(~causal, 0.0).sum(-1, keepdim=True) + eps
    return (num / den).to(out_dtype)


def naive_chunk_causal_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    normalize: bool = True,
    rope: bool = False,
    rope_base: float = 10000.0,
    eps: float = 1e-6,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Chunked reference (the same algorithm as the Triton kernel, written with batched torch ops).

    ``chunk_size`` is the longest chunk: the N positions are cut into ceil(N / chunk_size) chunks of one length,
    the shortest that holds them, so a window of 50 is one chunk of 50 (not one of 64 with 14 rows of zeros) and
    a trimmed batch of 6 columns costs a tenth of a full one. This is the path every CPU model trains on.
    """
    out_dtype = v.dtype
    q, k, v, qr, kr = _prepare(q, k, v, rope, rope_base)
    B, H, N, D = q.shape
    DV = v.shape[-1]
    NT = max(1, -(-N // chunk_size))
    T = -(-N // NT)
    pad = NT * T - N
    if pad:
        # Zero rows appended at the END never influence earlier (causal) outputs; they are cut off below.
        q, k, v, qr, kr = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v, qr, kr))
    q, k, qr, kr = (t.reshape(B, H, NT, T, D) for t in (q, k, qr, kr))
    v = v.reshape(B, H, NT, T, DV)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()

    kv = kr.transpose(-1, -2) @ v  # (B, H, NT, D, DV) per-chunk contributions
    states = _exclusive_cumsum(kv, dim=2)  # state before each chunk
    num = qr @ states + (qr @ kr.transpose(-1, -2)).masked_fill(~causal, 0.0) @ v
    if normalize:
        ksum = k.sum(dim=3)  # (B, H, NT, D)
        z = _exclusive_cumsum(ksum, dim=2)
        den = (q * z[:, :, :, None, :]).sum(-1) + (q @ k.transpose(-1, -2)).masked_fill(~causal, 0.0).sum(-1)
        num = num / (den + eps)[..., None]
    return num.reshape(B, H, NT * T, DV)[:, :, :N].to(out_dtype)
