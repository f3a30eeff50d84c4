"""Prepared datasets record each model item id's raw id (items.parquet), so models can answer in source ids."""

from __future__ import annotations

import numpy as np
import pandas as pd

from study.data import load_prepared, raw_items


def test_raw_item_ids_map_every_history_back_to_the_source(ml100k_prepared, shared_datasets) -> None:
    dataset = load_prepared(ml100k_prepared)
    items = raw_items(ml100k_prepared)
    assert len(items) == dataset.num_items + 1 and items[0] == "" and len(set(items[1:])) == dataset.num_items
    source = pd.read_csv(shared_datasets / "ml-100k" / "ml-100k.inter", sep="\t")
    source.columns = ["user", "item", "rating", "timestamp"]
    source["order"] = np.arange(len(source))
    kept = set(items[1:])
    for raw_user in ("196", "1", "943"):
        row = list(dataset.raw_users).index(raw_user)
        expected = (source[source["user"].astype(str) == raw_user].sort_values(["timestamp", "order"])["item"]
                    .astype(str))
        assert list(items[dataset.history(row)]) == [item for item in expected if item in kept]
