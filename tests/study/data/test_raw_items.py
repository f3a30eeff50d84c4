"""Prepared datasets record each model item id's raw id (items.parquet), so models can answer in source ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from study.data import load_prepared, prepare, raw_items


def test_raw_item_ids_map_every_history_back_to_the_source(ml100k_shaped_udata: Path, data_cache: Path) -> None:
    path = prepare("ml-100k", source=ml100k_shaped_udata, max_len=50, progress=False)  # a generated u.data
    dataset = load_prepared(path)
    items = raw_items(path)
    assert len(items) == dataset.num_items + 1 and items[0] == "" and len(set(items[1:])) == dataset.num_items
    source = pd.read_csv(ml100k_shaped_udata, sep="\t", header=None)
    source.columns = ["user", "item", "rating", "timestamp"]
    source["order"] = np.arange(len(source))
    kept = set(items[1:])
    for raw_user in dataset.raw_users[[0, len(dataset.raw_users) // 2, -1]]:
        row = list(dataset.raw_users).index(raw_user)
        expected = (source[source["user"].astype(str) == raw_user].sort_values(["timestamp", "order"])["item"]
                    .astype(str))
        assert list(items[dataset.history(row)]) == [item for item in expected if item in kept]
