"""RecGRELA (Hu et al., arXiv 2506.13315): gated blocks of Rotary-Enhanced Linear Attention (RELA).

Following the paper and its official code: embedding → ``LN(Dropout(E[items]))``, no
positional embedding (position enters only through RoPE), then L pre-LN GRELA blocks::

    G = LN1(H);  A = SiLU(G W_a);  X = G W_in
    H = H + DropPath((A ⊙ (RELA(X) + SiLU(CausalDWConv_k(X)))) W_out)
    H = H + Dropout(FFN_gelu(LN2(H)))

RELA, per head, with φ(x) = ELU(x) + 1, V = X (no value projection) and RoPE applied to φ(Q), φ(K)
over the full width D (head h owns frequency pairs h·d/2 … (h+1)·d/2 - 1), in the numerator only::

    O_t = Σ_s ⟨R_t φ(q_t), R_s φ(k_s)⟩ v_s / (Σ_s ⟨φ(q_t), φ(k_s)⟩ + ε),    ε = 1e-6

Defaults are the paper's: d = 64, 4 layers, 4 heads, FFN 256, dropout 0.1, DropPath 0.1, conv kernel 4,
max length 200, RoPE base 10000, LayerNorm eps 1e-12, N(0, 0.02) init (the conv keeps PyTorch's init).

Two forms, chosen by ``causal`` (recorded in the result row's config and as ``extra["rela_causal"]``):
- ``causal=False`` (default) is the paper's: the sums run over *all* L positions of the window, pads
  included, exactly as the official code computes them (``kv = (Kᵀ/√L)(V/√L)``,
  ``z = 1/(q·mean(k) + ε)``, so the effective ε is L·1e-6). Only the last position is read, so it trains
  with the ``last`` objective (RecBole's prefix CE), which is also how the paper trains it.
- ``causal=True`` sums over s ≤ t with padded keys and values zeroed, via
  ``kernels.causal_linear_attention(normalize=True, rope=True, eps=1e-6)``, so it can train with the
  ``causal`` objective (every position at once). This form is not in the paper. With no positional
  embedding, zeroed pads and relative RoPE, its outputs at real items do not depend on how much left
  padding a window has.
- Trimmed windows (the trainer drops the leading columns that are padding in every row of a batch): the
  causal form computes on the narrower window, since RoPE is relative (⟨R_t q, R_s k⟩ depends on s - t
  only) and the conv sees zeros before the first real item either way; only the rounding of the rotation
  angles differs. The paper's form includes the pads in its sums, so it pads a trimmed window back to
  ``max_len`` and spends the same compute as before: its results stay exactly the full-window ones.

Choices stated explicitly:
- The local shortcut's conv sees zeros, not pad embeddings, before the first real item: padded V rows
  are zeroed before the conv in both forms. The official code pads on the right, so its causal conv
  never sees a pad at a real position; zeroing reproduces that under this project's left padding.
- With one layer the official code drops the attention branch's residual
  (``x = DropPath(out_proj(...))``) but keeps the FFN's; that is reproduced (the paper's
  description drops both; the code does not).
- The conv kernel size is a knob (``conv_kernel_size``, the paper fixes 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from models.base import ModelConfig, SeqRecModel, heads, init_weights, knob, positive, probability
from models.blocks import DropPath, FeedForward, TokenMixer
from models.mixers import merge_heads, split_heads, zero_padding
from models.registry import register


class RELA(TokenMixer):
    """Rotary-enhanced linear attention plus the local shortcut, acting on X = in_proj(LN(H))."""

    def __init__(self, hidden_size: int, num_heads: int, conv_kernel_size: int, causal: bool,
                 rope_base: float = 10000.0, eps: float = 1e-6):
        super().__init__(causal)
        self.num_heads = num_heads
        self.qk = nn.Linear(hidden_size, 2 * hidden_size)
        # depthwise; left-pad by k-1 and keep the first L outputs → output t sees inputs t-k+1 … t
        self.conv = nn.Conv1d(hidden_size, hidden_size, conv_kernel_size, groups=hidden_size,
                              padding=conv_kernel_size - 1)
        self.rope_base = rope_base
        self.eps = eps

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        q, k = (F.elu(t) + 1.0 for t in self.qk(x).chunk(2, dim=-1))
        q, k, v = (split_heads(t, self.num_heads) for t in (q, k, x))
        if self.causal:
            mixed = kernels.causal_linear_attention(q, zero_padding(k, valid), zero_padding(v, valid), normalize=True,
                                                    rope=True, rope_base=self.rope_base, eps=self.eps)
        else:
            theta = kernels.rope_theta(self.num_heads, q.shape[-1], self.rope_base, q.device)
            kv = (kernels.apply_rope(k, theta).transpose(-1, -2) / length**0.5) @ (v / length**0.5)
            z = 1.0 / (q @ k.mean(dim=2, keepdim=True).transpose(-1, -2) + self.eps)
            mixed = kernels.apply_rope(q, theta) @ kv * z
        x = x * valid.unsqueeze(-1).to(x.dtype)
        local = F.silu(self.conv(x.transpose(1, 2))[..., :length]).transpose(1, 2)
        return merge_heads(mixed) + local


class GRELABlock(nn.Module):
    """Pre-LN gated RELA branch with DropPath, then a pre-LN GELU FFN; both residual (see module notes)."""

    def __init__(self, config: RecGRELAConfig, attention_residual: bool):
        super().__init__()
        c = config
        self.norm_mix = nn.LayerNorm(c.hidden_size, eps=1e-12)
        self.gate = nn.Linear(c.hidden_size, c.hidden_size)
        self.in_proj = nn.Linear(c.hidden_size, c.hidden_size)
        self.rela = RELA(c.hidden_size, c.num_heads, c.conv_kernel_size, c.causal, c.rope_base, c.eps)
        self.out_proj = nn.Linear(c.hidden_size, c.hidden_size)
        self.drop_path = DropPath(c.drop_path)
        self.norm_ffn = nn.LayerNorm(c.hidden_size, eps=1e-12)
        self.ffn = FeedForward(c.hidden_size, c.inner_size, c.dropout, "gelu")
        self.dropout = nn.Dropout(c.dropout)
        self.attention_residual = attention_residual

    def forward(self, h: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        g = self.norm_mix(h)
        branch = self.drop_path(self.out_proj(F.silu(self.gate(g)) * self.rela(self.in_proj(g), valid)))
        h = h + branch if self.attention_residual else branch
        return h + self.dropout(self.ffn(self.norm_ffn(h)))


@dataclass
class RecGRELAConfig(ModelConfig):
    num_layers: int = positive(4)
    num_heads: int = heads(4)
    inner_size: int = positive(256)
    dropout: float = probability(0.1)
    drop_path: float = probability(0.1)
    conv_kernel_size: int = positive(4)
    rope_base: float = knob(10000.0, above=1)
    eps: float = knob(1e-6, above=0)
    causal: bool = False

    def constraint_errors(self) -> list[tuple[str, str]]:
        errors = super().constraint_errors()
        if "num_heads" not in dict(errors) and (self.hidden_size // self.num_heads) % 2:
            errors.append(("num_heads", f"must leave an even head size for RoPE's feature pairs; hidden_size="
                                        f"{self.hidden_size} / num_heads={self.num_heads} = "
                                        f"{self.hidden_size // self.num_heads}"))
        return errors


@register("recgrela")
class RecGRELA(SeqRecModel):
    config_class = RecGRELAConfig
    # The class lists every objective some configuration supports; each instance narrows it by `causal`.
    objectives = ("causal", "last", "bce")
    default_objective = "last"

    def __init__(self, config: RecGRELAConfig):
        super().__init__(config)
        c = config
        self.narrow_objectives(c.causal, otherwise=("last",))
        self.items = nn.Embedding(c.num_items + 1, c.hidden_size, padding_idx=0)
        self.embedding_dropout = nn.Dropout(c.dropout)
        self.embedding_norm = nn.LayerNorm(c.hidden_size, eps=1e-12)
        self.blocks = nn.ModuleList([GRELABlock(c, attention_residual=c.num_layers > 1) for _ in range(c.num_layers)])
        self.apply(init_weights)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        width = items.shape[1]
        if not self.config.causal and width < self.config.max_len:
            # the paper's form sums over every position of the window, padding included: its outputs depend on the
            # amount of padding, so a trimmed window (module notes) is restored to the full width first
            items = F.pad(items, (self.config.max_len - width, 0))
        valid = items > 0
        h = self.embedding_norm(self.embedding_dropout(self.items(items)))
        for block in self.blocks:
            h = block(h, valid)
        return (h * valid.unsqueeze(-1))[:, -width:]

    def item_weights(self) -> torch.Tensor:
        return self.items.weight

    def stats(self) -> dict[str, float]:
        return {"rela_causal": float(self.config.causal)}
