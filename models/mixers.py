"""Pieces shared by the linear-attention token mixers of LinRec, Cotten4Rec and RecGRELA.

All three replace softmax(QKᵀ)V by a kernelised product that is evaluated right to left,
``φ(Q) (φ(K)ᵀ V)``, so no L×L matrix is formed. They differ only in the feature map φ and in how
the result is normalised, so the shared part is small: splitting heads, zeroing padded keys and
values, and a multi-head mixer whose subclasses implement :meth:`LinearAttentionMixer.attend`.

The attention math itself lives in ``kernels`` (Triton on CUDA, a torch reference on CPU); the
mixers only prepare the feature-mapped q, k, v and call it.

Padding convention (left padding, see ``models.blocks``): padded keys and values are zeroed before
any sum, so a padded position never contributes to a real item's output. Padded *queries* may
produce anything; the encoder zeroes padded outputs and the objectives never score them.
"""

from __future__ import annotations

import torch
from torch import nn

from models.blocks import TokenMixer


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, L, H·d) → (B, H, L, d), contiguous d-slices per head."""
    batch, length, width = x.shape
    return x.view(batch, length, num_heads, width // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, d) → (B, L, H·d), the inverse of :func:`split_heads`."""
    batch, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * dim)


def zero_padding(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Zero the padded positions of a head-split tensor x (B, H, L, d); ``valid`` is (B, L) bool."""
    return x * valid[:, None, :, None].to(x.dtype)


def row_l2(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Unit-L2 rows over the feature dim, ``x / sqrt(|x|² + eps)``; eps keeps an all-zero row at 0, not NaN."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class LinearAttentionMixer(TokenMixer):
    """Multi-head attention without a softmax: q/k/v projections → ``attend`` → output projection.

    Subclasses implement ``attend(q, k, v, valid)`` on head-split tensors (B, H, L, d) and return
    (B, H, L, d). ``causal`` is fixed at construction; a causal ``attend`` must only use prefix sums.
    """

    def __init__(self, hidden_size: int, num_heads: int, causal: bool):
        super().__init__(causal)
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(t, self.num_heads) for t in self.qkv(x).chunk(3, dim=-1))
        return self.out(merge_heads(self.attend(q, k, v, valid)))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
