"""Turning ``key=value`` strings into typed configs: the trainer's (:mod:`study.train.settings`) and the model's.

A trial is fully described by a model name, a dataset and a flat mapping of keys. Each key
belongs to exactly one of :class:`TrainConfig` (trainer + evaluation protocol) or the model's own
config dataclass, so ``--set`` on the command line and the sweep YAML use the same names.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import models
from models import ConfigError
from study.schema import renamed_hint
from study.train.settings import (  # noqa: F401 (the names callers import from here)
    AUTO_VALUES,
    COMPILE_MODES,
    CUDA_GRAPH_MODES,
    EVAL_MODES,
    METRIC_KS,
    NEGATIVE_SAMPLERS,
    PRECISIONS,
    SELECTABLE_METRICS,
    SELECTION_METRIC,
    TrainConfig,
)

TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
AUTO_TRAIN_FIELDS = {name for name, f in TRAIN_FIELDS.items() if f.default is None}


def asks_for_cuda_graphs(train: TrainConfig) -> bool:
    """Whether ``train`` compiles its step in a mode that replays CUDA graphs (on a GPU; a CPU step has none)."""
    return train.compile and train.compile_mode in CUDA_GRAPH_MODES


def cuda_graph_conflict(train: TrainConfig, objective: str) -> str | None:
    """Why ``train`` may not replay ``objective`` (already resolved) as CUDA graphs, or None when it may.

    Every objective but ``last`` selects its scored positions with a mask whose count changes from batch to batch.
    Under torch 2.11's CUDA-graph trees such a step (SASRec's causal CE, BERT4Rec's cloze) dies with a segmentation
    fault in the backward's first run, graph partition on or off; a crashed process loses the whole trial, so the
    mode is refused up front."""
    if not asks_for_cuda_graphs(train) or objective == "last":
        return None
    return (f"{train.compile_mode!r} replays CUDA graphs, which only the `last` objective runs under: {objective!r} "
            "scores a batch-dependent number of positions, as the causal and cloze steps that crash them do; use "
            "compile_mode: default")


def field_type(field: dataclasses.Field, owner: type) -> type:
    hint = typing.get_type_hints(owner)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return args[0]
    return hint


def coerce(key: str, value: Any, target: type) -> Any:
    """Convert a command-line string (or a YAML scalar) to the declared type of ``key``; a trainer setting whose
    default is None (left to the trainer) also takes ``auto``."""
    if key in AUTO_TRAIN_FIELDS and (value is None or str(value).strip().lower() in AUTO_VALUES):
        return None
    if isinstance(value, str):
        text = value.strip()
        if target is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            expected = "a boolean or auto" if key in AUTO_TRAIN_FIELDS else "a boolean"
            raise ConfigError([(key, f"expected {expected}, got {value!r}")])
        try:
            if target is int:
                number = float(text)  # accepts "1e3" and "2.0" for integer keys
                if not number.is_integer():
                    raise ValueError
                return int(number)
            return target(text)
        except ValueError:
            raise ConfigError([(key, f"expected {target.__name__}, got {value!r}")]) from None
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if target is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, target) or (target is int and isinstance(value, bool)):
        raise ConfigError([(key, f"expected {target.__name__}, got {type(value).__name__} {value!r}")])
    return value


def split_settings(model_name: str, settings: dict[str, Any]) -> tuple[TrainConfig, dict[str, Any]]:
    """Route each key to the trainer or the model config, typed; report every bad key at once.

    ``num_items`` is not a user setting: it comes from the dataset.
    """
    model_fields = models.config_fields(model_name)
    model_config_class = models.model_class(model_name).config_class
    train_values, model_values, errors = {}, {}, []
    for key, value in settings.items():
        try:
            if key in TRAIN_FIELDS:
                train_values[key] = coerce(key, value, field_type(TRAIN_FIELDS[key], TrainConfig))
            elif key in model_fields and key != "num_items":
                model_values[key] = coerce(key, value, field_type(model_fields[key], model_config_class))
            else:
                known = sorted(set(TRAIN_FIELDS) | set(model_fields) - {"num_items"})
                errors.append((key, f"unknown key for model {model_name}{renamed_hint(key)}; known keys: "
                                    f"{', '.join(known)}"))
        except ConfigError as error:
            errors.extend(error.errors)
    if errors:
        raise ConfigError(errors)
    train = TrainConfig(**train_values)
    errors = train.constraint_errors()
    if train.objective != "auto" and train.objective not in models.OBJECTIVES:
        errors.insert(0, ("objective", f"must be auto or one of {models.OBJECTIVES}, got {train.objective!r}"))
    if errors:
        raise ConfigError(errors)
    return train, model_values


def parse_assignments(pairs: list[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` → ``{"a": "1", "b": "x"}``; a pair without ``=`` is an error naming it."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError([(pair, "expected key=value")])
        settings[key.strip()] = value
    return settings


def read_settings_file(path: str) -> dict[str, Any]:
    """A ``--config`` file: a YAML mapping of the keys ``--set`` takes (an exported model's ``config.yaml``)."""
    from pathlib import Path

    import yaml

    from study.errors import UserError

    file = Path(path)
    if not file.is_file():
        raise UserError(f"--config {path}: no such file")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        raise UserError(f"--config {path}: malformed YAML ({error})") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise UserError(f"--config {path}: expected a mapping of setting names to values, like --set key=value")
    return data
