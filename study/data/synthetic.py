"""A seeded generator of realistic-looking interaction sequences, for tests, benchmarks and scaling studies.

The generative story, chosen so that the sequences have the structure real data has and a sequential
recommender can learn:

* item popularity follows a Zipf law (``zipf`` exponent over a random ranking of the items);
* items belong to ``clusters`` interest clusters, and each user draws a sparse mixture over clusters
  (Dirichlet with ``concentration``), so users have a few favourite genres;
* each item has ``successors`` likely next items in its own cluster (drawn by popularity); with probability
  ``markov`` the next item is one of the previous item's successors (a first-order Markov transition),
  otherwise it is a fresh draw from the user's clusters;
* sequence lengths are log-normal with mean ``length`` and shape ``length_sigma`` (0 gives every user the same
  length), clipped to ``[min_length, max_length]``.

Generation is vectorised: every fresh draw is sampled at once, and the only loop is over time steps (each step
is one gather over all users): 1,000 users x 4,096 steps take about a second on one core.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from study.errors import UserError

# Bump when the generator's output for the same parameters changes, so cached datasets are rebuilt.
GENERATOR_VERSION = 1

DEFAULTS: dict[str, int | float] = {
    "users": 1000,
    "items": 2000,
    "length": 50,  # mean sequence length
    "length_sigma": 0.75,  # log-normal shape; 0 = all users get the same length
    "min_length": 5,
    "max_length": 0,  # 0 = four times the mean length
    "seed": 0,
    "clusters": 20,
    "concentration": 0.2,  # Dirichlet parameter of the users' cluster mixtures; small = focused users
    "zipf": 1.0,  # popularity exponent
    "markov": 0.5,  # probability that the next item follows the previous one's transition list
    "successors": 10,  # size of each item's transition list
}

# Accepted spellings on the command line and in **options.
ALIASES = {"num_users": "users", "num_items": "items", "mean_length": "length"}


def resolve_params(options: dict[str, Any]) -> dict[str, int | float]:
    """Fill defaults, convert types and validate; the result is what the content hash and meta.json record."""
    params = dict(DEFAULTS)
    for key, value in options.items():
        key = ALIASES.get(key, key)
        if key not in DEFAULTS:
            raise UserError(f"synthetic: unknown parameter '{key}' (known: {', '.join(DEFAULTS)})")
        kind = type(DEFAULTS[key])
        try:
            number = float(value)
            if kind is int and not number.is_integer():
                raise ValueError
            params[key] = kind(number)
        except (TypeError, ValueError):
            raise UserError(
                f"synthetic: parameter '{key}' should be {kind.__name__}, got {value!r}"
            ) from None
    if params["max_length"] == 0:
        params["max_length"] = 4 * int(params["length"])
    for key in ("users", "items", "clusters", "successors"):
        if params[key] < 1:
            raise UserError(f"synthetic: '{key}' must be at least 1, got {params[key]}")
    if params["min_length"] < 3:
        raise UserError(
            f"synthetic: 'min_length' must be at least 3 (leave-one-out), got {params['min_length']}"
        )
    if not params["min_length"] <= params["length"] <= params["max_length"]:
        raise UserError(
            "synthetic: need min_length <= length <= max_length, "
            f"got {params['min_length']}, {params['length']}, "
            f"{params['max_length']}"
        )
    if params["clusters"] > params["items"]:
        raise UserError(
            f"synthetic: 'clusters' ({params['clusters']}) cannot exceed 'items' ({params['items']})"
        )
    if not 0 <= params["markov"] <= 1:
        raise UserError(f"synthetic: 'markov' is a probability, got {params['markov']}")
    for key in ("concentration", "zipf", "length_sigma"):
        if params[key] < 0 or (key == "concentration" and params[key] == 0):
            raise UserError(f"synthetic: '{key}' must be positive, got {params[key]}")
    return params


class _ClusterSampler:
    """Draws items from a given cluster with probability proportional to their popularity, vectorised."""

    def __init__(self, cluster_of: np.ndarray, popularity: np.ndarray, num_clusters: int) -> None:
        self.perm = np.argsort(cluster_of, kind="stable")  # items grouped by cluster
        self.cum = np.cumsum(popularity[self.perm])
        counts = np.bincount(cluster_of, minlength=num_clusters)
        self.end = np.cumsum(counts)
        self.start = self.end - counts
        self.mass_before = np.concatenate([[0.0], self.cum])[self.start]
        self.mass = self.cum[self.end - 1] - self.mass_before

    def __call__(self, clusters: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        target = self.mass_before[clusters] + uniform * self.mass[clusters]
        pos = np.searchsorted(self.cum, target, side="right")
        pos = np.clip(
            pos, self.start[clusters], self.end[clusters] - 1
        )  # guards float round-off at the edges
        return self.perm[pos]


@dataclass
class _ItemModel:
    """The items' side of the generative story: popularity, clusters and transition lists."""

    sample: _ClusterSampler
    successors: np.ndarray  # (items, successors)


def _item_model(rng: np.random.Generator, params: dict[str, int | float]) -> _ItemModel:
    num_items, num_clusters, num_succ = int(params["items"]), int(params["clusters"]), int(params["successors"])
    # Items: Zipf popularity over a random ranking, and a balanced random cluster assignment.
    rank = rng.permutation(num_items) + 1
    popularity = rank.astype(np.float64) ** -float(params["zipf"])
    popularity /= popularity.sum()
    cluster_of = rng.permutation(np.arange(num_items) % num_clusters)
    sample = _ClusterSampler(cluster_of, popularity, num_clusters)
    successors = sample(np.repeat(cluster_of, num_succ), rng.random(num_items * num_succ))
    return _ItemModel(sample, successors.reshape(num_items, num_succ))


def _user_sequences(rng: np.random.Generator, params: dict[str, int | float], model: _ItemModel, num_users: int,
                    first_user: int = 0) -> pd.DataFrame:
    """The users' side: ``num_users`` sequences (raw user ids from ``first_user``) as a reader frame."""
    num_clusters, num_succ = int(params["clusters"]), int(params["successors"])
    # Users: a sparse mixture over clusters and a log-normal length.
    mixture = rng.dirichlet(np.full(num_clusters, float(params["concentration"])), size=num_users)
    sigma = float(params["length_sigma"])
    mu = np.log(float(params["length"])) - sigma**2 / 2  # so that the mean before clipping is `length`
    lengths = np.rint(np.exp(rng.normal(mu, sigma, size=num_users))).astype(np.int64)
    lengths = np.clip(lengths, int(params["min_length"]), int(params["max_length"]))
    steps = int(lengths.max())

    # Fresh draws for every (step, user): cluster from the user's mixture by inverse CDF on a flattened,
    # per-user offset CDF (one searchsorted for everything), then an item from that cluster by popularity.
    cdf = np.cumsum(mixture, axis=1)
    cdf[:, -1] = 1.0
    offsets = np.arange(num_users, dtype=np.float64)
    flat_cdf = (cdf + offsets[:, None]).ravel()
    u = rng.random((steps, num_users)) + offsets[None, :]
    cluster = np.searchsorted(flat_cdf, u.ravel(), side="right").reshape(steps, num_users)
    cluster = np.minimum(cluster - np.arange(num_users)[None, :] * num_clusters, num_clusters - 1)
    fresh = model.sample(cluster.ravel(), rng.random(steps * num_users)).reshape(steps, num_users)

    # Markov steps: follow a random successor of the previous item; time-major so each step is contiguous.
    follow = rng.random((steps, num_users)) < float(params["markov"])
    pick = rng.integers(num_succ, size=(steps, num_users))
    seq = fresh
    for t in range(1, steps):
        chained = model.successors[seq[t - 1], pick[t]]
        seq[t] = np.where(follow[t], chained, seq[t])

    seq = seq.T  # (users, steps)
    keep = np.arange(steps)[None, :] < lengths[:, None]
    users = np.repeat(np.arange(first_user, first_user + num_users, dtype=np.int64), lengths)
    items = seq[keep].astype(np.int64) + 1
    positions = np.broadcast_to(np.arange(steps, dtype=np.float64), (num_users, steps))[keep]
    return pd.DataFrame({"user": users, "item": items, "timestamp": positions})


def generate(params: dict[str, int | float]) -> pd.DataFrame:
    """Generate interactions for resolved ``params`` (see :func:`resolve_params`).

    Returns the reader frame (``user``, ``item``, ``timestamp``): raw item ids are 1..items and the
    timestamps are the positions in each user's sequence. Items that nobody draws simply do not appear.
    """
    rng = np.random.default_rng(int(params["seed"]))
    model = _item_model(rng, params)
    return _user_sequences(rng, params, model, int(params["users"]))


def write_shards(params: dict[str, int | float], folder: Path, users_per_shard: int = 20_000) -> list[Path]:
    """Generate a large dataset as Parquet shards ``folder/shard-NNNNN.parquet`` (for the ``parquet`` recipe).

    One item model for all shards; each shard's users come from their own seeded stream, so memory is bounded by
    one shard (``users_per_shard`` x the longest sequence) whatever the total size, and a shard does not depend
    on the others. Not the same interactions as :func:`generate` with the same parameters.
    """
    folder.mkdir(parents=True, exist_ok=True)
    model = _item_model(np.random.default_rng(int(params["seed"])), params)
    written = []
    for shard, first in enumerate(range(0, int(params["users"]), users_per_shard)):
        count = min(users_per_shard, int(params["users"]) - first)
        rng = np.random.default_rng([int(params["seed"]), shard + 1])
        path = folder / f"shard-{shard:05d}.parquet"
        _user_sequences(rng, params, model, count, first_user=first).to_parquet(path, index=False)
        written.append(path)
    return written


def fingerprint(frame: pd.DataFrame) -> str:
    """sha256 of the generated interactions (recorded in meta.json; equal seeds give equal fingerprints)."""
    digest = hashlib.sha256()
    for column in ("user", "item"):
        digest.update(np.ascontiguousarray(frame[column].to_numpy(np.int64)).tobytes())
    return digest.hexdigest()
