"""Shared building blocks: embeddings, token mixers, feed-forward and the transformer block.

Models differ almost only in their token mixer (the attention), so the mixer is a pluggable
module with one signature: ``mixer(x, valid) -> x`` where ``x`` is (B, L, d) and ``valid`` is a
(B, L) bool mask, True at real items. Sequences are left-padded: position ``L - 1`` is always the
newest item. A window may be narrower than ``max_len`` (the trainer drops the leading columns that are padding
in every row of a batch), so positions count from the newest item: it always gets index ``max_len - 1``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION_BACKENDS = ("sdpa", "math")


class ItemEmbedding(nn.Module):
    """Item-id plus learned absolute position embedding, then optional LayerNorm and dropout.

    ``extra_tokens`` reserves ids past ``num_items`` (BERT4Rec's mask token).
    """

    def __init__(self, num_items: int, max_len: int, hidden_size: int, dropout: float,
                 layer_norm: bool = True, extra_tokens: int = 0, eps: float = 1e-12):
        super().__init__()
        self.items = nn.Embedding(num_items + 1 + extra_tokens, hidden_size, padding_idx=0)
        self.positions = nn.Embedding(max_len, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=eps) if layer_norm else nn.Identity()
        self.dropout = nn.Dropout(dropout)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        positions = right_aligned_positions(items.shape[1], self.positions.num_embeddings, items.device)
        return self.dropout(self.norm(self.items(items) + self.positions(positions)))


def right_aligned_positions(width: int, max_len: int, device: torch.device) -> torch.Tensor:
    """Position indices of a left-padded window of ``width`` columns: the newest item gets ``max_len - 1``.

    Counting from the right makes a trimmed window (leading padding columns dropped) see exactly the position
    embeddings of the full ``max_len`` window at every real item; at ``width == max_len`` it is ``0..max_len-1``.
    """
    if width > max_len:
        raise ValueError(f"a window of {width} items exceeds max_len={max_len}")
    return torch.arange(max_len - width, max_len, device=device)


class TokenMixer(nn.Module):
    """Mixes information across positions. ``causal`` says whether output t sees only inputs <= t."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def attention_mask(valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """Boolean (B, 1, L, L) mask, True where a query may attend to a key.

    Every position may attend to itself: with left padding a padded query would otherwise see no
    key at all and softmax would produce NaN. Padded outputs are never scored, so this is harmless.
    """
    length = valid.shape[1]
    allowed = valid[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    return allowed | torch.eye(length, dtype=torch.bool, device=valid.device)


def shared_attention_mask(valid: torch.Tensor, causal: bool, additive: bool = False) -> torch.Tensor:
    """:func:`attention_mask` of ``valid``, built once for all the layers that read the same ``valid``.

    ``additive=True`` gives it as a float mask (0 where allowed, -inf elsewhere), the form SDPA converts a boolean
    mask to on every call: converting once per forward gives the same scores with one conversion instead of one per
    layer.
    """
    if torch.compiler.is_compiling():  # a compiled graph builds (and fuses) the mask itself
        mask = attention_mask(valid, causal)
        return torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf")) if additive else mask
    # Every layer of one forward pass reads the same `valid` tensor, so its masks are kept on that tensor, per
    # (causal, additive): built once per forward instead of once per layer, and freed with `valid` (at B = 128,
    # L = 200 a float mask is 20 MB). Not a global cache, which kept the last mask until the next forward, nor a
    # weakref finalizer: Python ignores an exception raised at deallocation, a Ctrl-C's KeyboardInterrupt included.
    # The version check catches in-place edits of `valid`.
    masks = valid.__dict__.setdefault("_attention_masks", {})
    cached = masks.get((causal, additive))
    if cached is not None and cached[0] == valid._version:
        return cached[1]
    mask = attention_mask(valid, causal)
    if additive:
        mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
    masks[(causal, additive)] = (valid._version, mask)
    return mask


class SoftmaxAttention(TokenMixer):
    """Multi-head scaled dot-product attention, causal (SASRec) or bidirectional (BERT4Rec).

    ``backend="sdpa"`` uses ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels
    where available); ``"math"`` materialises the L×L score matrix, as the papers' baselines do,
    so the scalability study can report both.
    """

    def __init__(self, hidden_size: int, num_heads: int, attn_dropout: float, causal: bool,
                 backend: str = "sdpa"):
        super().__init__(causal)
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {backend!r}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)
        self.attn_dropout = attn_dropout
        self.backend = backend

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        dropout = self.attn_dropout if self.training else 0.0
        if self.backend == "sdpa":
            mask = shared_attention_mask(valid, self.causal, additive=True)
            mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout)
        else:
            mask = shared_attention_mask(valid, self.causal)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            weights = F.dropout(scores.masked_fill(~mask, float("-inf")).softmax(-1), dropout, self.training)
            mixed = weights @ v
        return self.out(mixed.transpose(1, 2).reshape(batch, length, hidden))


class FeedForward(nn.Module):
    """Linear → activation → Linear, RecBole's ``FeedForward`` without its residual and LayerNorm.

    RecBole drops out only the branch's output (the caller's ``x + drop(ffn(x))``), never between the two
    linears, so that is the default. ``inner_dropout=True`` adds ``dropout`` between them, the form this
    project used in its first releases; it is kept so results recorded with it can be reproduced.
    """

    def __init__(self, hidden_size: int, inner_size: int, dropout: float, activation: str = "gelu",
                 inner_dropout: bool = False):
        super().__init__()
        self.up = nn.Linear(hidden_size, inner_size)
        self.down = nn.Linear(inner_size, hidden_size)
        self.activation = {"gelu": nn.GELU(), "relu": nn.ReLU(), "silu": nn.SiLU()}[activation]
        self.dropout = nn.Dropout(dropout) if inner_dropout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.dropout(self.activation(self.up(x))))


class DropPath(nn.Module):
    """Stochastic depth (timm's ``DropPath``): drop a whole residual branch per sample with probability ``p``.

    Survivors are scaled by ``1 / (1 - p)`` so the branch's expected value is unchanged at test time.
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class TransformerBlock(nn.Module):
    """Token mixer + feed-forward, each with a residual connection and LayerNorm.

    ``norm_first=False`` is the post-LN block of SASRec/BERT4Rec in RecBole:
    ``x = LN(x + drop(mix(x)))``; ``norm_first=True`` is pre-LN: ``x = x + drop(mix(LN(x)))``.
    """

    def __init__(self, mixer: TokenMixer, hidden_size: int, inner_size: int, dropout: float,
                 activation: str = "gelu", norm_first: bool = False, eps: float = 1e-12,
                 ffn_inner_dropout: bool = False):
        super().__init__()
        self.mixer = mixer
        self.ffn = FeedForward(hidden_size, inner_size, dropout, activation, ffn_inner_dropout)
        self.norm_mix = nn.LayerNorm(hidden_size, eps=eps)
        self.norm_ffn = nn.LayerNorm(hidden_size, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        if self.norm_first:
            x = x + self.dropout(self.mixer(self.norm_mix(x), valid))
            return x + self.dropout(self.ffn(self.norm_ffn(x)))
        x = self.norm_mix(x + self.dropout(self.mixer(x, valid)))
        return self.norm_ffn(x + self.dropout(self.ffn(x)))


class TransformerEncoder(nn.Module):
    """A stack of :class:`TransformerBlock` over one mixer factory; zeroes padded outputs."""

    def __init__(self, blocks: list[TransformerBlock], final_norm: nn.Module | None = None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm if final_norm is not None else nn.Identity()

    @property
    def causal(self) -> bool:
        return all(block.mixer.causal for block in self.blocks)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, valid)
        return self.final_norm(x) * valid.unsqueeze(-1)


def next_item_query(items: torch.Tensor, mask_token: int, max_len: int) -> torch.Tensor:
    """The window a cloze model reads to ask "what comes next?": the mask token at the newest position.

    The oldest column is dropped only when the window would outgrow ``max_len``; a trimmed window (narrower than
    ``max_len``) keeps all its items, as the column a full window drops is padding in every row of a trimmed batch.
    """
    mask = torch.full_like(items[:, :1], mask_token)
    return torch.cat([items, mask], dim=1)[:, -max_len:]
