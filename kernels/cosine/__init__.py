"""Cotten4Rec bidirectional cosine attention (spec cotten4rec.md §1, §2, §10).

Per batch b and head h (n_b = number of True entries of ``mask[b]``, ε = 1e-6)::

    q̂_i = mask_i · q_i / sqrt(|q_i|² + ε)          k̂_i likewise
    v′_i = mask_i · v_i / max(1, n_b ** sigmoid(m_h))
    S    = Σ_i k̂_iᵀ v′_i            (d × dv, fp32 accumulation)
    o_i  = q̂_i S                    (rows with mask_i = False are exactly 0)

Bidirectional: every real position attends to every real position.  There is no 1/√d and no softmax
denominator.  ``m`` is the learnable per-head exponent parameter (the Cottention reference initialises it to
0.5; σ(0.5) ≈ 0.62).

Causal variant: there is deliberately no ``causal_cosine_attention``.  Causal cosine attention
(Cottention's GPT form, o_t = Σ_{s≤t} (q̂_t·k̂_s) v′_s) is exactly ``causal_linear_attention`` on
pre-normalised inputs without a denominator::

    r = lambda x: x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)
    o = causal_linear_attention(r(q), r(k) * keep, v * keep / c, normalize=False)

(keep = mask[:, None, :, None]; c = the caller's value scale).  The row normalisation is a cheap
row-wise map that autograd differentiates (its Jacobian included), exactly like LinRec's L2 features, so
a second causal kernel would duplicate the chunked one for no gain.

Files: ``naive.py`` (torch references, incl. the N×N form), ``fused.py`` (Triton kernels + autograd Function).
"""

from __future__ import annotations

import torch

from .._common import MAX_TRITON_HEAD_DIM, _triton_check, check_float, check_ndim, check_same
from .._dispatch import dispatch
from .naive import COSINE_EPS, naive_cosine_attention, naive_quadratic_cosine_attention, value_scale

__all__ = ["cosine_attention", "naive_cosine_attention", "naive_quadratic_cosine_attention", "COSINE_EPS"]

OP = "cosine_attention"


def _validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, m: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v), ("m", m)):
        check_float(name, t)
    check_ndim("q", q, 4, "(B, H, N, d)")
    check_ndim("k", k, 4, "(B, H, N, d)")
    check_ndim("v", v, 4, "(B, H, N, dv)")
    check_same("q, k, v", q, k, v)
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must be (B, H, N, dv) with (B, H, N) = {tuple(q.shape[:3])}, got {tuple(v.shape)}"
        )
    B, H, N, _ = q.shape
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool tensor (True = real item), got {got}")
    if mask.shape != (B, N):
        raise ValueError(f"mask must have shape (B, N) = {(B, N)}, got {tuple(mask.shape)}")
    if m.shape != (H,):
        raise ValueError(f"m must have shape (H,) = {(H,)}, got {tuple(m.shape)}")
    if mask.device != q.device or m.device != q.device:
        raise ValueError("mask and m must be on the device of q")


def cosine_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    m: torch.Tensor,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Bidirectional cosine attention with per-head value scaling (Cotten4Rec).

    Args:
        q, k: (B, H, N, d) raw, un-normalised projections (one dtype for q, k, v).
        v: (B, H, N, dv) values (dv may differ from d).
        mask: (B, N) bool, True = real item.  Padding may sit anywhere; masked rows are ignored as keys
            and output zeros (with zero gradients) as queries.
        m: (H,) learnable exponent parameter; V is divided by max(1, n_valid ** sigmoid(m)).
        backend: ``"triton"``, ``"reference"`` or ``"auto"``/None (see kernels/_dispatch.py).

    Returns:
        (B, H, N, dv) tensor in the dtype of ``v``.  Gradients flow to q, k, v and m.

    Non-contiguous inputs are made contiguous (a copy) on the Triton path.
    """
    _validate(q, k, v, mask, m)
    head_sizes = {"head dim d": (q.shape[-1], MAX_TRITON_HEAD_DIM), "value dim dv": (v.shape[-1], MAX_TRITON_HEAD_DIM)}
    path = dispatch(OP, q, backend, lambda: _triton_check(
        q, sizes=head_sizes, empty="empty sequence" if q.shape[2] == 0 else None))
    if path == "reference":
        return naive_cosine_attention(q, k, v, mask, m)
    from .._triton_utils import ensure_launchable
    from .fused import CosineAttentionFunction

    ensure_launchable(q)

    inv_c = value_scale(mask, m).float().contiguous()
    mask_u8 = mask.contiguous().view(torch.uint8)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return CosineAttentionFunction.apply(q, k, v, mask_u8, inv_c, COSINE_EPS)
