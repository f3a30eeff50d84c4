"""Pure-torch references for Cotten4Rec's bidirectional cosine attention (spec cotten4rec.md §1, §10.1).

Both functions are differentiable by autograd and run on any device/dtype; they compute in fp32 (fp64 when
given fp64) and return the input dtype, mirroring the Triton kernels' fp32 accumulation.
"""

from __future__ import annotations

import torch

from .._common import _compute_dtype

# eps inside the square root of the row norm: ||x|| -> sqrt(sum x^2 + eps) (paper §3.4). A zero row (e.g. a
# zeroed padding row) then normalises to zero instead of NaN.
COSINE_EPS = 1e-6



def value_scale(mask: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """1 / max(1, n_valid ** sigmoid(m)) per (batch, head), shape (B, H), differentiable in ``m``.

    ``n.clamp(min=1) ** s`` equals ``max(1, n ** s)`` for integer n >= 0 and s in (0, 1), and avoids the
    0 ** s (log 0) gradient of an all-padding row.
    """
    n_valid = mask.sum(dim=1).to(_compute_dtype(m)).clamp(min=1.0)  # (B,)
    return n_valid[:, None].pow(-torch.sigmoid(m.to(_compute_dtype(m)))[None, :])  # (B, H)


def _normalise(x: torch.Tensor, maskf: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps) * maskf


def naive_cosine_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    m: torch.Tensor,
    eps: float = COSINE_EPS,
) -> torch.Tensor:
    """Reassociated form O = Q̂ (K̂ᵀ V′): O(N d²) time, a d×d intermediate per (batch, head)."""
    dt = _compute_dtype(q)
    maskf = mask[:, None, :, None].to(dt)
    qh = _normalise(q.to(dt), maskf, eps)
    kh = _normalise(k.to(dt), maskf, eps)
    vs = v.to(dt) * maskf * value_scale(mask, m.to(dt))[:, :, None, None]
    state = kh.transpose(-1, -2) @ vs  # (B, H, d, dv)
    return (qh @ state).to(q.dtype)


def naive_quadratic_cosine_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    m: torch.Tensor,
    eps: float = COSINE_EPS,
) -> torch.Tensor:
    """The N×N form (Q̂ K̂ᵀ) V′ -- the paper's Eq. 8 read literally; only for tests and the benchmark."""
    dt = _compute_dtype(q)
    maskf = mask[:, None, :, None].to(dt)
    qh = _normalise(q.to(dt), maskf, eps)
    kh = _normalise(k.to(dt), maskf, eps)
    vs = v.to(dt) * maskf * value_scale(mask, m.to(dt))[:, :, None, None]
    return ((qh @ kh.transpose(-1, -2)) @ vs).to(q.dtype)
