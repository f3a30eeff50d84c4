"""The synthetic recipe: determinism, labelling, realism checks and speed."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from study.data import load_prepared, prepare
from study.data.synthetic import generate, resolve_params, write_shards
from study.errors import UserError


def test_same_seed_same_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = []
    for cache in ("a", "b"):
        monkeypatch.setenv("SEQREC_DATA", str(tmp_path / cache))
        loaded.append(
            load_prepared(prepare("synthetic", users=200, items=300, length=20, seed=7, progress=False))
        )
    first, second = loaded
    assert first.path.name == second.path.name  # same parameters, same content hash
    assert np.array_equal(first.history_indices, second.history_indices)
    assert np.array_equal(first.train, second.train)
    assert first.meta["source"]["sha256"] == second.meta["source"]["sha256"]

    other = load_prepared(prepare("synthetic", users=200, items=300, length=20, seed=8, progress=False))
    assert other.path != second.path and not np.array_equal(
        other.history_indices[:500], first.history_indices[:500]
    )


def test_meta_label_and_parameters(data_cache: Path) -> None:
    ds = load_prepared(
        prepare("synthetic", users=300, items=500, length=30, seed=1, max_len=50, progress=False)
    )
    meta = ds.meta
    assert meta["synthetic"] is True and meta["kcore"] == 0
    assert (
        meta["recipe"]["users"] == 300 and meta["recipe"]["seed"] == 1 and meta["recipe"]["max_length"] == 120
    )
    assert meta["num_users"] == 300 and 1 <= meta["num_items"] <= 500
    assert meta["length"]["min"] >= 5 and meta["length"]["max"] <= 120
    assert 20 <= meta["length"]["mean"] <= 40  # log-normal with mean 30 before clipping
    assert ds.train.shape == (300, 51)


def test_sequences_have_popularity_skew_and_markov_structure() -> None:
    def bigram_share(markov: float) -> tuple[float, float]:
        frame = generate(
            resolve_params({"users": 500, "items": 1000, "length": 60, "markov": markov, "seed": 3})
        )
        items = frame["item"].to_numpy()
        same_user = frame["user"].to_numpy()[1:] == frame["user"].to_numpy()[:-1]
        pairs = items[:-1][same_user] * 10_000 + items[1:][same_user]
        counts = np.sort(np.bincount(items))[::-1]
        top_share = counts[: len(counts) // 100].sum() / counts.sum()  # top 1% of items
        return len(np.unique(pairs)) / len(pairs), top_share

    distinct_random, top_random = bigram_share(0.0)
    distinct_markov, _ = bigram_share(0.9)
    assert top_random > 0.1  # Zipf: the top 1% of items draw well over 1% of interactions
    assert distinct_markov < 0.6 * distinct_random  # transitions repeat when they follow a Markov chain


def test_long_sequences_are_fast(data_cache: Path) -> None:
    start = time.perf_counter()
    path = prepare(
        "synthetic", users=1000, length=4096, max_len=4096, length_sigma=0, max_length=4096, progress=False
    )
    elapsed = time.perf_counter() - start
    ds = load_prepared(path)
    assert ds.meta["num_interactions"] == 1000 * 4096 and ds.test.shape == (1000, 4097)
    # 4,096 items in windows of 4,097: test has 1 padding position, valid 2, train 3
    for split, pads in ((ds.test, 1), (ds.valid, 2), (ds.train, 3)):
        assert not split[:, :pads].any() and split[:, pads:].min() > 0
    assert elapsed < 20, elapsed


def test_bad_parameters() -> None:
    with pytest.raises(UserError, match=r"synthetic: unknown parameter 'colour'"):
        resolve_params({"colour": 3})
    with pytest.raises(UserError, match=r"synthetic: parameter 'users' should be int, got 'many'"):
        resolve_params({"users": "many"})
    with pytest.raises(UserError, match=r"'clusters' \(50\) cannot exceed 'items' \(10\)"):
        resolve_params({"items": 10, "clusters": 50})
    with pytest.raises(UserError, match="takes no --source"):
        prepare("synthetic", source="x", progress=False)


def test_write_shards_is_a_deterministic_sharded_parquet_source(data_cache: Path, tmp_path: Path) -> None:
    import pandas as pd

    params = resolve_params({"users": 250, "items": 400, "length": 10, "seed": 5})
    first = write_shards(params, tmp_path / "a", users_per_shard=100)
    again = write_shards(params, tmp_path / "b", users_per_shard=100)
    assert [p.name for p in first] == ["shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in again]
    frame = pd.concat([pd.read_parquet(p) for p in first], ignore_index=True)
    assert sorted(frame["user"].unique()) == list(range(250)) and frame["item"].between(1, 400).all()
    meta = load_prepared(prepare("parquet", source=tmp_path / "a", kcore=0, max_len=5, progress=False)).meta
    assert meta["source"]["shards"] == 3 and meta["raw"] == {"interactions": len(frame), "users": 250,
                                                              "items": frame["item"].nunique()}
