"""A trial's complete training state after an epoch, so that training can stop and later go on bit for bit.

:func:`study.train.trainer.run_trial` hands a :class:`TrainingState` to whoever asks after each epoch (the report's
``snapshot()``) and takes one back through ``resume_from``. The state holds everything the next epoch reads: the
model and optimizer, every random generator the trainer draws from (torch's global one, Python's and numpy's global
ones that :func:`~study.train.trainer.seed_everything` seeds, the trial's numpy ``Generator`` that shuffles the
batches, the :class:`~study.train.step.TrainStep`'s torch ``Generator`` for masks and negatives), the early-stopping
state (best metrics, best epoch, best weights, epochs without gain) and the per-epoch figures the result row
summarises. Resuming from it gives the metrics an uninterrupted run gives for the same seed.

It is stored with :func:`save_state` as one ``torch.save`` file of tensors and plain Python values, which
:func:`load_state` reads with ``weights_only=True`` (no arbitrary unpickling of a file that may come from a shared
bucket). Nothing here knows about Ray: the sweep's trainable wraps the file in a Tune checkpoint.

``python -m study.train --resume-from DIR`` continues such a state outside its sweep (:func:`continuation`), e.g.
a seed that a study's epoch limit stopped before its patience ran out, under a higher limit.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from study.errors import UserError
from study.schema import SCHEMA, SCHEMA_KEY, upgrade_identity
from study.train.settings import CONTINUES, keys_with

STATE_FILE = "training_state.pt"
FORMAT_VERSION = 1
BEST_WEIGHTS_FILE = "model.pt"  # torch.save of the best-validation state dict
BEST_INFO_FILE = "model.json"  # what those weights are (model_identity) and how they scored
# the dataset's identity: what a model's item ids mean, and whether another prepared dataset is the same one
DATASET_IDENTITY = ("name", "content_hash", "num_users", "num_items", "recipe", "kcore", "split", "synthetic")


@dataclass
class TrainingState:
    """Everything a trial needs to continue after ``epoch`` as if it had never stopped."""

    epoch: int  # the last finished epoch
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, Any]  # see capture_rng
    best_valid: dict[str, float]
    best_test: dict[str, float]
    best_epoch: int
    best_weights: dict[str, torch.Tensor] | None
    epochs_without_gain: int
    epoch_times: list[float] = field(default_factory=list)
    throughputs: list[float] = field(default_factory=list)
    train_energies: list[float] = field(default_factory=list)  # joules per epoch (NaN where not measured)
    elapsed_s: float = 0.0  # wall time spent so far, so a resumed trial's time budget counts the earlier sessions
    # the model's stats() at the best epoch (ELASTIC's expert usage); None in a state written before it was recorded
    best_extra: dict[str, float] | None = None
    # what the weights are: the model and its config, the training settings, the dataset's identity (model_identity)
    identity: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION


def capture_rng(numpy_generator: np.random.Generator, step_generator: torch.Generator) -> dict[str, Any]:
    """The state of every generator a training epoch draws from."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy_global": _numpy_global_state(),
        "numpy_generator": numpy_generator.bit_generator.state,
        "step_generator": step_generator.get_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], numpy_generator: np.random.Generator, step_generator: torch.Generator) -> None:
    """Put every generator back where :func:`capture_rng` found it."""
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuples(state["python"]))
    np.random.set_state(tuple(state["numpy_global"]))
    numpy_generator.bit_generator.state = state["numpy_generator"]
    step_generator.set_state(state["step_generator"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])


def _numpy_global_state() -> list:
    # a list, not numpy's tuple holding an ndarray: weights_only loading reads tensors and plain values only
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return [kind, torch.from_numpy(np.asarray(keys).copy()), int(position), int(has_gauss), float(cached)]


def _as_tuples(value: Any) -> Any:
    """``random.setstate`` wants the nested tuples ``random.getstate`` gave (a round trip may turn them to lists)."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def save_state(state: TrainingState, folder: str | Path) -> Path:
    """Write ``state`` as ``folder/training_state.pt``; returns the file's path."""
    path = Path(folder) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    # fields one level deep, not dataclasses.asdict: that deep-copies every tensor before writing it
    torch.save({f.name: getattr(state, f.name) for f in fields(state)}, path)
    return path


def load_state(folder: str | Path, map_location: str | torch.device = "cpu") -> TrainingState:
    """Read the state :func:`save_state` wrote in ``folder`` (tensors and plain values only)."""
    path = Path(folder) / STATE_FILE
    if not path.is_file():
        raise UserError(f"{folder} holds no {STATE_FILE} (a sweep keeps one in each trial's checkpoint folder, "
                        "results/<study>/tune/<trial>/checkpoint_NNNNNN)")
    data = torch.load(path, map_location=map_location, weights_only=True)
    if data.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{path} holds training state format {data.get('format_version')}, this code reads "
                        f"{FORMAT_VERSION}")
    known = {f.name for f in fields(TrainingState)}
    return TrainingState(**{k: v for k, v in data.items() if k in known})


# what a continued trial may change: when it stops, where it runs and what it measures (study.train.settings)
CONTINUATION_KEYS = keys_with(CONTINUES)


def continuation(state: TrainingState, overrides: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The model name, settings and dataset identity that continue ``state``'s trial: the model config and training
    settings it recorded, with ``overrides`` of :data:`CONTINUATION_KEYS` only. Any other key is refused: the
    continued epochs would then train another configuration than the ones before them."""
    identity = upgrade_identity(state.identity)
    if not identity.get("model") or "settings" not in identity:
        raise UserError("this training state records no model identity, so it cannot be continued")
    refused = sorted(set(overrides) - set(CONTINUATION_KEYS))
    if refused:
        raise UserError(f"a continued trial keeps its settings: --set may change only {', '.join(CONTINUATION_KEYS)}, "
                        f"not {', '.join(refused)}")
    model_config = {k: v for k, v in identity.get("model_config", {}).items() if k != "num_items"}  # the data's
    settings = {**model_config, **identity["settings"], **overrides}
    return identity["model"], settings, dict(identity.get("dataset") or {})


MISSING = object()  # a key one side of identity_changes lacks


def identity_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How the run about to continue a state differs from the one that wrote it (both :func:`model_identity`
    records), one ``what: before -> now`` line each; empty when the continued epochs train what the earlier ones did.

    :data:`CONTINUATION_KEYS` may differ. The recorded identity is first read as today's keys mean it
    (:func:`study.schema.upgrade_identity`): a state written before ``window_step`` existed trained a causal
    objective on each user's newest window, so it continues only where today's run would too. A key the state
    lacks even so (one whose earlier meaning :mod:`study.schema` does not know) is a difference."""
    if not recorded:
        return []
    plain = json.loads(json.dumps({"recorded": upgrade_identity(recorded), "current": current}, default=str))
    before, now = plain["recorded"], plain["current"]
    changes = []
    if before.get("model") != now.get("model"):
        changes.append(f"model: {before.get('model')} -> {now.get('model')}")
    for section, skipped in (("model_config", ()), ("settings", CONTINUATION_KEYS)):
        old, new = before.get(section) or {}, now.get(section) or {}
        changes += [f"{key}: {_shown(old, key, 'not recorded')} -> {_shown(new, key, 'unknown to this version')}"
                    for key in sorted(set(old) | set(new))
                    if key not in skipped and old.get(key, MISSING) != new.get(key, MISSING)]
    old_hash, new_hash = ((side.get("dataset") or {}).get("content_hash") for side in (before, now))
    if old_hash and new_hash and old_hash != new_hash:
        changes.append(f"dataset content_hash: {old_hash} -> {new_hash}")
    return changes


def _shown(values: dict[str, Any], key: str, absent: str) -> str:
    return repr(values[key]) if key in values else absent


def model_identity(model_name: str, model_config: dict[str, Any], train_settings: dict[str, Any],
                   dataset_meta: dict[str, Any]) -> dict[str, Any]:
    """What a trial's weights are: the registry model and its full config, the training settings (the protocol
    included) and the dataset's identity, as plain JSON values."""
    return {SCHEMA_KEY: SCHEMA, "model": model_name, "model_config": dict(model_config),
            "settings": dict(train_settings),
            "dataset": {key: dataset_meta.get(key) for key in DATASET_IDENTITY}}


def save_best_model(state: TrainingState, folder: str | Path) -> Path:
    """Write the state's best-validation weights (``model.pt``) and what they are (``model.json``) to ``folder``."""
    import json
    import os

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / BEST_WEIGHTS_FILE
    partial = folder / f".{BEST_WEIGHTS_FILE}.tmp-{os.getpid()}"
    torch.save(state.best_weights, partial)
    os.replace(partial, weights)  # a trial stopped mid-write leaves the previous best, never half a file
    info = {**state.identity, "best_epoch": state.best_epoch, "best_valid": state.best_valid,
            "best_test": state.best_test, "epoch": state.epoch}
    partial_info = folder / f".{BEST_INFO_FILE}.tmp-{os.getpid()}"
    partial_info.write_text(json.dumps(info, indent=2, default=str) + "\n")
    os.replace(partial_info, folder / BEST_INFO_FILE)
    return weights
