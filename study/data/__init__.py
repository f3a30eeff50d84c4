"""Dataset recipes: download or read raw interactions, filter, split leave-one-out, and cache the result.

Public API::

    prepare(name, *, source=None, max_len=200, kcore=None, force=False, progress=True, engine="auto",
            **options) -> Path
    prepared_copy(identity, max_len, *, source=None, kcore=None, **options) -> Path  (a trial's dataset, by hash)
    load_prepared(path) -> PreparedDataset
    item_popularity(ds, split="train") -> np.ndarray
    raw_items(path) -> np.ndarray  (the source's item id of each model item id)

Output contract of a prepared directory ``<cache>/prepared/<name>-<hash12>/`` (``<cache>`` is ``$SEQREC_DATA``
or ``~/.cache/seqrec-study``):

* ``meta.json``: name, recipe options, synthetic flag, num_users/num_items/num_interactions, length
  statistics, source (path or url, sha256), kcore, max_len, split, dropped_short_users, format_version,
  content_hash, created;
* ``sequences.parquet``: one row per user sorted by ``user`` (int64, 0..U-1) with ``raw_user`` (string),
  ``items`` (list<int32>, the full chronological sequence; item ids 1..num_items, 0 = padding) and
  ``train``/``valid``/``test`` (fixed_size_list<int32>[max_len + 1], left-padded with 0): the last max_len + 1
  items of ``items[:-2]``, ``items[:-1]`` and ``items``. The Ray engine (``engine="ray"``) writes the same table
  as a folder ``sequences.parquet/part-NNNNN.parquet`` of contiguous user ranges in user order, which
  ``pq.read_table(dir / "sequences.parquet")`` reads as one table;
* ``items.parquet``: ``item`` (int64, 1..num_items) and ``raw_item`` (string, the id in the source file), read by
  ``raw_items(path)``. Directories prepared before this file existed lack it (same format version: their
  windows are unchanged); ``prepare NAME --force`` adds it.

Command line: ``python -m study.data prepare NAME ...`` and ``python -m study.data list``.
"""

from study.data.cache import FORMAT_VERSION, cache_dir, list_prepared
from study.data.dataset import PreparedDataset, item_popularity, load_prepared, raw_items
from study.data.pipeline import prepare, prepared_copy
from study.data.recipes import DEFAULT_RECIPE, RECIPES, Recipe, get_recipe

__all__ = [
    "DEFAULT_RECIPE",
    "FORMAT_VERSION",
    "RECIPES",
    "PreparedDataset",
    "Recipe",
    "cache_dir",
    "get_recipe",
    "item_popularity",
    "list_prepared",
    "load_prepared",
    "prepare",
    "prepared_copy",
    "raw_items",
]
