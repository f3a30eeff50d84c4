"""Top-k recommendations from an exported model folder (:mod:`study.export`), in raw item ids.

    python -m study.recommend MODEL_DIR --users 1,2,3 [--k 10] [--keep-history]
    python -m study.recommend MODEL_DIR --all --output recs.parquet

Each user's input is the last ``max_len`` items of their whole recorded history (training, validation and test
items: the model now recommends what comes after all of it), and items already in that history are left out
unless ``--keep-history``. Users and items are named by their ids in the source file. In a notebook::

    from study.recommend import load_exported, recommend
    model = load_exported("exports/sasrec")
    recommend(model, ["1", "2"], k=10)          # a DataFrame: user, rank, item, score
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

import models
from models import SeqRecModel
from study.errors import UserError, print_error
from study.export import DATASET_FILE, HISTORIES_FILE, ITEMS_FILE
from study.schema import schema_of, upgrade_settings
from study.train.state import BEST_INFO_FILE, BEST_WEIGHTS_FILE

BATCH_USERS = 512


@dataclass
class ExportedModel:
    """An exported model in memory: the network (eval mode), what it is, the id maps and the histories."""

    model: SeqRecModel
    info: dict[str, Any]
    raw_items: np.ndarray  # raw_items[i] is model item i's raw id (index 0, padding, is "")
    user_rows: dict[str, int]  # raw user id -> row of the histories (the model's user id)
    histories: list[np.ndarray]  # each user's full item sequence, model ids

    @property
    def max_len(self) -> int:
        return int(self.model.config.max_len)


def load_exported(folder: str | Path, dataset_meta: dict[str, Any] | None = None) -> ExportedModel:
    """Read a folder written by ``python -m study.export``. With ``dataset_meta`` (a prepared dataset's meta.json),
    a model trained on another dataset is refused."""
    folder = Path(folder)
    missing = [name for name in (BEST_WEIGHTS_FILE, BEST_INFO_FILE, ITEMS_FILE, HISTORIES_FILE, DATASET_FILE)
               if not (folder / name).is_file()]
    if missing:
        raise UserError(f"{folder}: not an exported model folder (missing {', '.join(missing)}); write one with "
                        "python -m study.export results/<study> OUT")
    info = json.loads((folder / BEST_INFO_FILE).read_text())
    meta = json.loads((folder / DATASET_FILE).read_text())
    trained_on = info.get("dataset", {}).get("content_hash")
    if meta.get("content_hash") != trained_on:
        raise UserError(f"{folder}: its model was trained on dataset {trained_on} but its histories come from "
                        f"{meta.get('content_hash')}; export it again")
    if dataset_meta is not None and dataset_meta.get("content_hash") != trained_on:
        raise UserError(f"{folder}: the model was trained on {info['dataset'].get('name')} ({trained_on}), not on "
                        f"{dataset_meta.get('name')} ({dataset_meta.get('content_hash')})")
    model = models.build(info["model"], **upgrade_settings(info["model"], info["model_config"], schema_of(info),
                                                          scope="model"))
    model.load_state_dict(torch.load(folder / BEST_WEIGHTS_FILE, map_location="cpu", weights_only=True))
    model.eval()
    items = pd.read_parquet(folder / ITEMS_FILE)
    raw_items = np.full(int(info["model_config"]["num_items"]) + 1, "", dtype=object)
    raw_items[items["item"].to_numpy()] = items["raw_item"].astype(str).to_numpy()
    histories = pd.read_parquet(folder / HISTORIES_FILE)
    user_rows = {str(raw): int(row) for raw, row in zip(histories["raw_user"], histories["user"], strict=True)}
    sequences = [np.asarray(seq, dtype=np.int64) for seq in histories.sort_values("user")["items"]]
    return ExportedModel(model=model, info=info, raw_items=raw_items, user_rows=user_rows, histories=sequences)


def recommend(exported: ExportedModel, users: list[str] | None = None, k: int = 10,
              mask_history: bool = True) -> pd.DataFrame:
    """Top-``k`` items for each raw user id (``None``: every user) as rows ``user, rank, item, score``."""
    if k < 1:
        raise UserError(f"--k must be >= 1, got {k}")
    if users is None:
        users = list(exported.user_rows)
    unknown = [user for user in users if user not in exported.user_rows]
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise UserError(f"unknown user id(s) {shown}: not in {exported.info['dataset'].get('name')} "
                        f"({len(exported.user_rows)} users; ids as in the source file)")
    rows = np.asarray([exported.user_rows[user] for user in users], dtype=np.int64)
    k = min(k, len(exported.raw_items) - 1)
    frames = []
    with torch.no_grad():
        weights = exported.model.item_weights()
        for start in range(0, len(rows), BATCH_USERS):
            batch = rows[start:start + BATCH_USERS]
            inputs = np.zeros((len(batch), exported.max_len), dtype=np.int64)
            for i, row in enumerate(batch):
                recent = exported.histories[row][-exported.max_len:]
                inputs[i, exported.max_len - len(recent):] = recent
            batch_users = torch.as_tensor(batch) if exported.model.needs_users else None
            hidden = exported.model.last_hidden(torch.as_tensor(inputs), **exported.model.user_inputs(batch_users))
            scores = hidden @ weights.T
            scores[:, 0] = float("-inf")
            if mask_history:
                for i, row in enumerate(batch):
                    scores[i, torch.as_tensor(exported.histories[row])] = float("-inf")
            top = torch.topk(scores, k, dim=1)
            frames.append(pd.DataFrame({
                "user": np.repeat(np.asarray(users, dtype=object)[start:start + len(batch)], k),
                "rank": np.tile(np.arange(1, k + 1), len(batch)),
                "item": exported.raw_items[top.indices.numpy()].ravel(),
                "score": top.values.numpy().ravel().astype(np.float64),
            }))
    return pd.concat(frames, ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.recommend",
                                     description="Top-k recommendations (raw item ids) from an exported model.")
    parser.add_argument("model", help="a folder written by python -m study.export")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--users", help="comma-separated raw user ids, e.g. 1,2,3")
    who.add_argument("--all", action="store_true", help="every user of the dataset")
    parser.add_argument("--k", type=int, default=10, help="items per user (default 10)")
    parser.add_argument("--keep-history", action="store_true", help="allow items the user already interacted with")
    parser.add_argument("--output", help="write the recommendations to this .parquet or .csv file instead")
    args = parser.parse_args(argv)
    try:
        exported = load_exported(args.model)
        users = None if args.all else [user.strip() for user in args.users.split(",") if user.strip()]
        table = recommend(exported, users, args.k, mask_history=not args.keep_history)
        if args.output:
            output = Path(args.output)
            if output.suffix not in (".parquet", ".csv"):
                raise UserError(f"--output {output}: give a .parquet or .csv file")
            table.to_parquet(output) if output.suffix == ".parquet" else table.to_csv(output, index=False)
            print(f"wrote {len(table)} recommendations for {table['user'].nunique()} users to {output}")
        else:
            for user, group in table.groupby("user", sort=False):
                print(f"{user}\t{' '.join(group['item'].astype(str))}")
    except UserError as error:
        return print_error(error)
    except BrokenPipeError:  # piped into head
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
