"""LISA (Wu et al., WWW 2021): linear-time self-attention over codeword histograms.

Each item embedding is quantized by B codebooks of W codewords. Within one codebook every item mapped
to codeword w has the same key and value, so causal attention over the L positions becomes attention
over the W codewords, each weighted by its count in the prefix (a cumulative histogram). With B
codebooks the model runs one such attention per codebook, the query being the item's own codeword in
that codebook, and sums the B outputs (Eq. 9-11). The codeword-codeword logits come from a B×W×W table,
so a sequence costs O(L·B·W) for the weights and O(L·B·W·D) for the output: there is no L×L tensor
anywhere. The attention itself is :func:`kernels.causal_histogram_attention` (Triton on CUDA, the torch
reference elsewhere); this file builds its inputs.

Choices where the paper is silent (where paper and code differ we follow the authors' code, which produced
the paper's numbers):
1. **Quantizer**: residual ("recurrent") encoding with full-D codewords and a bilinear similarity
   r·U·c shared by the B codebooks, no linear terms (code, not Eq. 2); deterministic tempered softmax
   π = softmax(logits / τ), τ = 0.7, **no Gumbel noise**; hard straight-through assignment
   ĥ = π + stopgrad(onehot(argmax) − π), so the forward pass is exactly hard.
2. **Attention**: per-codebook Q/K/V projections of the codewords (code; Eq. 11 has one shared set),
   M_b = (C_b P^Q_b)(C_b P^K_b)ᵀ / √D (the code's 1/√D, absent from the paper), values C_b P^V_b; the
   B outputs are summed, no output projection, no attention dropout; the table is rebuilt every forward.
   The query code is the (detached) argmax.
3. **Histogram decay**: the authors' code decays the histogram, F̃_i = γ F̃_{i−1} + ĥ_i with
   γ = exp(−λ). ``decay`` is λ and **defaults to the code's 0.1** (≈ 10 items per e-fold); ``decay=0``
   gives the paper's plain prefix sums, where word order enters only through the position embeddings.
   The current item is counted (no self-exclusion).
4. **Padding**: the contract is left padding, so assignments at padding are zeroed before the histogram
   (the kernel then gives exactly 0 there) and padding never enters a prefix count.
5. **Block** (code): z = drop(x̂ + p) with a learned position table (added to the residual stream only,
   never to the codes), y = LN(z + drop(o)), h = LN(y + drop(FFN(y))), ReLU FFN of width ``inner_size``
   (= D in the paper); one layer (the paper's multi-layer extension is not evaluated there).
6. **Initialisation** (code): lookups scaled by √D, Xavier-normal item and position tables with row 0 zeroed,
   U Xavier-normal, FFN Xavier-uniform with zero biases. The codebooks (Xavier-normal) and the Q/K/V
   projections (Xavier-uniform) are each initialised as ONE 3-d stack, ``init="authors"`` (default): torch
   computes a 3-d tensor's fans as fan_in = size(1)·size(2), fan_out = size(0)·size(2), so a (B, W, D) =
   8 × 128 × 128 stack gets std √(2 / (W·D + B·D)) ≈ 0.011 (8 × 32 × 128: ≈ 0.020). ``init="per_matrix"``
   initialises each (W, D) or (D, D) matrix alone, std √(2 / (W + D)) ≈ 0.088 at W = D = 128: the form of
   runs recorded before the key existed, kept as an ablation. At the authors' scale the
   codeword sums (Base's and Mini's targets) start small, so the first scores are near 0 and the initial BCE
   (positive plus negative term) is near 2·log 2, as SASRec's; per matrix it starts over twice as high.
7. **Variants**: ``base`` = hard codes, targets are the same quantizer's hard codeword sums (8×128 on
   ML-1M, 8×256 elsewhere); ``soft`` = the softmax π in the histogram, the soft reconstruction Σ π·C
   as the sequence input, raw (unquantized) targets, and the code's auxiliary loss
   ``aux_weight``·mean‖e − stopgrad(x̃)‖² (0.01; paper W = 16); ``mini`` = hard codes on small sequence
   codebooks (paper 8×32) plus separate target codebooks (``target_codebooks`` × ``target_codewords``,
   8×128 on ML-1M) with their own U. The dataclass defaults are LISA-Base on ML-1M; the search spaces
   set the paper's W per variant.
8. **Objective**: the authors train with BCE and one uniform negative per position, so ``bce`` is the
   default; the model is causal, so ``causal`` (full CE at every position) and ``last`` are offered too.
   The authors' sequences are each user's newest window; the zoo trains on windows over each user's whole
   history (``window_step``: ``max_len`` / 5 apart, each training item a target once an epoch), as it does
   every causal family whose validation improved with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kernels import causal_histogram_attention
from models.base import ModelConfig, SeqRecModel, knob, one_of, positive, probability
from models.blocks import FeedForward, right_aligned_positions
from models.registry import register

VARIANTS = ("base", "soft", "mini")
INITS = ("authors", "per_matrix")  # choice 6 of the module docstring
ONE_CODEWORD = "(one codeword cannot tell items apart)"


@dataclass
class LISAConfig(ModelConfig):
    hidden_size: int = 128
    num_codebooks: int = positive(8)  # B
    # W of the sequence codebooks (paper: Base 128 on ML-1M, Soft 16, Mini 32)
    num_codewords: int = knob(128, at_least=2, why=ONE_CODEWORD)
    variant: str = one_of("base", VARIANTS)
    # mini only: the separate target quantizer
    target_codebooks: int = knob(8, at_least=1, only_if=("variant", "mini"))
    target_codewords: int = knob(128, at_least=2, why=ONE_CODEWORD, only_if=("variant", "mini"))
    temperature: float = knob(0.7, above=0)  # τ of the quantizer's tempered softmax
    # λ of the decayed histogram, γ = exp(−λ); 0 = plain cumulative histogram
    decay: float = knob(0.1, at_least=0, why="(0 = no decay)")
    aux_weight: float = knob(0.01, at_least=0)  # soft only: weight of the reconstruction loss
    inner_size: int = positive(128)
    dropout: float = probability(0.1)
    init: str = one_of("authors", INITS)  # the codebook and Q/K/V stacks: one 3-d tensor each, or per matrix



def init_stack(stack: torch.Tensor, init: Callable[[torch.Tensor], Any], per_matrix: bool) -> None:
    """``init`` (an ``nn.init`` function) on a (B, …) parameter stack: as one tensor, whose fans torch computes
    from all its dimensions, or on each of its B matrices alone (module docstring, choice 6)."""
    for tensor in (stack.data if per_matrix else [stack.data]):
        init(tensor)


class Quantized(NamedTuple):
    assign: torch.Tensor  # (..., B, W): straight-through one-hot ĥ, or π for soft assignments
    codes: torch.Tensor  # (..., B) long: argmax code per codebook
    vectors: torch.Tensor  # (..., D): Σ_b assign_b · C_b, the quantized (or soft-reconstructed) embedding


class ResidualQuantizer(nn.Module):
    """B codebooks of W codewords; codebook b encodes the residual left by codebooks 1..b−1."""

    def __init__(self, num_codebooks: int, num_codewords: int, hidden_size: int, temperature: float,
                 per_matrix_init: bool = False):
        super().__init__()
        self.codebooks = nn.Parameter(torch.empty(num_codebooks, num_codewords, hidden_size))
        self.bilinear = nn.Parameter(torch.empty(hidden_size, hidden_size))  # U, shared by the codebooks
        self.temperature = temperature
        init_stack(self.codebooks, nn.init.xavier_normal_, per_matrix_init)
        nn.init.xavier_normal_(self.bilinear)

    def forward(self, x: torch.Tensor, soft: bool = False) -> Quantized:
        residual, assigns, codes, vectors = x, [], [], 0.0
        # r·U·cᵀ as r·(U·Cᵀ): a (D, W) product per codebook and step, instead of a (D, D) one per position
        similarities = self.bilinear @ self.codebooks.transpose(1, 2)  # (B, D, W)
        for book, similarity in zip(self.codebooks, similarities):
            logits = residual @ similarity
            probs = (logits / self.temperature).softmax(-1)
            code = logits.argmax(-1)
            if soft:
                assign, chosen = probs, probs @ book
            else:
                # straight-through: exactly one-hot forward, gradient of the tempered softmax backward
                assign = probs + (F.one_hot(code, book.shape[0]).to(probs) - probs).detach()
                chosen = StraightThroughPick.apply(probs, code, book)
            residual = residual - chosen
            assigns.append(assign)
            codes.append(code)
            vectors = vectors + chosen
        return Quantized(torch.stack(assigns, -2), torch.stack(codes, -1), vectors)


class StraightThroughPick(torch.autograd.Function):
    """``ĥ @ C`` for the straight-through ĥ = π + stopgrad(onehot(code) − π), without the (…, W) × (W, D) matmuls.

    Forward, ĥ is exactly one-hot, so the product is the chosen codeword: a gather. Backward, the gradient to π
    is g·Cᵀ (as through ĥ) and the gradient to C is ĥᵀ·g, i.e. g added to the chosen rows: an index_add. The
    values equal the matmul's (a one-hot product adds zeros only); the gradients agree to float rounding.
    """

    @staticmethod
    def forward(ctx, probs: torch.Tensor, code: torch.Tensor, book: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(code, book)
        return book[code]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        code, book = ctx.saved_tensors
        grad_book = torch.zeros_like(book).index_add_(0, code.reshape(-1), grad.reshape(-1, book.shape[1]))
        return grad @ book.T, None, grad_book


@register("lisa")
class LISA(SeqRecModel):
    config_class = LISAConfig
    objectives = ("causal", "last", "bce")
    default_objective = "bce"
    whole_history_windows = True  # chosen on validation by benchmarks/defaults_search.py

    def __init__(self, config: LISAConfig):
        super().__init__(config)
        c = config
        d, books = c.hidden_size, c.num_codebooks
        self.items = nn.Embedding(c.num_items + 1, d, padding_idx=0)
        self.positions = nn.Embedding(c.max_len, d)
        per_matrix = c.init == "per_matrix"
        self.quantizer = ResidualQuantizer(books, c.num_codewords, d, c.temperature, per_matrix)
        self.target_quantizer = (ResidualQuantizer(c.target_codebooks, c.target_codewords, d, c.temperature,
                                                   per_matrix) if c.variant == "mini" else None)
        self.query_proj, self.key_proj, self.value_proj = (nn.Parameter(torch.empty(books, d, d)) for _ in range(3))
        self.ffn = FeedForward(d, c.inner_size, c.dropout, activation="relu")
        self.norm_attn, self.norm_ffn = nn.LayerNorm(d), nn.LayerNorm(d)
        self.dropout = nn.Dropout(c.dropout)
        self.gamma = math.exp(-c.decay) if c.decay > 0 else None
        self.scale = math.sqrt(d)

        nn.init.xavier_normal_(self.items.weight)
        nn.init.xavier_normal_(self.positions.weight)
        with torch.no_grad():
            self.items.weight[0].zero_()
        for proj in (self.query_proj, self.key_proj, self.value_proj):
            init_stack(proj, nn.init.xavier_uniform_, per_matrix)
        for linear in (self.ffn.up, self.ffn.down):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def embed(self, items: torch.Tensor) -> torch.Tensor:
        return self.items(items) * self.scale

    def embed_all(self) -> torch.Tensor:
        """Scaled embeddings of every item id, row 0 (padding) included: (num_items + 1, D)."""
        return self.items.weight * self.scale

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (B, W, W) codeword logit table M (1/√D included) and the (B, W, D) value codewords."""
        books = self.quantizer.codebooks
        queries, keys = books @ self.query_proj, books @ self.key_proj
        return queries @ keys.transpose(1, 2) / self.scale, books @ self.value_proj

    def histogram_attention(self, quantized: Quantized, valid: torch.Tensor) -> torch.Tensor:
        """Causal codeword-histogram attention of a quantized window: (B, L, D)."""
        assign = quantized.assign * valid[..., None, None]  # padding never enters a prefix histogram
        logits, values = self.tables()
        return causal_histogram_attention(assign, quantized.codes, logits, values, decay=self.gamma)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        valid = items > 0
        embedded = self.embed(items)
        soft = self.config.variant == "soft"
        quantized = self.quantizer(embedded, soft=soft)
        mixed = self.histogram_attention(quantized, valid)
        if soft and self.training:
            # the code's auxiliary loss: pull embeddings toward their (fixed) soft reconstructions
            error = (embedded - quantized.vectors.detach()).pow(2).sum(-1)
            self.record_aux_loss(self.config.aux_weight * error[valid].sum() / valid.sum().clamp(min=1))
        positions = right_aligned_positions(items.shape[1], self.config.max_len, items.device)
        x = self.dropout(quantized.vectors + self.positions(positions))
        x = self.norm_attn(x + self.dropout(mixed))
        x = self.norm_ffn(x + self.dropout(self.ffn(x)))
        return x * valid.unsqueeze(-1)

    def item_weights(self) -> torch.Tensor:
        """Targets per variant: Base the shared quantizer's codes, Mini its target quantizer, Soft raw embeddings."""
        embedded = self.embed_all()
        if self.config.variant == "soft":
            return embedded
        quantizer = self.target_quantizer if self.target_quantizer is not None else self.quantizer
        vectors = quantizer(embedded).vectors
        return torch.cat([torch.zeros_like(vectors[:1]), vectors[1:]])  # row 0 (padding) is never ranked
