"""A plain PyTorch SASRec: the yardstick ``benchmarks.speed`` times the platform's SASRec against.

    python -m benchmarks.plain_sasrec --data PREPARED_DIR [--epochs 3] [--max-len 200] [--dropout 0.2] [--threads 2]

Written from the paper (Kang & McAuley, "Self-Attentive Sequential Recommendation", ICDM 2018) the way one writes
it without a framework: item + learned position embeddings, a stack of self-attention blocks that materialise the
L×L score matrix with a causal and padding mask, a position-wise feed-forward network, the output head tied to
the item embedding. Nothing here is imported from ``models/`` on purpose: it is the straightforward code a reader
would write, so the platform's model has to beat it, not share its speed-ups.

What matches the platform's default so that the comparison is like for like:
- sizes: d = 64, 2 layers, 2 heads, inner size 256, GELU (``models/sasrec.py``'s defaults; the paper's block has
  inner size d and ReLU, selectable with ``--inner-size``/``--activation``);
- the loss: the ``causal`` objective of ``study/train/objectives.py``, softmax cross-entropy over all items at
  every position whose input and target are both real items, the padding id never a candidate;
- the data: the prepared dataset's left-padded (U, L + 1) training windows, one per user, shuffled per epoch.
The block is post-LN as the platform's default (``norm_first=False``); ``--pre-ln`` gives the paper's pre-LN form.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from torch import nn


class PlainBlock(nn.Module):
    """Multi-head causal self-attention and a feed-forward network, each with a residual and a LayerNorm."""

    def __init__(self, hidden: int, heads: int, inner: int, dropout: float, activation: str, pre_ln: bool):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ffn = nn.Sequential(nn.Linear(hidden, inner), nn.GELU() if activation == "gelu" else nn.ReLU(),
                                 nn.Linear(inner, hidden))
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.attn_drop = nn.Dropout(dropout)
        self.pre_ln = pre_ln

    def attend(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:  # (B, L, d) -> (B, heads, L, d / heads)
            return t.view(batch, length, self.heads, -1).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        weights = self.attn_drop(scores.masked_fill(~allowed, float("-inf")).softmax(-1))
        return self.proj((weights @ v).transpose(1, 2).reshape(batch, length, hidden))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        if self.pre_ln:
            x = x + self.drop(self.attend(self.norm1(x), allowed))
            return x + self.drop(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attend(x, allowed)))
        return self.norm2(x + self.drop(self.ffn(x)))


class PlainSASRec(nn.Module):
    def __init__(self, num_items: int, max_len: int, hidden: int = 64, layers: int = 2, heads: int = 2,
                 inner: int = 256, dropout: float = 0.2, activation: str = "gelu", pre_ln: bool = False):
        super().__init__()
        self.items = nn.Embedding(num_items + 1, hidden, padding_idx=0)
        self.positions = nn.Embedding(max_len, hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.embed_drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(PlainBlock(hidden, heads, inner, dropout, activation, pre_ln)
                                    for _ in range(layers))
        self.final_norm = nn.LayerNorm(hidden, eps=1e-12) if pre_ln else nn.Identity()
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        """(B, L) left-padded item ids -> (B, L, d); the newest item always sits at position ``max_len - 1``."""
        length = items.shape[1]
        positions = torch.arange(self.positions.num_embeddings - length, self.positions.num_embeddings,
                                 device=items.device)
        x = self.embed_drop(self.embed_norm(self.items(items) + self.positions(positions)))
        real = items > 0
        causal = torch.ones(length, length, dtype=torch.bool, device=items.device).tril()
        # a padded query sees itself, so its softmax row is never all -inf (its output is never scored)
        allowed = (real[:, None, None, :] & causal) | torch.eye(length, dtype=torch.bool, device=items.device)
        for block in self.blocks:
            x = block(x, allowed)
        return self.final_norm(x) * real.unsqueeze(-1)

    def last_hidden(self, items: torch.Tensor) -> torch.Tensor:
        return self(items)[:, -1]

    def item_weights(self) -> torch.Tensor:
        return self.items.weight


def all_position_ce(model: PlainSASRec, windows: torch.Tensor) -> torch.Tensor:
    """Softmax CE over every item at each position whose input and target are real (the ``causal`` objective)."""
    inputs, targets = windows[:, :-1], windows[:, 1:]
    hidden = model(inputs)
    scored = (inputs > 0) & (targets > 0)
    logits = hidden[scored] @ model.item_weights().T
    logits[:, 0] = float("-inf")
    return nn.functional.cross_entropy(logits, targets[scored])


def train_epoch(model: PlainSASRec, optimizer: torch.optim.Optimizer, windows: np.ndarray, batch_size: int,
                rng: np.random.Generator, max_steps: int = 0) -> tuple[float, int]:
    """One pass over the shuffled user windows that hold a training pair; returns (mean loss, steps)."""
    model.train()
    trainable = np.flatnonzero((windows[:, :-1] > 0).any(1) & (windows[:, -1] > 0))
    order = rng.permutation(trainable)
    losses = []
    for start in range(0, len(order), batch_size):
        batch = torch.as_tensor(windows[order[start:start + batch_size]], dtype=torch.long)
        optimizer.zero_grad(set_to_none=True)
        loss = all_position_ce(model, batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if max_steps and len(losses) == max_steps:
            break
    return float(np.mean(losses)), len(losses)


@torch.no_grad()
def test_ndcg10(model: PlainSASRec, inputs: np.ndarray, targets: np.ndarray, batch_size: int = 256) -> float:
    """Full-ranking NDCG@10 of each user's held-out target (ties counted against the target)."""
    model.eval()
    gains = []
    for start in range(0, len(targets), batch_size):
        scores = model.last_hidden(torch.as_tensor(inputs[start:start + batch_size], dtype=torch.long))
        scores = scores @ model.item_weights().T
        scores[:, 0] = float("-inf")
        target = torch.as_tensor(targets[start:start + batch_size], dtype=torch.long)
        rank = (scores >= scores.gather(1, target[:, None])).sum(1) - 1
        gains.append(torch.where(rank < 10, 1.0 / torch.log2(rank.float() + 2.0), torch.zeros(())))
    return float(torch.cat(gains).mean())


def main(argv: list[str] | None = None) -> int:
    from study.train.trainer import TrialData  # only to read the prepared windows, the same arrays ours trains on

    parser = argparse.ArgumentParser(prog="python -m benchmarks.plain_sasrec", description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="a prepared dataset folder (python -m study.data prepare)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=200)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--inner-size", type=int, default=256)
    parser.add_argument("--activation", choices=("gelu", "relu"), default="gelu")
    parser.add_argument("--pre-ln", action="store_true")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = TrialData.from_prepared(args.data, args.max_len)
    model = PlainSASRec(data.num_items, args.max_len, inner=args.inner_size, dropout=args.dropout,
                        activation=args.activation, pre_ln=args.pre_ln)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    rng = np.random.default_rng(args.seed)
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        loss, steps = train_epoch(model, optimizer, data.train, args.batch_size, rng)
        seconds = time.perf_counter() - start
        ndcg = test_ndcg10(model, data.test.inputs, data.test.targets)
        print(f"epoch {epoch}: loss {loss:.4f}, {steps} steps, {seconds:.2f} s, test NDCG@10 {ndcg:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
