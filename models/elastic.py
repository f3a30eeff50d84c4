"""ELASTIC (Deng et al., AAAI 2025): Linear Dispatcher Attention + Interest Memory Retrieval.

Self-attention over the N items is replaced by two cross-attentions through k ≪ N interest tokens P
(aggregate: P attends over X; dispatch: X attends over the updated P), so a layer costs O(N·k). The k
tokens are retrieved per user from K = n×n interest experts with product keys (Lample et al. 2019),
which decouples capacity (K) from compute (k). The authors' code was never released; every gap the
paper leaves is resolved here as follows.

Choices where the paper is silent:
1. **Training objective**: the aggregation and the query network read the whole window, so the model
   is non-causal; it trains only with the ``last`` objective (RecBole's prefix windows, CE at the last
   position), which is what the paper's RecBole-style setup implies. This is the paper-faithful default
   and the only objective offered: ``causal``/``bce`` are refused by the trainer (no causal variant).
2. **Padding**: padded positions are masked out of the aggregation keys, out of the query network
   (zeroed before each pooling and masked in its self-attention) and out of the mean query, so a
   window's output does not depend on what sits in its padding.
3. **Source of P**: IMR runs **once**, on the input embeddings X⁰, and its k retrieved experts are P⁰;
   each LDA layer then carries P forward through Eq. 2 (the most literal reading). P is used as-is, with
   no shared base added.
4. **Gradient into the retrieval**: Algorithm 1 drops the scores, so keys and query network would get
   no gradient. Here P_j = k·softmax(s)_j · e_{idx_j}: the softmax over the k retrieved scores is
   Lample et al.'s memory read, and the factor k makes a uniform selection leave the experts unscaled.
5. **Product keys**: two sub-key sets of √K keys of size d/2; q₁ (first half of q) scores 𝒞, q₂ scores
   𝒞′ (fixing Eq. 7's typo); exact top-k over the k² candidate pairs; expert id i·√K + j. Sub-keys use
   Lample's uniform init. Two parts of Lample et al.'s memory (NeurIPS 2019) that the paper does not mention
   are settings, off by default (the paper's model as read here):
   - ``query_batchnorm``: BatchNorm1d(d) (affine, torch's momentum and eps) on q before it is split, Lample's
     remedy for queries that crowd onto a few keys. In training it normalises with the batch's statistics,
     so the rows of a batch depend on each other: the trainer then computes a training batch whole, never
     in length groups (:attr:`Elastic.mixes_rows_in_training`). A one-row training batch has no batch
     statistics and is normalised with the running ones.
   - ``key_heads`` H: H independent sets of sub-keys score the same q (Lample gives each head its own linear
     query map too; here the hierarchical query network is shared, and the heads differ by their keys),
     each head retrieves its own top-k with its own softmax gate, and the heads' retrieved experts are
     summed: interest token j is Σ_h k·softmax(s_h)_j · e_{idx_{h,j}}, still k tokens, so LDA's cost is
     unchanged and only the retrieval grows H-fold. Sub-key set 2h scores q₁ and 2h + 1 scores q₂ for head h,
     so a one-head model keeps its (2, √K, d/2) keys.
6. **Query network**: repeat [left-pad to a multiple of the pool size with masked zeros → reshape to
   (⌈n/stride⌉, stride·d) → Linear(stride·d, d) → self-attention with residual + LayerNorm] until the
   length is one; each level has its own weights; the number of levels is fixed by ``max_len``.
   Left-padding keeps the newest items aligned at the right end, so **max_len need not be divisible by
   the pool size** (no such constraint is declared), and a trimmed window (leading all-padding columns
   dropped by the trainer) forms the same groups as the full one: a missing group is an all-padding group.
   Self-attention is bidirectional, ``num_heads`` heads.
   Its first level attends over N/stride tokens: O(N²/stride²), the one super-linear term (at N = 256,
   stride 4: 64² = 4,096 scores, versus N·k = 2,048 per LDA layer).
7. **Block structure** (post-LN, as the repo's SASRec): P ← LN(P + drop(Aggregate(P, X))),
   X ← LN(X + drop(Dispatch(X, P))), then separate FFNs with residual + LayerNorm for X and for P
   (none for P in the last layer, whose P is never read again).
   Multi-head (``num_heads``, default 1: the paper scales by √d, i.e. one head), with output
   projections; separate weights per layer; attention-weight dropout ``attn_dropout``.
8. **Ablations** (Table 3): ``query_net="mean"`` uses the masked mean of X⁰ as q; ``imr=False`` uses one
   learnable P⁰ (k×d) shared by all users; ``dispatcher=False`` (undefined in the paper) drops the
   aggregation step: X attends directly to P⁰ in every layer and P is never updated from the sequence,
   so items interact only through the retrieved experts (with ``imr=False`` too, the model reduces to a
   per-position network of the item and its position; tests check both reduced forms).
9. **Hyperparameters the paper omits** use the repo's SASRec (RecBole) defaults: d = 64, 2 layers, inner
   size 256, GELU, dropout 0.5/0.5, N(0, 0.02) init. Paper values: K = 16×16, k = 8, N = 256 (ML-1M).
   The query-network pool size is not given; 4 is our choice (256 → 64 → 16 → 4 → 1).
10. **Expert-usage statistics** (Figure 4, Figure 5's dashed line): selections are counted only in eval
    mode, during the **first evaluation pass after a training step**. A pass starts where every evaluator
    starts ranking: the eval-mode call of :meth:`Elastic.item_weights` (``study.train.metrics.evaluate`` makes
    it once per pass). A training forward arms the counters; the first pass opened after it resets them and
    counts its retrievals; a later pass with no training in between (the trainer's test pass) counts nothing,
    and loading a state dict (the best epoch's) closes the counted pass.
    In ``study.train.trainer.run_trial`` this is exactly the validation split, one retrieval of k experts per
    user. The counts live in a buffer, so the best-epoch checkpoint carries its own validation counts and the
    final ``stats()`` describes the selected model. ``expert_usage_rate`` = fraction of the K
    experts selected at least once; ``expert_load_entropy`` = entropy (nats) of the selection shares,
    ``expert_load_entropy_norm`` = the same divided by log K (1 = perfectly balanced), ``expert_max_load`` =
    the most selected expert's share, ``expert_selections`` = k·H per user. With H key heads every head's
    selections are counted. The trainer records the best epoch's figures in the result row (``extra``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.base import ACTIVATIONS, ModelConfig, SeqRecModel, heads, init_weights, knob, one_of, positive, probability
from models.blocks import FeedForward, ItemEmbedding, SoftmaxAttention
from models.registry import register

QUERY_NETS = ("hierarchical", "mean")


@dataclass
class ElasticConfig(ModelConfig):
    num_layers: int = positive(2)
    num_heads: int = heads(1)
    inner_size: int = positive(256)
    dropout: float = probability(0.5)
    attn_dropout: float = probability(0.5)
    activation: str = one_of("gelu", ACTIVATIONS)
    num_experts: int = 256  # K = 16 × 16 on ML-1M; must be a perfect square (checked below)
    top_k: int = positive(8)  # k: retrieved experts = interest (dispatcher) tokens
    pool_size: int = knob(4, at_least=2, why="so the query network shortens the sequence")  # its stride
    query_net: str = one_of("hierarchical", QUERY_NETS)  # ablation: "mean"
    imr: bool = True  # ablation: False = one learnable P shared by all users
    dispatcher: bool = True  # ablation: False = no aggregation step, X attends to P⁰ only
    query_batchnorm: bool = False  # Lample et al.'s BatchNorm on the memory query (choice 5)
    key_heads: int = positive(1)  # Lample et al.'s memory heads: sets of sub-keys whose retrievals are summed

    # a record without these keys ran without them (what the defaults still are)

    @property
    def sub_keys(self) -> int:
        return math.isqrt(self.num_experts)

    def constraint_errors(self) -> list[tuple[str, str]]:
        """The per-field constraints, plus the rules that tie fields together (product keys, query halves)."""
        errors = super().constraint_errors()
        if self.num_experts < 1 or self.sub_keys ** 2 != self.num_experts:
            errors.append(("num_experts", f"must be a perfect square n*n (product keys use two sets of n sub-keys), "
                                          f"got {self.num_experts}"))
        if "top_k" not in dict(errors) and self.num_experts >= 1 and self.top_k > self.sub_keys:
            errors.append(("top_k", f"must be <= sqrt(num_experts)={self.sub_keys} (top-k is taken in each sub-key "
                                    f"set first), got {self.top_k}"))
        if self.imr and self.hidden_size % 2:
            errors.append(("hidden_size", f"must be even with imr=True (the query is split into two halves "
                                          f"for the product keys), got {self.hidden_size}"))
        return errors


def product_key_topk(query: torch.Tensor, sub_keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k over the n² product keys (c_i, c′_j): scores (B, k) descending and expert ids i·n + j.

    The best k full keys always lie among the k × k pairs of each half's own top-k, since a pair's score
    is the sum of its two halves' scores; so only O(n + k²) scores are computed instead of O(n²).
    """
    n, half = sub_keys.shape[1], sub_keys.shape[2]
    scores_1, index_1 = (query[:, :half] @ sub_keys[0].T).topk(k, dim=-1)
    scores_2, index_2 = (query[:, half:] @ sub_keys[1].T).topk(k, dim=-1)
    pairs = (scores_1[:, :, None] + scores_2[:, None, :]).flatten(1)  # (B, k*k)
    scores, best = pairs.topk(k, dim=-1)
    rows, cols = index_1.gather(1, best // k), index_2.gather(1, best % k)
    return scores, rows * n + cols


class CrossAttention(nn.Module):
    """Multi-head attention of ``queries`` (B, M, d) over ``keys`` (B, L, d); ``key_valid`` masks padded keys."""

    def __init__(self, hidden_size: int, num_heads: int, attn_dropout: float):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(hidden_size, hidden_size)
        self.kv = nn.Linear(hidden_size, 2 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)
        self.attn_dropout = attn_dropout

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, key_valid: torch.Tensor | None = None) -> torch.Tensor:
        batch, num_queries, hidden = queries.shape
        q = self.q(queries).view(batch, num_queries, self.num_heads, -1).transpose(1, 2)
        k, v = self.kv(keys).view(batch, keys.shape[1], 2, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        mask = None
        if key_valid is not None:
            # a window with no real item would give an all-masked row (NaN); let it attend to everything
            key_valid = key_valid | ~key_valid.any(1, keepdim=True)
            mask = key_valid[:, None, None, :]
        dropout = self.attn_dropout if self.training else 0.0
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        return self.out(mixed.transpose(1, 2).reshape(batch, num_queries, hidden))


class DispatcherLayer(nn.Module):
    """One Linear Dispatcher Attention layer: aggregate (P over X), dispatch (X over P), then the two FFNs.

    With ``aggregate=False`` (the ``dispatcher=False`` ablation) P passes through unchanged. The last layer
    has no P feed-forward (``carry_p=False``): its output would never be read.
    """

    def __init__(self, c: ElasticConfig, aggregate: bool, carry_p: bool = True):
        super().__init__()
        d = c.hidden_size
        self.aggregate = CrossAttention(d, c.num_heads, c.attn_dropout) if aggregate else None
        self.dispatch = CrossAttention(d, c.num_heads, c.attn_dropout)
        self.ffn_x = FeedForward(d, c.inner_size, c.dropout, c.activation)
        self.norm_x_attn, self.norm_x_ffn = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        if aggregate:
            self.norm_p_attn = nn.LayerNorm(d, eps=1e-12)
        self.ffn_p = FeedForward(d, c.inner_size, c.dropout, c.activation) if aggregate and carry_p else None
        self.norm_p_ffn = nn.LayerNorm(d, eps=1e-12) if self.ffn_p is not None else None
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, p: torch.Tensor, valid: torch.Tensor,
                queries: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """``queries`` selects the positions whose output is needed (the last layer of ``last_hidden`` needs one)."""
        if self.aggregate is not None:
            p = self.norm_p_attn(p + self.dropout(self.aggregate(p, x, valid)))  # Eq. 2, O(N·k)
        x = x[:, queries]
        x = self.norm_x_attn(x + self.dropout(self.dispatch(x, p)))  # Eq. 3 with the updated P, O(N·k)
        x = self.norm_x_ffn(x + self.dropout(self.ffn_x(x)))
        if self.ffn_p is not None:
            p = self.norm_p_ffn(p + self.dropout(self.ffn_p(p)))
        return x, p


class QueryLevel(nn.Module):
    """One level of the hierarchical query network: pool ``stride`` tokens by a Linear, then self-attention."""

    def __init__(self, hidden_size: int, stride: int, num_heads: int, attn_dropout: float, dropout: float):
        super().__init__()
        self.stride = stride
        self.pool = nn.Linear(stride * hidden_size, hidden_size)
        self.attention = SoftmaxAttention(hidden_size, num_heads, attn_dropout, causal=False)
        self.norm = nn.LayerNorm(hidden_size, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length, hidden = x.shape
        x = x * valid.unsqueeze(-1)  # padding (and all-padding groups of the level below) carries nothing
        extra = -length % self.stride
        if extra:  # left-pad: groups stay aligned on the newest item
            x = F.pad(x, (0, 0, extra, 0))
            valid = F.pad(valid, (extra, 0), value=False)
        groups = (length + extra) // self.stride
        x = self.pool(x.reshape(batch, groups, self.stride * hidden))
        valid = valid.view(batch, groups, self.stride).any(-1)
        return self.norm(x + self.dropout(self.attention(x, valid))), valid


def _close_counted_pass(memory: InterestMemory, incompatible_keys: object) -> None:
    memory.counting = False


class InterestMemory(nn.Module):
    """IMR: a query network maps X⁰ to q, product keys pick k of the K experts, scores gate them into P⁰."""

    def __init__(self, c: ElasticConfig):
        super().__init__()
        d, n = c.hidden_size, c.sub_keys
        self.top_k = c.top_k
        self.mean_query = c.query_net == "mean"
        levels, length = [], c.max_len
        while length > 1:
            levels.append(QueryLevel(d, c.pool_size, c.num_heads, c.attn_dropout, c.dropout))
            length = -(-length // c.pool_size)
        self.levels = nn.ModuleList([] if self.mean_query else levels)
        # head h's two sub-key sets are rows 2h (scored by q₁) and 2h + 1 (by q₂): choice 5
        self.sub_keys = nn.Parameter(torch.empty(2 * c.key_heads, n, d // 2))
        self.query_norm = nn.BatchNorm1d(d) if c.query_batchnorm else None
        self.experts = nn.Embedding(n * n, d)
        # selection counts of the counted evaluation pass (see the module docstring, choice 10)
        self.register_buffer("counts", torch.zeros(n * n, dtype=torch.long))
        self.armed = True  # a training step (or construction) happened since the last counted pass
        self.counting = False
        # a restored checkpoint carries the counts of its own pass, and what runs next (the trainer's efficiency
        # probe after loading the best epoch) is no evaluation pass: loading closes any open one
        self.register_load_state_dict_post_hook(_close_counted_pass)

    def query(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """(B, N, d) → q (B, d): hierarchical pooling, or the masked mean for the ablation."""
        if self.mean_query:
            weights = valid.unsqueeze(-1).to(x.dtype)
            return (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        for level in self.levels:
            x, valid = level(x, valid)
        return x[:, -1]

    def normalise(self, query: torch.Tensor) -> torch.Tensor:
        """The query BatchNorm (choice 5), if any; a one-row training batch uses the running statistics."""
        norm = self.query_norm
        if norm is None:
            return query
        if self.training and query.shape[0] == 1:
            return F.batch_norm(query, norm.running_mean, norm.running_var, norm.weight, norm.bias, False, 0.0,
                                norm.eps)
        return norm(query)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """P⁰ (B, k, d) and the expert ids (B, H·k), H = key heads."""
        query = self.normalise(self.query(x, valid))
        interests, selected = 0.0, []
        for head in range(self.sub_keys.shape[0] // 2):
            scores, indices = product_key_topk(query, self.sub_keys[2 * head:2 * head + 2], self.top_k)
            gate = self.top_k * scores.softmax(-1)  # scores enter the forward pass: keys and query net get gradient
            interests = interests + self.experts(indices) * gate.unsqueeze(-1)
            selected.append(indices)
        indices = torch.cat(selected, -1)
        if self.training:
            self.armed, self.counting = True, False
        elif self.counting:
            self.counts += torch.bincount(indices.flatten(), minlength=self.counts.numel())
        return interests, indices

    def open_evaluation_pass(self) -> None:
        """Start of an evaluation pass: counted (from zero) only if a training step came before it."""
        self.counting, self.armed = self.armed, False
        if self.counting:
            self.counts.zero_()


@register("elastic")
class Elastic(SeqRecModel):
    config_class = ElasticConfig
    objectives = ("last",)  # non-causal: training on every position would leak future items
    default_objective = "last"

    def __init__(self, config: ElasticConfig):
        super().__init__(config)
        c = config
        self.embedding = ItemEmbedding(c.num_items, c.max_len, c.hidden_size, c.dropout)
        self.memory = InterestMemory(c) if c.imr else None
        self.shared_interests = None if c.imr else nn.Parameter(torch.empty(c.top_k, c.hidden_size))
        self.layers = nn.ModuleList([DispatcherLayer(c, aggregate=c.dispatcher, carry_p=i < c.num_layers - 1)
                                     for i in range(c.num_layers)])
        self.apply(init_weights)
        if self.memory is not None:
            bound = 1.0 / math.sqrt(c.hidden_size // 2)  # Lample et al.'s key init
            nn.init.uniform_(self.memory.sub_keys, -bound, bound)
        else:
            nn.init.normal_(self.shared_interests, std=0.02)

    @property
    def mixes_rows_in_training(self) -> bool:
        """The query BatchNorm normalises a training batch with its own statistics (choice 5)."""
        return self.memory is not None and self.memory.query_norm is not None

    def interests(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """P⁰ (B, k, d): retrieved per user, or the shared learnable tokens when ``imr=False``."""
        if self.memory is None:
            return self.shared_interests.expand(x.shape[0], -1, -1)
        return self.memory(x, valid)[0]

    def encode(self, items: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        valid = items > 0
        x = self.embedding(items)
        p = self.interests(x, valid)
        for i, layer in enumerate(self.layers):
            # the last layer's X only matters at the newest position when ranking: dispatch only there
            queries = slice(-1, None) if last_only and i == len(self.layers) - 1 else slice(None)
            x, p = layer(x, p, valid, queries)
        return x * valid[:, -x.shape[1]:].unsqueeze(-1)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        return self.encode(items)

    def last_hidden(self, items: torch.Tensor) -> torch.Tensor:
        return self.encode(items, last_only=True)[:, -1]

    def item_weights(self) -> torch.Tensor:
        """Also opens an evaluation pass in eval mode (module docstring, choice 10): evaluators fetch the item
        table once, before they rank any batch."""
        if self.memory is not None and not self.training:
            self.memory.open_evaluation_pass()
        return self.embedding.items.weight

    def expert_load(self) -> torch.Tensor:
        """Selection share of each expert over the counted evaluation pass, (K,) summing to 1 (zeros if none)."""
        if self.memory is None:
            raise ValueError("expert load needs imr=True: with imr=False there are no experts to select")
        counts = self.memory.counts.double()
        return counts / counts.sum() if counts.sum() > 0 else counts

    def stats(self) -> dict[str, float]:
        if self.memory is None or self.memory.counts.sum() == 0:
            return {}
        load = self.expert_load()
        used = load[load > 0]
        entropy = -(used * used.log()).sum().item()
        return {
            "expert_usage_rate": (load > 0).double().mean().item(),
            "expert_load_entropy": entropy,
            "expert_load_entropy_norm": entropy / math.log(load.numel()) if load.numel() > 1 else 1.0,
            "expert_max_load": load.max().item(),
            "expert_selections": float(self.memory.counts.sum().item()),
        }
