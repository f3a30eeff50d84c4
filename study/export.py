"""Export a study's trained model as a self-contained folder.

    python -m study.export results/<study> [--trial ID | --best] OUT

The folder holds everything needed to use the model without the study or the data cache:

* ``model.pt``: the trial's best-validation weights, a ``torch.save`` of the model's state dict (load it with
  ``torch.load(path, weights_only=True)``);
* ``model.json``: the registry model and its full config, the training settings (the protocol included), the
  dataset's identity (name, content_hash, sizes, recipe), the best epoch and its validation and test metrics, the
  study and trial it comes from;
* ``config.yaml``: the trial's settings as ``--set`` keys, so that ``python -m study.train --model M --dataset D
  --config config.yaml`` trains the same configuration again;
* ``dataset.json``: the prepared dataset's meta.json;
* ``items.parquet``: model item id ↔ raw item id (``item``, ``raw_item``);
* ``histories.parquet``: every user's raw id and full chronological item sequence (model ids), what
  :mod:`study.recommend` feeds the model and masks.

A trial's best model is the one it kept in ``<study>/models/<trial_id>/`` (local runs) or, on a cluster, the best
weights inside its last Tune checkpoint (``<study>/tune/<trial>/checkpoint_*``; a data-parallel trial's, in
``<study>/tune/<trial>/<trial_id>/checkpoint_*``). ``--best`` (the default) picks the
finished trial with the best value of the study's first validation objective.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import torch
import yaml

from study.analysis.runs import TUNE_DIR, load_results, selection_metric
from study.errors import UserError, print_error
from study.layout import CHECKPOINT_PREFIX, MODELS_DIR
from study.schema import upgrade_identity
from study.train.state import BEST_INFO_FILE, BEST_WEIGHTS_FILE, load_state

DATA_SIZED = ("num_items", "num_users")  # the trainer sizes these from the dataset; never --set by hand
CONFIG_FILE, DATASET_FILE, ITEMS_FILE, HISTORIES_FILE = "config.yaml", "dataset.json", "items.parquet", \
    "histories.parquet"


def choose_trial(study_dir: Path, trial: str | None) -> tuple[str, dict[str, Any]]:
    """The trial to export and the study's resolved YAML: ``trial`` if given (it must have finished), else the
    finished trial with the best value of the study's first validation objective (:func:`study_metric`)."""
    results = load_results(study_dir)
    ok = results.trials[results.trials["status"] == "ok"]
    if trial is not None:
        if trial not in set(results.trials["trial_id"]):
            known = ", ".join(map(str, results.trials["trial_id"]))
            raise UserError(f"{study_dir}: no trial {trial}; its trials: {known}")
        if trial not in set(ok["trial_id"]):
            raise UserError(f"{study_dir}: trial {trial} did not finish (status "
                            f"{results.trials.set_index('trial_id').loc[trial, 'status']}); it has no model to export")
        return trial, results.study
    metric = study_metric(results.study)
    best = ok.sort_values([metric, "trial_id"], ascending=[False, True], kind="stable").iloc[0]
    return str(best["trial_id"]), results.study


def study_metric(study: dict[str, Any]) -> str:
    """The metric ``--best`` ranks a study's trials on: its first validation objective (``valid_ndcg@10`` when
    it has none)."""
    return selection_metric(dict(study.get("objectives") or {}), None)


def find_best_model(study_dir: Path, trial_id: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A trial's best-validation weights and what they are, from its models folder or its last checkpoint."""
    folder = study_dir / MODELS_DIR / trial_id
    if (folder / BEST_WEIGHTS_FILE).is_file() and (folder / BEST_INFO_FILE).is_file():
        weights = torch.load(folder / BEST_WEIGHTS_FILE, map_location="cpu", weights_only=True)
        return weights, json.loads((folder / BEST_INFO_FILE).read_text())
    # a data-parallel trial's checkpoints lie in its Train run's folder, inside the Tune trial's
    patterns = (f"{TUNE_DIR}/*{trial_id}*/{CHECKPOINT_PREFIX}*", f"{TUNE_DIR}/*{trial_id}*/*/{CHECKPOINT_PREFIX}*")
    checkpoints = [path for pattern in patterns for path in sorted(study_dir.glob(pattern)) if path.is_dir()]
    if checkpoints:
        # checkpoint_000004 sorts after checkpoint_000003, and Train's timestamped names sort by time: the newest
        state = load_state(checkpoints[-1])
        if state.best_weights is not None:
            return state.best_weights, {**state.identity, "best_epoch": state.best_epoch,
                                        "best_valid": state.best_valid, "best_test": state.best_test,
                                        "epoch": state.epoch}
    raise UserError(f"{study_dir}: trial {trial_id} kept no model (no {MODELS_DIR}/{trial_id}/{BEST_WEIGHTS_FILE} "
                    "and no checkpoint); studies run before models were kept cannot be exported")


def prepared_dataset(study: dict[str, Any], identity: dict[str, Any], max_len: int) -> Path:
    """The prepared dataset the model was trained on: the cached copy with its content hash, or prepared again
    from the study's dataset section (its source), which must give the same content hash."""
    from study.data import prepared_copy

    dataset = dict(study.get("dataset") or {})
    return prepared_copy(identity, max_len, source=dataset.get("source"), kcore=dataset.get("kcore"),
                         **dict(dataset.get("options") or {}))


def export_model(study_dir: str | Path, out: str | Path, trial: str | None = None) -> Path:
    """Write the self-contained model folder (see the module docstring); returns ``out``."""
    trial_id, study = choose_trial(Path(study_dir), trial)
    return write_export(Path(study_dir), Path(out), trial_id, study)


def write_export(study_dir: Path, out: Path, trial_id: str, study: dict[str, Any]) -> Path:
    """Write trial ``trial_id``'s model folder (see the module docstring); ``study`` is the study's resolved YAML."""
    from study.data import raw_items

    weights, info = find_best_model(study_dir, trial_id)
    # a run recorded before a key existed rebuilds, and retrains from config.yaml, as it ran (not today's default)
    info = upgrade_identity(info)
    model_config = dict(info["model_config"])
    path = prepared_dataset(study, info["dataset"], int(model_config.get("max_len", 50)))
    items = raw_items(path)  # before anything is written: a dataset without the item map is an error
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not empty; give a new folder")
    out.mkdir(parents=True, exist_ok=True)
    torch.save(weights, out / BEST_WEIGHTS_FILE)
    info = {**info, "model_config": model_config, "study": study.get("name"), "trial_id": trial_id}
    (out / BEST_INFO_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
    settings = {**info.get("settings", {}), **{k: v for k, v in model_config.items() if k not in DATA_SIZED}}
    (out / CONFIG_FILE).write_text(f"# python -m study.train --model {info['model']} --dataset "
                                   f"{info['dataset']['name']} --config {CONFIG_FILE}\n"
                                   + yaml.safe_dump(settings, sort_keys=False))
    shutil.copyfile(path / "meta.json", out / DATASET_FILE)
    pd.DataFrame({"item": range(1, len(items)), "raw_item": items[1:].astype(str)}).to_parquet(out / ITEMS_FILE)
    pq.write_table(pq.read_table(path / "sequences.parquet", columns=["user", "raw_user", "items"]),
                   out / HISTORIES_FILE)
    return out


def describe_export(out: Path, metric: str, chosen: bool) -> str:
    """The line naming what ``out`` holds: the study and trial, the trial's ``metric`` at its kept epoch (read
    back from the written ``model.json``, so it is what the exported weights scored), and why this trial.

    ``chosen`` says whether the trial was given with ``--trial``; otherwise it is the study's best on ``metric``.
    """
    info = json.loads((out / BEST_INFO_FILE).read_text())
    value = dict(info.get("best_valid") or {}).get(metric.removeprefix("valid_"))
    shown = "n/a" if value is None else f"{value:.4f}"
    why = "chosen with --trial" if chosen else f"the best on {metric}"
    return (f"exported trial {info['trial_id']} of study {info.get('study')} ({why}): {metric} {shown} at epoch "
            f"{info.get('best_epoch')}, to {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m study.export",
                                     description="Export a study's best (or a chosen) trial's model as a folder.")
    parser.add_argument("study", help="a study's results folder, e.g. results/sasrec-ml100k")
    parser.add_argument("out", help="the folder to write (new or empty)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--trial", help="the trial_id to export (trials.parquet)")
    which.add_argument("--best", action="store_true",
                       help="the best trial on the study's first validation objective (the default)")
    args = parser.parse_args(argv)
    try:
        trial_id, study = choose_trial(Path(args.study), args.trial)
        out = write_export(Path(args.study), Path(args.out), trial_id, study)
    except UserError as error:
        return print_error(error)
    print(describe_export(out, study_metric(study), chosen=args.trial is not None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
