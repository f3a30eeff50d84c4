"""Ranking metrics and the batched evaluator (full ranking or sampled negatives).

With one held-out target per user, HR@K, NDCG@K and MRR@K are functions of the target's rank
alone, so the evaluator computes ranks on the device — one comparison against the target's score
per candidate, which is cheaper than a top-k and exact for these metrics — and never loops over
users in Python. :func:`target_ranks` returns each user's rank, :func:`evaluate` the metrics' means over them, and
:func:`user_metric` one metric per user, for statistics over users.

Ties are broken by the expected rank under a random order (``1 + #higher + #tied / 2``), so a model
that scores everything equally is not rewarded with rank 1.

Non-finite scores rank last. Every comparison with NaN is false, so a NaN target would otherwise get rank 0.5
(HR = 1, NDCG > 1): a model whose weights blew up would look perfect. A target whose score is NaN or ±inf gets the
worst rank (the number of candidates), and any other candidate's non-finite score counts as below every finite
one. :func:`evaluate` also reports how many users got a non-finite target score, so the trainer can fail the
trial instead of selecting such an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models import SeqRecModel
from study.train.config import METRIC_KS
from study.train.padding import last_hidden_by_length, trim_padding

METRIC_NAMES = ("hr", "ndcg", "mrr")


def metrics_from_ranks(ranks: torch.Tensor, ks: tuple[int, ...] = METRIC_KS) -> dict[str, float]:
    """Mean HR/NDCG/MRR@K over users, from 1-based (possibly fractional) ranks of the single target."""
    return {f"{name}@{k}": user_metric(ranks, name, k).mean().item() for k in ks for name in METRIC_NAMES}


def user_metric(ranks: torch.Tensor, name: str, k: int) -> torch.Tensor:
    """Each user's HR, NDCG or MRR@k (``name`` in :data:`METRIC_NAMES`), in float64, from the 1-based ranks of
    their targets: what :func:`metrics_from_ranks` averages."""
    ranks = torch.as_tensor(ranks).double()
    hit = ranks <= k
    if name == "hr":
        return hit.double()
    if name == "ndcg":
        return torch.where(hit, 1.0 / torch.log2(ranks + 1.0), 0.0)
    if name == "mrr":
        return torch.where(hit, 1.0 / ranks, 0.0)
    raise ValueError(f"unknown metric {name!r}; metrics are {METRIC_NAMES}")


def rank_of_target(scores: torch.Tensor, target_scores: torch.Tensor) -> torch.Tensor:
    """Expected 1-based rank of ``target_scores`` (B,) among ``scores`` (B, C) that include it once.

    A non-finite target ranks last (rank C); other non-finite candidates rank below every finite score.
    Deliberately masked candidates are ``-inf`` and stay below any finite target as before.
    """
    finite_target = torch.isfinite(target_scores)
    others = torch.where(torch.isnan(scores) | (scores == float("inf")), float("-inf"), scores)
    higher = (others > target_scores[:, None]).sum(1)
    tied = (others == target_scores[:, None]).sum(1) - 1
    rank = 1.0 + higher + tied / 2.0
    return torch.where(finite_target, rank, torch.full_like(rank, float(scores.shape[1])))


@dataclass
class EvalSplit:
    """What one evaluation needs: inputs (U, L), targets (U,), and each user's history before the target.

    Histories are slices of one flat array of full sequences: user u's history is
    ``history_items[history_starts[u] : history_starts[u] + history_lengths[u]]``.
    """

    inputs: np.ndarray
    targets: np.ndarray
    history_items: np.ndarray
    history_starts: np.ndarray
    history_lengths: np.ndarray

    def history_entries(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Users start..stop-1's history as (row, item) pairs: rows count from 0 at ``start``."""
        lengths = self.history_lengths[start:stop]
        row_ids = np.repeat(np.arange(stop - start), lengths)
        # position of each history entry in the flat array, built without a loop over users
        within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return row_ids, self.history_items[np.repeat(self.history_starts[start:stop], lengths) + within]

    def history_mask(self, start: int, stop: int, num_items: int, device: torch.device) -> torch.Tensor:
        """Dense (stop - start, num_items + 1) bool mask of the items users start..stop-1 interacted with."""
        row_ids, flat = self.history_entries(start, stop)
        mask = torch.zeros(stop - start, num_items + 1, dtype=torch.bool, device=device)
        mask[torch.as_tensor(row_ids, device=device), torch.as_tensor(flat, device=device, dtype=torch.long)] = True
        return mask


def sample_negatives(split: EvalSplit, num_items: int, num_negatives: int, item_popularity: np.ndarray | None,
                     seed: int, batch_size: int = 1024) -> np.ndarray:
    """Fixed negatives per user, (U, num_negatives), never the target and never a history item.

    Drawn without replacement from uniform or popularity weights (``item_popularity``) with a
    seeded generator, so every model evaluated under the same seed sees the same candidates.
    """
    generator = torch.Generator().manual_seed(seed)
    if item_popularity is None:
        weights = torch.ones(num_items + 1)
    else:
        weights = torch.tensor(item_popularity, dtype=torch.float)  # a copy: the array may be read-only
    weights[0] = 0.0
    negatives = np.empty((len(split.targets), num_negatives), dtype=np.int64)
    for start in range(0, len(split.targets), batch_size):
        rows = np.arange(start, min(start + batch_size, len(split.targets)))
        blocked = split.history_mask(start, rows[-1] + 1, num_items, torch.device("cpu"))
        blocked[torch.arange(len(rows)), torch.as_tensor(split.targets[rows], dtype=torch.long)] = True
        batch_weights = weights.expand(len(rows), -1).masked_fill(blocked, 0.0)
        # a user who has seen almost every item: fall back to allowing repeats among the unseen ones
        available = (batch_weights > 0).sum(1).min().item()
        negatives[rows] = torch.multinomial(batch_weights, num_negatives, replacement=available < num_negatives,
                                            generator=generator).numpy()
    return negatives


class NonFiniteScores(FloatingPointError):
    """The model scored some users' targets NaN or ±inf: its metrics say nothing, the trial cannot select it."""


def evaluate(model: torch.nn.Module, split: EvalSplit, *, batch_size: int = 256, device: torch.device,
             mask_history: bool = False, negatives: np.ndarray | None = None,
             ks: tuple[int, ...] = METRIC_KS, strict: bool = False, trim: bool = True) -> dict[str, float]:
    """Mean HR/NDCG/MRR@K of ``model`` on ``split``: :func:`metrics_from_ranks` of :func:`target_ranks`, which
    takes the other arguments."""
    return metrics_from_ranks(target_ranks(model, split, batch_size=batch_size, device=device,
                                           mask_history=mask_history, negatives=negatives, strict=strict, trim=trim),
                              ks)


@torch.no_grad()
def target_ranks(model: torch.nn.Module, split: EvalSplit, *, batch_size: int = 256, device: torch.device,
                 mask_history: bool = False, negatives: np.ndarray | None = None, strict: bool = False,
                 trim: bool = True) -> torch.Tensor:
    """Each user's 1-based rank of its target under ``model``, (U,) on the CPU in the split's user order; full
    ranking unless ``negatives`` (U, n) are given. Every metric is a mean over these, so a statistic over users (a
    paired test, a split of the users) needs nothing else.

    Non-finite target scores rank last; with ``strict`` they raise :class:`NonFiniteScores` instead. ``trim``
    drops each batch's all-padding leading columns before the model reads it, and runs a zoo model's batch in
    length groups (:mod:`study.train.padding`).
    """
    was_training = model.training
    model.eval()
    weights = model.item_weights()
    num_items = weights.shape[0] - 1
    ranks, nonfinite = [], []
    for start in range(0, len(split.targets), batch_size):
        rows = np.arange(start, min(start + batch_size, len(split.targets)))
        inputs = split.inputs[rows]
        inputs = torch.as_tensor(trim_padding(inputs) if trim else inputs, dtype=torch.long, device=device)
        targets = torch.as_tensor(split.targets[rows], dtype=torch.long, device=device)
        # split rows are users 0..U-1 in order (study.data), so a row number is the user id models may ask for;
        # any module with ``last_hidden`` and ``item_weights`` can be evaluated, so needs_users is read softly
        users = {"users": torch.as_tensor(rows, device=device)} if getattr(model, "needs_users", False) else {}
        if trim and isinstance(model, SeqRecModel):
            hidden = last_hidden_by_length(model, inputs, users.get("users"))
        else:
            hidden = model.last_hidden(inputs, **users)
        if negatives is None:
            scores = hidden @ weights.T
            scores[:, 0] = float("-inf")
            if mask_history:
                blocked = split.history_mask(start, rows[-1] + 1, num_items, device)
                blocked[torch.arange(len(rows), device=device), targets] = False
                scores = scores.masked_fill(blocked, float("-inf"))
            target_scores = scores.gather(1, targets[:, None]).squeeze(1)
        else:
            candidates = torch.cat([targets[:, None], torch.as_tensor(negatives[rows], device=device)], dim=1)
            scores = torch.einsum("bd,bcd->bc", hidden, weights[candidates])
            target_scores = scores[:, 0]
        ranks.append(rank_of_target(scores, target_scores))
        nonfinite.append((~torch.isfinite(target_scores)).sum())
    model.train(was_training)
    bad = int(torch.stack(nonfinite).sum()) if nonfinite else 0  # one synchronisation, after the loop
    if strict and bad:
        raise NonFiniteScores(f"the model gave a non-finite score to the target of {bad} of {len(split.targets)} "
                              "users (diverged weights?)")
    return torch.cat(ranks).cpu()


def popularity_metrics(split: EvalSplit, item_popularity: np.ndarray, *, negatives: np.ndarray | None = None,
                       mask_history: bool = False, ks: tuple[int, ...] = METRIC_KS) -> dict[str, float]:
    """The most-popular baseline under the same protocol: every user gets the training popularity.

    With ``mask_history`` (full ranking) a user's earlier items leave the ranking as they do in :func:`evaluate`,
    the target excepted; sampled negatives never hold a history item, so they need nothing more.
    """
    # torch.tensor copies: in a Ray trial the arrays come read-only from the object store, which as_tensor would share
    popularity = torch.tensor(item_popularity, dtype=torch.float64)
    targets = torch.tensor(split.targets, dtype=torch.long)
    if negatives is None:
        # rank against every real item via a sorted popularity vector: O(U log I), no (U, I) matrix
        ranked = torch.sort(popularity[1:]).values
        target_pop = popularity[targets]
        higher = len(ranked) - torch.searchsorted(ranked, target_pop, right=True)
        tied = torch.searchsorted(ranked, target_pop, right=True) - torch.searchsorted(ranked, target_pop) - 1
        if mask_history:
            above, level = _history_above_target(split, popularity, target_pop)
            higher, tied = higher - above, tied - level
        return metrics_from_ranks(1.0 + higher + tied / 2.0, ks)
    candidates = torch.cat([targets[:, None], torch.tensor(negatives)], dim=1)
    scores = popularity[candidates]
    return metrics_from_ranks(rank_of_target(scores, scores[:, 0]), ks)


def _history_above_target(split: EvalSplit, popularity: torch.Tensor,
                          target_pop: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per user, how many distinct history items (the target excepted) are more popular than the target, and how
    many are as popular: the candidates that masking the history takes out of the popularity ranking."""
    users = len(split.targets)
    rows, items = split.history_entries(0, users)
    # an item the user had twice is masked once; the target stays rankable, as in evaluate
    pairs = np.unique(rows * len(popularity) + items.astype(np.int64))
    rows, items = pairs // len(popularity), pairs % len(popularity)
    keep = (items != 0) & (items != split.targets[rows])
    rows, items = torch.as_tensor(rows[keep]), torch.as_tensor(items[keep])
    item_pop, own_target = popularity[items], target_pop[rows]
    above = torch.bincount(rows, weights=(item_pop > own_target).double(), minlength=users)
    level = torch.bincount(rows, weights=(item_pop == own_target).double(), minlength=users)
    return above, level
