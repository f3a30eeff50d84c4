"""Chunked causal linear attention (RecGRELA's RELA made causal; LinRec; causal cosine attention).

    o_t = Σ_{s≤t} (rot_t(q_t)·rot_s(k_s)) v_s / (Σ_{s≤t} q_t·k_s + eps)     normalize=True
    o_t = Σ_{s≤t} (rot_t(q_t)·rot_s(k_s)) v_s                                normalize=False

* q, k are already feature-mapped by the caller (ELU+1 for RecGRELA, row-L2 for LinRec/cosine): the kernel
  applies no feature map.  With ``normalize=True`` the features should be positive (ELU+1) so that the
  denominator is positive; nothing is clamped.
* RoPE (``rope=True``) rotates q and k in the numerator only; the denominator uses the un-rotated features
  (RecGRELA / MLLA).  Positions are the padded indices 0..N−1; since RoPE scores depend only on t − s, left
  padding does not change the real items' scores.  Frequencies follow RecGRELA's *full-width* convention,
  see :func:`rope_theta` (per-head RoPE: fold heads into the batch).
* Padding is on the LEFT in this project: the caller zeroes k and v at padding, so padded positions add
  nothing to any state; a padded query then gets o = 0/eps = 0 (its gradient is 0 as well).

Files: ``naive.py`` (O(N²) and chunked torch references), ``chunk.py`` (Triton kernels + autograd Function).
"""

from __future__ import annotations

import torch

from .._common import MAX_TRITON_HEAD_DIM, _triton_check, check_float, check_ndim, check_same
from .._dispatch import dispatch
from .naive import (
    apply_rope,
    naive_chunk_causal_linear_attention,
    naive_quadratic_causal_linear_attention,
    rope_theta,
)

__all__ = [
    "causal_linear_attention",
    "naive_chunk_causal_linear_attention",
    "naive_quadratic_causal_linear_attention",
    "apply_rope",
    "rope_theta",
]

OP = "causal_linear_attention"


def _validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: bool, eps: float) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
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
    if rope and q.shape[-1] % 2:
        raise ValueError(f"rope=True needs an even head dim (pairs of features), got d={q.shape[-1]}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def causal_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    normalize: bool = True,
    rope: bool = False,
    rope_base: float = 10000.0,
    eps: float = 1e-6,
    backend: str | None = None,
) -> torch.Tensor:
    """Causal linear attention, chunked; Triton forward and backward on CUDA.

    Args:
        q, k: (B, H, N, d) feature-mapped queries/keys (one dtype with v).
        v: (B, H, N, dv) values.
        normalize: divide by Σ_{s≤t} q_t·k_s + eps (un-rotated) when True.
        rope: rotate q, k in the numerator (RecGRELA full-width convention, positions 0..N−1).
        rope_base: RoPE base (10000 in RecGRELA).
        eps: added to the denominator (RecGRELA: 1e-6).
        backend: ``"triton"``, ``"reference"`` or ``"auto"``/None.

    Returns:
        (B, H, N, dv) in the dtype of v.  Non-contiguous inputs are copied to contiguous on the Triton path.
    """
    _validate(q, k, v, rope, eps)
    head_sizes = {"head dim d": (q.shape[-1], MAX_TRITON_HEAD_DIM), "value dim dv": (v.shape[-1], MAX_TRITON_HEAD_DIM)}
    path = dispatch(OP, q, backend, lambda: _triton_check(
        q, sizes=head_sizes, empty="empty sequence" if q.shape[2] == 0 else None))
    kwargs = dict(normalize=normalize, rope=rope, rope_base=rope_base, eps=eps)
    if path == "reference":
        return naive_chunk_causal_linear_attention(q, k, v, **kwargs)
    from .._triton_utils import ensure_launchable
    from .chunk import CausalLinearAttentionFunction

    ensure_launchable(q)

    theta = rope_theta(q.shape[1], q.shape[-1], rope_base, q.device).contiguous() if rope else None
    return CausalLinearAttentionFunction.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), theta, bool(normalize), float(eps)
    )
