"""The one place for trainer and protocol defaults, and for turning ``key=value`` strings into typed configs.

A trial is fully described by a model name, a dataset and a flat mapping of keys. Each key
belongs to exactly one of :class:`TrainConfig` (trainer + evaluation protocol) or the model's own
config dataclass, so ``--set`` on the command line and the sweep YAML use the same names.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

import models
from models import ConfigError

EVAL_MODES = ("full", "sampled")
NEGATIVE_SAMPLERS = ("uniform", "popularity")
METRIC_KS = (5, 10, 20)
SELECTION_METRIC = "ndcg@10"  # the default validation metric that picks the best epoch
SELECTABLE_METRICS = tuple(f"{name}@{k}" for name in ("hr", "ndcg", "mrr") for k in METRIC_KS)
PRECISIONS = ("fp32", "bf16", "fp16")
# torch.compile's modes; the two in CUDA_GRAPH_MODES replay the step as CUDA graphs on a GPU
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
AUTO_VALUES = ("auto", "none", "null")  # what leaves an optional setting (default None) to the trainer


@dataclass
class TrainConfig:
    """Trainer and protocol settings. The protocol fields are recorded beside every result."""

    # protocol
    objective: str = "auto"  # auto = the model's default objective
    eval_mode: str = "full"  # full ranking over all items, or `sampled` negatives
    num_negatives: int = 100
    negative_sampler: str = "uniform"
    mask_history: bool = False  # RecBole's default: history items stay rankable
    mask_prob: float = 0.2  # cloze only; BERT4Rec uses 0.2 on MovieLens, 0.6 on Beauty
    prefixes_per_user: int = 0  # `last` only: 0 = every prefix (RecBole's augmentation), n = n random ones
    # `cloze` only: windows over the whole training history whose starts are n items apart; None (`auto`) = BERT4Rec's
    # reference code, 0.1 x max_len; 0 = each user's newest window only, which data-parallel workers and streamed
    # datasets need (they hold no whole histories). See study.train.objectives.resolve_cloze_window_step
    cloze_window_step: int | None = None
    # `sampled_ce` only (training negatives; num_negatives/negative_sampler above are the *evaluation* protocol's)
    train_negatives: int = 256  # eSASRec's SS-256
    train_negative_sampler: str = "uniform"  # uniform or popularity, always with the logQ correction
    # optimisation
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 128
    max_epochs: int = 200
    patience: int = 10  # epochs without a better validation score (selection_metric) before stopping
    # the validation metric that picks the best epoch (whose test metrics are reported) and drives early stopping;
    # a published protocol may use another (S3Rec's stops on NDCG@20)
    selection_metric: str = SELECTION_METRIC
    time_budget_s: float = 0.0  # 0 = no limit; otherwise stop after the epoch that crosses it
    grad_clip: float = 0.0
    seed: int = 0
    # execution
    device: str = "auto"  # auto = cuda when available, else cpu
    num_threads: int = 0  # 0 = leave torch's default; Ray trials set it to their CPU share
    eval_batch_size: int = 256
    measure_efficiency: bool = True
    # bf16/fp16 autocast of the forward pass and loss (CUDA only: a CPU step stays fp32), and torch.compile of the
    # training loss, network included (anywhere; on a CPU its first step compiles for minutes). Both change the
    # arithmetic, so both are recorded and off by default.
    precision: str = "fp32"
    compile: bool = False
    # torch.compile's mode under `compile`. `reduce-overhead` replays the compiled loss, forward and backward, as
    # CUDA graphs: a few launches where eager issues hundreds, and the zoo's steps on a GPU wait on launches, not
    # arithmetic, so replaying them shortens an epoch several-fold. Only the `last` objective may use it
    # (cuda_graph_conflict says why). A CPU step has no graphs to replay and runs as `default`.
    compile_mode: str = "default"
    # drop the leading columns that are padding in every row of a batch and run its windows in length groups
    # (training, evaluation, latency): the same results at real items, less compute. None (`auto`) trims on a CPU
    # and not on CUDA, where a step at the zoo's sizes waits on kernel launches, not arithmetic, and the groups
    # multiply the launches, so a trimmed step is slower there than a full one
    # (`python -m benchmarks.padding --device cuda` compares them). `auto` does not trim under `compile` either:
    # each trimmed width and length group would be a graph to compile. The row records what ran.
    trim_padding: bool | None = None

    def constraint_errors(self) -> list[tuple[str, str]]:
        errors = []
        if self.objective != "auto" and self.objective not in models.OBJECTIVES:
            errors.append(("objective", f"must be auto or one of {models.OBJECTIVES}, got {self.objective!r}"))
        if self.eval_mode not in EVAL_MODES:
            errors.append(("eval_mode", f"must be one of {EVAL_MODES}, got {self.eval_mode!r}"))
        if self.negative_sampler not in NEGATIVE_SAMPLERS:
            errors.append(("negative_sampler", f"must be one of {NEGATIVE_SAMPLERS}, got {self.negative_sampler!r}"))
        if self.train_negative_sampler not in NEGATIVE_SAMPLERS:
            errors.append(("train_negative_sampler",
                           f"must be one of {NEGATIVE_SAMPLERS}, got {self.train_negative_sampler!r}"))
        for key in ("num_negatives", "train_negatives"):
            if getattr(self, key) < 1:
                errors.append((key, f"must be >= 1, got {getattr(self, key)}"))
        if not 0.0 < self.mask_prob < 1.0:
            errors.append(("mask_prob", f"must be in (0, 1), got {self.mask_prob}"))
        for key in ("batch_size", "max_epochs", "eval_batch_size"):
            if getattr(self, key) < 1:
                errors.append((key, f"must be >= 1, got {getattr(self, key)}"))
        for key in ("prefixes_per_user", "cloze_window_step", "patience", "num_threads"):
            if (getattr(self, key) or 0) < 0:
                errors.append((key, f"must be >= 0, got {getattr(self, key)}"))
        if self.lr <= 0:
            errors.append(("lr", f"must be > 0, got {self.lr}"))
        if self.selection_metric not in SELECTABLE_METRICS:
            errors.append(("selection_metric", f"must be one of {SELECTABLE_METRICS}, got {self.selection_metric!r}"))
        if self.precision not in PRECISIONS:
            errors.append(("precision", f"must be one of {PRECISIONS}, got {self.precision!r}"))
        if self.compile_mode not in COMPILE_MODES:
            errors.append(("compile_mode", f"must be one of {COMPILE_MODES}, got {self.compile_mode!r}"))
        elif self.compile_mode != "default" and not self.compile:
            errors.append(("compile_mode", f"{self.compile_mode!r} needs compile: true (the step runs eager)"))
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            errors.append(("device", f"must be auto, cpu or cuda[:N], got {self.device!r}"))
        return errors


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
                errors.append((key, f"unknown key for model {model_name}; known keys: {', '.join(known)}"))
        except ConfigError as error:
            errors.extend(error.errors)
    if errors:
        raise ConfigError(errors)
    train = TrainConfig(**train_values)
    errors = train.constraint_errors()
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
