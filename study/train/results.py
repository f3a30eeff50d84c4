"""The one result schema: a flat row per trial, the same from the CLI, a sweep or a replicate.

Columns:
- identity: ``model``, ``dataset``, ``dataset_hash``, ``synthetic`` (synthetic data is never an accuracy claim)
- protocol: ``objective``, ``eval_mode``, ``num_negatives`` (sampled only), ``negative_sampler``, ``mask_history``,
  ``sampled_test_negatives``
- metrics: ``valid_{hr,ndcg,mrr}@{5,10,20}`` at the best-validation epoch and ``test_…`` of that same epoch,
  ``best_epoch``, ``epochs_run``, ``test_sampled_…`` (the same epoch against ``sampled_test_negatives`` uniform
  negatives per user, where that is set), ``pop_ndcg@10`` (the most-popular baseline under the same protocol)
- efficiency: ``params``, ``peak_mem_mb`` + ``peak_mem_method``, ``epoch_time_s``, ``train_throughput``
  (sequences/s), ``infer_ms_p50`` / ``infer_ms_p95`` (top-20 of all items for 256 users), ``device``,
  ``kernel_path``
- energy (:mod:`study.train.energy`), in joules: ``train_energy_j_per_epoch`` (median over epochs of the device's
  energy during the epoch's training steps), ``infer_energy_j_per_1k`` (serving 1,000 users), ``energy_method``
  (``nvml``, ``rapl`` or ``unavailable``, then both are NaN)
- ``config``: every model and trainer key of the trial; ``extra``: the model's statistics at the best epoch
  (ELASTIC's expert usage on the validation users, ``models/elastic.py``; a sweep's ``trials.parquet`` also spreads
  them as ``extra.<key>`` columns)
- ``seed``, ``wall_time_s``, ``status`` (``ok`` | ``failed`` | ``interrupted``: Ctrl-C, the finished epochs), ``error``
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

import torch

from study.schema import SCHEMA, SCHEMA_KEY
from study.train.config import TrainConfig
from study.train.settings import PROTOCOL, keys_with

# The efficiency figures of every row (measured once per trial, before its first epoch in a sweep).
EFFICIENCY_METRICS = ("params", "peak_mem_mb", "infer_ms_p50", "infer_ms_p95", "train_throughput", "epoch_time_s",
                      "train_energy_j_per_epoch", "infer_energy_j_per_1k")
# The energy figures among them: NaN, with energy_method "unavailable", where the device has no counter.
ENERGY_METRICS = ("train_energy_j_per_epoch", "infer_energy_j_per_1k")
# The evaluation-protocol settings a study fixes for all its trials (the ``protocol:`` section of a study file);
# ``protocol_of`` records them, with the objective that actually ran, in every row.
PROTOCOL_SETTINGS = keys_with(PROTOCOL)


def protocol_of(train_cfg: TrainConfig, objective: str) -> dict[str, Any]:
    return {
        "objective": objective,
        "eval_mode": train_cfg.eval_mode,
        "num_negatives": train_cfg.num_negatives if train_cfg.eval_mode == "sampled" else 0,
        "negative_sampler": train_cfg.negative_sampler if train_cfg.eval_mode == "sampled" else "",
        "mask_history": train_cfg.mask_history,
        "sampled_test_negatives": train_cfg.sampled_test_negatives,
        "selection_metric": train_cfg.selection_metric,
    }


def kernel_path(device: torch.device) -> str:
    """Which implementation the efficient mixers ran: the Triton kernels or the torch reference."""
    try:
        import kernels
    except ImportError:
        return "reference"
    used = kernels.backend_used() if hasattr(kernels, "backend_used") else {}
    if not used:
        return "none"  # the model calls no custom kernel (e.g. SASRec's softmax attention)
    return ",".join(f"{op}={path}" for op, path in sorted(used.items()))


def make_result(*, model: str, dataset_meta: dict, objective: str, train_cfg: TrainConfig, model_hparams: dict,
                best_valid: dict, best_test: dict, best_epoch: int, epochs_run: int, efficiency: dict,
                device: torch.device, extra: dict, wall_time_s: float, popularity: dict) -> dict:
    row: dict[str, Any] = {
        SCHEMA_KEY: SCHEMA,
        "model": model,
        "dataset": dataset_meta.get("name"),
        "dataset_hash": dataset_meta.get("content_hash"),
        "synthetic": bool(dataset_meta.get("synthetic", False)),
        **protocol_of(train_cfg, objective),
        **{f"valid_{k}": v for k, v in best_valid.items()},
        **{f"test_{k}": v for k, v in best_test.items()},
        "best_epoch": best_epoch,
        "epochs_run": epochs_run,
        **popularity,
        **efficiency,
        "device": str(device),
        "kernel_path": kernel_path(device),
        "config": {**{k: v for k, v in model_hparams.items() if k != "num_items"}, **asdict(train_cfg),
                   "objective": objective},
        "extra": extra,
        "seed": train_cfg.seed,
        "wall_time_s": wall_time_s,
        "status": "ok",
        "error": "",
    }
    return row


def json_safe(value: Any) -> Any:
    """JSON-safe copy: NaN/inf → None, numpy scalars → Python, tuples → lists, keys → strings."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_json_line(row: dict) -> str:
    """Strict JSON (NaN → null) on one line."""
    return json.dumps(json_safe(row), allow_nan=False)
