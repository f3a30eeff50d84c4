"""Scalability study: peak memory and latency against sequence length, one isolated Ray task per grid cell.

    python -m study.scaling search_spaces/scaling.yaml [--set key=value ...] [--dry-run] [--overwrite]

The grid is models (each with its config) × sequence lengths N × batch sizes × modes. ``train`` is one
optimisation step (forward + backward + Adam, :class:`study.train.step.TrainStep`, with the study's objective);
``inference`` is what serving a batch costs: encoder + scores over all items + top-k
(:func:`study.train.efficiency.inference_latency_ms`). Flow:

1. The YAML is read and every cell is validated before Ray starts (unknown models, keys or backends, a length
   or config the model refuses, impossible batch sizes ...): every error at once, each naming its key and
   cell, exit code 2. ``--dry-run`` stops there.
2. The dataset is prepared, and each (N, batch) gets one batch of real user histories, shared by every model,
   tiled where a history is shorter than N + 1 (recorded per cell in ``sequences``).
3. Each cell runs as its own Ray task (one GPU per cell where the cluster has GPUs), which starts a fresh
   Python process for the cell and measures in it, so no other cell's memory is in its figures. The process
   is capped at ``measure.memory_limit_mb`` (RLIMIT_DATA on a CPU, the allocator fraction on a GPU) and
   killed after ``measure.timeout_s``. In it: the model runs once at N = 4 (one-time runtime set-up), then
   the cell's model is built and the peak memory of its first run recorded
   (:func:`study.train.efficiency.measure_peak_mb`: CUDA allocator peak, or VmHWM − baseline RSS), more warm-up
   runs, then timed repeats (median and p95). Lengths of one (model, mode, batch) series run in increasing
   order; after an OOM, timeout or crash at some N the series' larger lengths are recorded as skipped.
   Any other failure is recorded with its error and the study goes on.
4. ``results/<study>/`` (or ``storage:``): ``cells.parquet`` + ``cells.csv`` (one row per cell, failures
   included), ``summary.csv``, log-log plots of memory and time against N and ratio plots against the
   reference model (PNG + SVG), ``scaling.md`` (growth exponents with R², ratios at ``compare_length``, paper
   claims met or missed with the numbers) and ``environment.json``.

The schema is in ``docs/scaling.md`` and :data:`SCHEMA_HELP`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from study.errors import UserError, print_error
from study.spec.yaml_io import NAME_PATTERN
from study.storage import Mirror, resolve_storage

if TYPE_CHECKING:
    from study.spec.yaml_io import ConfigErrors

# torch, the model zoo and the study-config helpers are imported inside the functions that need them: this module
# is also what every cell's Ray worker and measuring process import first, and torch alone takes seconds to load.

MODES = ("train", "inference")
METRICS = {"memory": "peak_mem_mb", "time": "time_ms_median"}
# Keys of study.train.config.TrainConfig that change what one training step costs; the rest (epochs, evaluation,
# patience ...) mean nothing for a single step, and device/threads are set by the study from resources.
TRAIN_KEYS = ("objective", "lr", "weight_decay", "mask_prob", "seed")
STUDY_SET_KEYS = ("num_items", "max_len")  # every cell sets these itself
TOP_LEVEL = ("name", "dataset", "num_items", "models", "train", "lengths", "batch_sizes", "tokens_per_batch",
             "modes", "measure", "fit", "compare_length", "reference", "claims", "resources", "stop_after_failure",
             "seed", "storage")
ENTRY_KEYS = ("label", "model", "config", "train", "expected_growth")
MEASURE_DEFAULTS = {"warmup": 1, "repeats": 3, "timeout_s": 300.0, "memory_limit_mb": None, "top_k": 20,
                    "prewarm": True}
CLAIM_KEYS = ("paper", "text", "model", "reference", "mode", "metric", "length", "max_ratio", "min_factor",
              "batch_size")
# What "grows linearly" and "grows quadratically" mean for a fitted log-log slope (the targets).
EXPECTED_GROWTH = {"linear": (0.0, 1.15), "quadratic": (1.7, 2.3)}
STOPPING_STATUSES = ("oom", "timeout", "crashed")
DEFAULT_OBJECTIVE = "last"  # see docs/scaling.md: the papers' RecBole baselines, and no O(N·items) loss term
STARTUP_GRACE_S = 180.0  # worker + interpreter start-up allowed on top of a cell's timeout before it is cancelled
WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}  # idle OpenMP threads must not spin on a core another cell times

SCHEMA_HELP = """\
scaling YAML (docs/scaling.md has the full reference):
  name: scaling-default              # results go to results/<name>/ unless storage: is set
  dataset: {name: ml-100k, source: null, kcore: null, options: {}}   # whose user histories fill the batches
  num_items: null                    # catalogue size of every model; null = the dataset's (may only enlarge it)
  models:                            # one line per entry in every plot; label defaults to model[-backend]
    - {label: sasrec-math, model: sasrec, config: {attention_backend: math}, expected_growth: quadratic}
    - {model: elastic, config: {num_layers: 2}, expected_growth: linear}
  train: {objective: last}           # objective, lr, weight_decay, mask_prob, seed; an entry's train: overrides
  lengths: [64, 128, 256, 512, 1024]
  batch_sizes: [8]                   # or tokens_per_batch: 8192 (batch = tokens // N at each length)
  modes: [train, inference]
  measure: {warmup: 1, repeats: 3, timeout_s: 300, memory_limit_mb: 4096, top_k: 20, prewarm: true}
  fit: {min_length: 256}             # growth exponents are fitted over the lengths >= min_length
  compare_length: 1024               # the N of the ratio columns (default 1024 if in the grid, else the largest)
  reference: sasrec-math             # the label ratios are taken against
  claims:                            # checked against the measurements: max_ratio (model/reference <=) or
    - {paper: ELASTIC, text: "90% less training memory", model: elastic, reference: sasrec-math,
       mode: train, metric: memory, length: 1024, max_ratio: 0.10}   # min_factor (reference/model >=)
  resources: {cpu: 1, gpu: auto, max_concurrent: auto}              # per cell
  stop_after_failure: true           # after an OOM/timeout/crash at N, skip that series' larger N
  seed: 0
  storage: null                      # a folder, or a URI (s3://…, gs://…) mirrored as cells finish
override any field with --set key=value (dotted; values are YAML: --set lengths=[64,128])"""


# ---------------------------------------------------------------------------------------------------------------
# The resolved study


@dataclass
class ModelEntry:
    """One line of the plots: a registered model with its config and the training settings of its steps."""

    label: str
    model: str
    config: dict[str, Any]  # typed model hyperparameters (num_items and max_len are set per cell)
    train: dict[str, Any]  # TRAIN_KEYS, typed, objective resolved for this model
    expected_growth: str | None = None


@dataclass
class Claim:
    """A paper's efficiency statement: ``model`` against ``reference`` on one metric at one length."""

    paper: str
    text: str
    model: str
    reference: str
    mode: str
    metric: str  # memory | time
    length: int
    max_ratio: float | None = None  # met when model / reference <= max_ratio
    min_factor: float | None = None  # met when reference / model >= min_factor
    batch_size: int | None = None  # None: every batch of the grid


@dataclass
class ScalingStudy:
    name: str
    dataset: dict[str, Any]
    models: list[ModelEntry]
    lengths: list[int]
    modes: list[str]
    batch_sizes: list[int] = field(default_factory=list)
    tokens_per_batch: int | None = None
    num_items: int | None = None
    measure: dict[str, Any] = field(default_factory=lambda: dict(MEASURE_DEFAULTS))
    fit_min_length: int = 0
    compare_length: int = 0
    reference: str = ""
    claims: list[Claim] = field(default_factory=list)
    resources: dict[str, Any] = field(default_factory=lambda: {"cpu": 1, "gpu": "auto", "max_concurrent": "auto"})
    stop_after_failure: bool = True
    seed: int = 0
    storage: Path = Path("results")  # the local folder every writer uses
    storage_uri: str | None = None  # where that folder is mirrored (s3://…), if anywhere: see study.storage
    source: Path | None = None

    def batch_keys(self) -> list[str]:
        """One series per batch setting: ``"8"`` for a fixed batch, ``"65536 tokens"`` for tokens_per_batch."""
        if self.tokens_per_batch:
            return [f"{self.tokens_per_batch} tokens"]
        return [str(b) for b in self.batch_sizes]

    def batch_size(self, batch_key: str, length: int) -> int:
        if self.tokens_per_batch:
            return self.tokens_per_batch // length
        return int(batch_key)

    def entry(self, label: str) -> ModelEntry:
        return next(e for e in self.models if e.label == label)

    def cells(self) -> list[Cell]:
        """Every cell, grouped by series (label, mode, batch) and in increasing length within a series."""
        cells = []
        for entry in self.models:
            for mode in self.modes:
                for batch_key in self.batch_keys():
                    for length in self.lengths:
                        cells.append(Cell(len(cells), entry.label, entry.model, mode, length,
                                          self.batch_size(batch_key, length), batch_key))
        return cells

    def to_dict(self) -> dict[str, Any]:
        """The resolved study as plain YAML data (defaults filled in, overrides applied)."""
        data = {
            "name": self.name, "dataset": dict(self.dataset), "num_items": self.num_items,
            "models": [{"label": e.label, "model": e.model, "config": dict(e.config), "train": dict(e.train),
                        "expected_growth": e.expected_growth} for e in self.models],
            "lengths": list(self.lengths),
        }
        if self.tokens_per_batch:
            data["tokens_per_batch"] = self.tokens_per_batch
        else:
            data["batch_sizes"] = list(self.batch_sizes)
        data.update({
            "modes": list(self.modes), "measure": dict(self.measure), "fit": {"min_length": self.fit_min_length},
            "compare_length": self.compare_length, "reference": self.reference,
            "claims": [{k: v for k, v in asdict(c).items() if v is not None} for c in self.claims],
            "resources": dict(self.resources), "stop_after_failure": self.stop_after_failure, "seed": self.seed,
            "storage": self.storage_uri or str(self.storage),
        })
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=120, allow_unicode=True)


@dataclass(frozen=True)
class Cell:
    index: int
    label: str
    model: str
    mode: str
    length: int
    batch_size: int
    batch_key: str

    @property
    def series(self) -> tuple[str, str, str]:
        return (self.label, self.mode, self.batch_key)


# ---------------------------------------------------------------------------------------------------------------
# Reading and validation: every problem at once, each as "file:line: dotted.key: message"


def _mapping(data: dict, key: str, errors: ConfigErrors, allowed: tuple[str, ...], path: tuple = ()) -> dict:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.add(path + (key,), f"must be a mapping, got {type(value).__name__} {value!r}")
        return {}
    for unknown in value:
        if unknown not in allowed:
            errors.add(path + (key, unknown), f"unknown key; {key} takes {', '.join(allowed)}")
    return value


def _integer(value: Any, path: tuple, errors: ConfigErrors, minimum: int | None = None) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        errors.add(path, f"expected an integer, got {type(value).__name__} {value!r}")
        return None
    if minimum is not None and value < minimum:
        errors.add(path, f"must be >= {minimum}, got {value}")
        return None
    return int(value)


def _number(value: Any, path: tuple, errors: ConfigErrors, positive: bool = True) -> float | None:
    if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        errors.add(path, f"expected a number, got {type(value).__name__} {value!r}")
        return None
    if positive and value <= 0:
        errors.add(path, f"must be > 0, got {value}")
        return None
    return float(value)


def _int_list(data: dict, key: str, errors: ConfigErrors, minimum: int) -> list[int]:
    raw = data.get(key)
    if not isinstance(raw, list) or not raw:
        errors.add((key,), f"must be a non-empty list of integers, got {raw!r}")
        return []
    values = []
    for index, value in enumerate(raw):
        number = _integer(value, (key, index), errors, minimum)
        if number is not None:
            if number in values:
                errors.add((key, index), f"{number} is listed twice")
            else:
                values.append(number)
    return values


def load_scaling_study(path: str | Path, assignments: list[str] | None = None, *,
                       check_machine: bool = True) -> ScalingStudy:
    """Read, override and validate a scaling YAML; raises :class:`StudyConfigError` listing every problem."""
    from study.spec.yaml_io import apply_overrides, read_yaml

    path = Path(path)
    data, lines = read_yaml(path)
    overridden = apply_overrides(data, assignments or [])
    return resolve(data, source=path, lines=lines, overridden=overridden, check_machine=check_machine)


def resolve(data: dict[str, Any], *, source: Path | None = None, lines: dict[tuple, int] | None = None,
            overridden: set[tuple] | None = None, check_machine: bool = True) -> ScalingStudy:
    """Check every section and every cell against its model's constraints; all errors at once."""
    from study.spec.sweep import resolve_dataset
    from study.spec.yaml_io import ConfigErrors, StudyConfigError

    errors = ConfigErrors(source, lines or {}, overridden or set())
    for key in data:
        if key not in TOP_LEVEL:
            errors.add((key,), f"unknown section; a scaling study takes {', '.join(TOP_LEVEL)}")

    name = data.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        errors.add(("name",), f"required: letters, digits, '.', '_' or '-' (it names the results folder), "
                              f"got {name!r}")
        name = "scaling"
    dataset = resolve_dataset(data, errors, source)
    num_items = None if data.get("num_items") is None else _integer(data["num_items"], ("num_items",), errors, 1)

    lengths = sorted(_int_list(data, "lengths", errors, minimum=1))
    batch_sizes, tokens = _resolve_batches(data, errors, lengths)
    modes = _resolve_modes(data, errors)
    measure = _resolve_measure(data, errors)
    entries = _resolve_models(data, errors, lengths, num_items)
    labels = [e.label for e in entries]

    fit = _mapping(data, "fit", errors, ("min_length",))
    default_fit = lengths[-3] if len(lengths) >= 3 else (lengths[0] if lengths else 0)
    fit_min = _integer(fit.get("min_length", default_fit), ("fit", "min_length"), errors, 1) or default_fit
    if lengths and sum(n >= fit_min for n in lengths) < 2:
        errors.add(("fit", "min_length"), f"{fit_min} leaves {sum(n >= fit_min for n in lengths)} length(s) of "
                                          f"{lengths} to fit a growth exponent; it needs at least 2")

    default_compare = 1024 if 1024 in lengths else (lengths[-1] if lengths else 0)
    compare = data.get("compare_length", default_compare)
    compare = _integer(compare, ("compare_length",), errors, 1) or default_compare
    if lengths and compare not in lengths:
        errors.add(("compare_length",), f"{compare} is not one of the lengths {lengths}")

    default_reference = "sasrec-math" if "sasrec-math" in labels else (labels[0] if labels else "")
    reference = data.get("reference", default_reference)
    if labels and reference not in labels:
        errors.add(("reference",), f"{reference!r} is not a model label; labels: {', '.join(labels)}")

    claims = _resolve_claims(data, errors, labels, modes, batch_sizes)
    resources = _resolve_resources(data, errors, check_machine)
    stop = data.get("stop_after_failure", True)
    if not isinstance(stop, bool):
        errors.add(("stop_after_failure",), f"expected true or false, got {stop!r}")
        stop = True
    seed = _integer(data.get("seed", 0), ("seed",), errors, 0) or 0
    try:
        storage, storage_uri = resolve_storage(data.get("storage"), name)
    except UserError as error:
        errors.add(("storage",), str(error))
        storage, storage_uri = resolve_storage(None, name)
    if errors.items:
        raise StudyConfigError(errors.items)
    return ScalingStudy(name=name, dataset=dataset, models=entries, lengths=lengths, modes=modes,
                        batch_sizes=batch_sizes, tokens_per_batch=tokens, num_items=num_items, measure=measure,
                        fit_min_length=fit_min, compare_length=compare, reference=reference, claims=claims,
                        resources=resources, stop_after_failure=stop, seed=seed, storage=storage,
                        storage_uri=storage_uri, source=source)


def _resolve_batches(data: dict, errors: ConfigErrors, lengths: list[int]) -> tuple[list[int], int | None]:
    has_batches, has_tokens = data.get("batch_sizes") is not None, data.get("tokens_per_batch") is not None
    if has_batches == has_tokens:
        errors.add(("batch_sizes",), "give exactly one of batch_sizes (a list) and tokens_per_batch (batch = "
                                     "tokens // N at each length)")
        return [], None
    if has_batches:
        return _int_list(data, "batch_sizes", errors, minimum=1), None
    tokens = _integer(data["tokens_per_batch"], ("tokens_per_batch",), errors, 1)
    if tokens is not None:
        for length in lengths:
            if tokens // length < 1:
                errors.add(("tokens_per_batch",), f"{tokens} tokens give batch 0 at N={length} (every model's "
                                                  f"cells at N={length}); it must be >= the largest length")
    return [], tokens


def _resolve_modes(data: dict, errors: ConfigErrors) -> list[str]:
    raw = data.get("modes", list(MODES))
    if not isinstance(raw, list) or not raw:
        errors.add(("modes",), f"must be a non-empty list of {', '.join(MODES)}, got {raw!r}")
        return []
    modes = []
    for index, mode in enumerate(raw):
        if mode not in MODES:
            errors.add(("modes", index), f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        elif mode in modes:
            errors.add(("modes", index), f"{mode} is listed twice")
        else:
            modes.append(mode)
    return modes


def _resolve_measure(data: dict, errors: ConfigErrors) -> dict[str, Any]:
    raw = _mapping(data, "measure", errors, tuple(MEASURE_DEFAULTS))
    measure = dict(MEASURE_DEFAULTS)
    for key in ("warmup", "repeats", "top_k"):
        if key in raw:
            measure[key] = _integer(raw[key], ("measure", key), errors, 1) or MEASURE_DEFAULTS[key]
    if "timeout_s" in raw:
        measure["timeout_s"] = _number(raw["timeout_s"], ("measure", "timeout_s"), errors) or \
            MEASURE_DEFAULTS["timeout_s"]
    if raw.get("memory_limit_mb") is not None:
        measure["memory_limit_mb"] = _number(raw["memory_limit_mb"], ("measure", "memory_limit_mb"), errors)
    if "prewarm" in raw:
        if isinstance(raw["prewarm"], bool):
            measure["prewarm"] = raw["prewarm"]
        else:
            errors.add(("measure", "prewarm"), f"expected true or false, got {raw['prewarm']!r}")
    return measure


def _entry_label(entry: dict) -> str:
    config = entry.get("config") if isinstance(entry.get("config"), dict) else {}
    backend = config.get("attention_backend")
    return f"{entry.get('model')}-{backend}" if backend else str(entry.get("model"))


def _resolve_models(data: dict, errors: ConfigErrors, lengths: list[int], num_items: int | None) -> list[ModelEntry]:
    import models

    shared_train = _mapping(data, "train", errors, TRAIN_KEYS)
    raw = data.get("models")
    if not isinstance(raw, list) or not raw:
        errors.add(("models",), f"must be a non-empty list of {{model: NAME, config: {{...}}}}; registered models: "
                                f"{', '.join(models.available())}")
        return []
    entries, seen = [], {}
    for index, item in enumerate(raw):
        path = ("models", index)
        if isinstance(item, str):  # `- elastic` is a natural shorthand
            item = {"model": item}
        if not isinstance(item, dict):
            errors.add(path, f"expected a mapping such as {{model: sasrec, config: {{...}}}}, got {item!r}")
            continue
        for key in item:
            if key not in ENTRY_KEYS:
                errors.add(path + (key,), f"unknown key; a model entry takes {', '.join(ENTRY_KEYS)}")
        name = item.get("model")
        if name not in models.available():
            errors.add(path + ("model",), f"unknown model {name!r}; registered: {', '.join(models.available())}")
            continue
        label = item.get("label", _entry_label(item))
        if not isinstance(label, str) or not NAME_PATTERN.match(label):
            errors.add(path + ("label",), f"expected a name (letters, digits, '.', '_', '-'), got {label!r}")
            continue
        if label in seen:
            errors.add(path + ("label",), f"{label!r} is also the label of models[{seen[label]}]; give each entry "
                                          "its own label")
            continue
        seen[label] = index
        config = _mapping(item, "config", errors, tuple(models.config_fields(name)), path)
        for key in STUDY_SET_KEYS:
            if key in config:
                source_of = "lengths:" if key == "max_len" else "num_items: or the dataset"
                errors.add(path + ("config", key), f"set by the study for every cell (from {source_of}); remove it")
        own_train = _mapping(item, "train", errors, TRAIN_KEYS, path)
        growth = item.get("expected_growth")
        if growth is not None and growth not in EXPECTED_GROWTH:
            errors.add(path + ("expected_growth",), f"must be one of {', '.join(EXPECTED_GROWTH)} or null, "
                                                    f"got {growth!r}")
        entry = _check_entry(name, label, path, config, shared_train, own_train, lengths, num_items, errors,
                             data.get("lengths"))
        if entry is not None:
            entry.expected_growth = growth if growth in EXPECTED_GROWTH else None
            entries.append(entry)
    return entries


def _check_entry(name: str, label: str, path: tuple, config: dict, shared_train: dict, own_train: dict,
                 lengths: list[int], num_items: int | None, errors: ConfigErrors,
                 data_lengths: Any) -> ModelEntry | None:
    """Type the entry's settings, then build its config at every length: the model declares its constraints."""
    import models
    from models import ConfigError
    from study.train.config import split_settings
    from study.train.objectives import resolve_objective

    def home(key: str) -> tuple:
        if key in config:
            return path + ("config", key)
        if key in own_train:
            return path + ("train", key)
        if key in shared_train:
            return ("train", key)
        return path

    listed = data_lengths if isinstance(data_lengths, list) else []  # as the file orders them
    config = {k: v for k, v in config.items() if k not in STUDY_SET_KEYS}
    settings = {"objective": DEFAULT_OBJECTIVE, **shared_train, **own_train, **config}
    try:
        train_cfg, hparams = split_settings(name, settings)
    except ConfigError as error:
        for key, message in error.errors:
            errors.add(home(key), message)
        return None
    failing: dict[tuple[str, str], list[int]] = {}
    for length in lengths:
        try:
            models.make_config(name, num_items=num_items or 2, max_len=length, **hparams)
        except ConfigError as error:
            for key, message in error.errors:
                failing.setdefault((key, message), []).append(length)
    for (key, message), bad in failing.items():
        if len(bad) == len(lengths):
            errors.add(home(key), f"{key}: {message}" if home(key) == path else message)
        else:
            for length in bad:
                # name the length where the file lists it (the study itself keeps lengths sorted)
                position = next(i for i, n in enumerate(listed) if n == length)
                errors.add(("lengths", position), f"cell ({label}, N={length}): {key}: {message}")
    if failing or not lengths:
        return None
    train = {key: getattr(train_cfg, key) for key in TRAIN_KEYS}
    try:
        model = models.build(name, num_items=num_items or 2, max_len=lengths[0], **hparams)
        train["objective"] = resolve_objective(model, train_cfg.objective)
    except ConfigError as error:
        for key, message in error.errors:
            errors.add(home(key) if key in own_train or key in shared_train else path + ("train", key),
                       f"{label}: {message}")
        return None
    return ModelEntry(label=label, model=name, config=hparams, train=train)


def _resolve_claims(data: dict, errors: ConfigErrors, labels: list[str], modes: list[str],
                    batch_sizes: list[int]) -> list[Claim]:
    raw = data.get("claims") or []
    if not isinstance(raw, list):
        errors.add(("claims",), f"must be a list of claims, got {raw!r}")
        return []
    claims = []
    for index, item in enumerate(raw):
        path = ("claims", index)
        if not isinstance(item, dict):
            errors.add(path, f"expected a mapping, got {item!r}")
            continue
        for key in item:
            if key not in CLAIM_KEYS:
                errors.add(path + (key,), f"unknown key; a claim takes {', '.join(CLAIM_KEYS)}")
        ok = True
        for key in ("model", "reference"):
            if item.get(key) not in labels:
                errors.add(path + (key,), f"{item.get(key)!r} is not a model label; labels: {', '.join(labels)}")
                ok = False
        if item.get("mode") not in modes:
            errors.add(path + ("mode",), f"{item.get('mode')!r} is not a mode of this study ({', '.join(modes)})")
            ok = False
        if item.get("metric") not in METRICS:
            errors.add(path + ("metric",), f"must be one of {', '.join(METRICS)}, got {item.get('metric')!r}")
            ok = False
        length = _integer(item.get("length"), path + ("length",), errors, 1)
        bounds = [key for key in ("max_ratio", "min_factor") if item.get(key) is not None]
        if len(bounds) != 1:
            errors.add(path, "give exactly one of max_ratio (model / reference <= x) and min_factor "
                             "(reference / model >= x)")
            ok = False
        bound = _number(item[bounds[0]], path + (bounds[0],), errors) if len(bounds) == 1 else None
        batch = item.get("batch_size")
        if batch is not None:
            batch = _integer(batch, path + ("batch_size",), errors, 1)
            if batch is not None and batch not in batch_sizes:
                errors.add(path + ("batch_size",), f"{batch} is not one of batch_sizes {batch_sizes}")
                ok = False
        if not ok or length is None or bound is None:
            continue
        claims.append(Claim(paper=str(item.get("paper", "")), text=str(item.get("text", "")), model=item["model"],
                            reference=item["reference"], mode=item["mode"], metric=item["metric"], length=length,
                            batch_size=batch, **{bounds[0]: bound}))
    return claims


def _resolve_resources(data: dict, errors: ConfigErrors, check_machine: bool) -> dict[str, Any]:
    raw = _mapping(data, "resources", errors, ("cpu", "gpu", "max_concurrent"))
    cpu = _number(raw.get("cpu", 1), ("resources", "cpu"), errors) or 1.0
    gpu = raw.get("gpu", "auto")
    if gpu != "auto":
        gpu = _number(gpu, ("resources", "gpu"), errors, positive=False)
        if gpu is not None and gpu < 0:
            errors.add(("resources", "gpu"), f"must be >= 0 or auto, got {gpu}")
    concurrent = raw.get("max_concurrent", "auto")
    if concurrent != "auto":
        concurrent = _integer(concurrent, ("resources", "max_concurrent"), errors, 1) or "auto"
    if check_machine:
        import torch

        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if cpu > usable:
            errors.add(("resources", "cpu"), f"a cell needs {cpu:g} CPUs but this machine has {usable}; no cell "
                                             "could ever start")
        if isinstance(gpu, float) and gpu > 0 and not torch.cuda.is_available():
            errors.add(("resources", "gpu"), f"{gpu:g} GPU per cell requested but this machine has no CUDA GPU "
                                             "(gpu: auto uses one when there is one)")
    return {"cpu": cpu, "gpu": gpu, "max_concurrent": concurrent}


def check_data(study: ScalingStudy, num_users: int, dataset_items: int) -> None:
    """Checks that need the prepared dataset: enough distinct users per batch, a catalogue that holds its ids."""
    from study.spec.yaml_io import ConfigErrors, StudyConfigError, read_yaml

    errors = ConfigErrors(study.source, {}, set())
    if study.source is not None:
        _, errors.lines = read_yaml(study.source)
    name = study.dataset["name"]
    for index, batch in enumerate(study.batch_sizes):
        if batch > num_users:
            errors.add(("batch_sizes", index), f"cells with batch {batch}: a batch holds distinct users and "
                                               f"{name} has {num_users}")
    if study.tokens_per_batch:
        for length in study.lengths:
            batch = study.tokens_per_batch // length
            if batch > num_users:
                errors.add(("tokens_per_batch",), f"cells at N={length} get batch {batch}, but a batch holds "
                                                  f"distinct users and {name} has {num_users}")
    if study.num_items is not None and study.num_items < dataset_items:
        errors.add(("num_items",), f"{study.num_items} is fewer than the {dataset_items} items of {name}; "
                                   "num_items may only enlarge the catalogue (real ids must stay valid)")
    if errors.items:
        raise StudyConfigError(errors.items)


# ---------------------------------------------------------------------------------------------------------------
# Real sequences


@dataclass
class RealBatch:
    windows: np.ndarray  # (B, N + 1) int64, real item ids, no padding
    users: np.ndarray  # (B,) the users whose histories fill the rows
    tiled_rows: int  # rows whose history was shorter than N + 1 and was repeated end to end
    description: str


def real_batch(history_indptr: np.ndarray, history_indices: np.ndarray, length: int, batch_size: int, *,
               seed: int, dataset_name: str = "the dataset") -> RealBatch:
    """``batch_size`` distinct users' chronological histories as full windows of ``length + 1`` real items.

    A row is a user's most recent ``length + 1`` items; a shorter history is tiled (repeated end to end, so the
    row still ends with the user's newest item). Every id is a real one and no position is padding, so every
    model pays for all N positions. The draw depends only on (seed, length, batch_size): every model of a
    study sees the same batch at a given cell.
    """
    indptr = np.asarray(history_indptr, dtype=np.int64)
    lengths = np.diff(indptr)
    candidates = np.flatnonzero(lengths > 0)
    if batch_size > len(candidates):
        raise UserError(f"batch {batch_size} needs that many distinct users; {dataset_name} has {len(candidates)}")
    rng = np.random.default_rng([seed, length, batch_size])
    users = np.sort(rng.choice(candidates, size=batch_size, replace=False))
    width = length + 1
    windows = np.empty((batch_size, width), dtype=np.int64)
    tiled = 0
    for row, user in enumerate(users):
        history = np.asarray(history_indices[indptr[user]:indptr[user + 1]], dtype=np.int64)
        if len(history) < width:
            history = np.tile(history, -(-width // len(history)))
            tiled += 1
        windows[row] = history[-width:]
    how = (f"{tiled} of {batch_size} histories shorter than {width} items tiled (repeated end to end)" if tiled
           else f"each row a user's most recent {width} items, none tiled")
    description = f"{dataset_name}: {batch_size} users' histories (seed {seed}); {how}"
    return RealBatch(windows=windows, users=users, tiled_rows=tiled, description=description)


# ---------------------------------------------------------------------------------------------------------------
# One cell: a Ray task supervising a fresh, memory-capped measuring process


def _status_value(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _limit_memory(limit_mb: float | None, device: Any) -> tuple[str, Any]:
    """Cap what this process may allocate from now on, so that a cell too big for the budget fails with an
    allocation error (recorded as OOM) instead of pushing the machine into swap or the kernel's OOM killer.

    Called once the model is built, right before the measured runs: the cap bounds what ``peak_mem_mb``
    measures. Returns (description, undo).
    """
    if not limit_mb:
        return "none", None
    import torch

    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        allowed = torch.cuda.memory_allocated(device) + limit_mb * 2**20
        torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total), device)
        return (f"{limit_mb:g} MiB above the built model (CUDA allocator fraction)",
                lambda: torch.cuda.set_per_process_memory_fraction(1.0, device))
    data_kib = _status_value("VmData")
    if data_kib is None:
        return "not enforced (no /proc/self/status)", None
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = data_kib * 1024 + int(limit_mb * 2**20)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    return (f"{limit_mb:g} MiB above the built model (RLIMIT_DATA)",
            lambda: resource.setrlimit(resource.RLIMIT_DATA, (soft, hard)))


def _is_oom(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        marker in text for marker in ("out of memory", "can't allocate memory", "cannot allocate memory",
                                      "not enough memory"))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


PREWARM_LENGTH = 4  # the tiny twin's window: every op of the model runs, at a negligible size


def _cell_runner(spec: dict[str, Any], windows: np.ndarray, length: int) -> Any:
    """A fresh model for ``spec`` at window ``length``, and a function that runs one training step or serves
    one batch on the end of ``windows`` and returns its milliseconds."""
    import torch

    import models
    from study.train import efficiency
    from study.train.step import build_step

    device = torch.device(spec["device"])
    hparams = {**spec["config"], "num_items": spec["num_items"], "max_len": length}
    window = np.ascontiguousarray(windows[:, -(length + 1):])
    if spec["mode"] == "train":
        step = build_step(spec["model"], hparams, spec["train"], device)
        batch = torch.as_tensor(window, dtype=torch.long, device=device)

        def run() -> float:
            begin = time.perf_counter()
            step(batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return (time.perf_counter() - begin) * 1000.0

        return run
    model = models.build(spec["model"], **hparams).to(device)
    inputs = window[:, :-1]

    def serve() -> float:
        # one timed serving per call (the operation inference_latency_ms times), so the deadline can be checked
        return efficiency.inference_latency_ms(model, inputs, device, batch_users=len(inputs), warmup=0, repeats=1,
                                               top_k=spec["top_k"])[0]

    return serve


def _measure(spec: dict[str, Any], windows: np.ndarray) -> dict[str, Any]:
    """In this fresh process: warm the runtime up on a tiny twin, build the cell's model, record the peak memory
    of its first run (:func:`study.train.efficiency.measure_peak_mb`), then time warm-up and repeated runs."""
    import gc

    import torch

    import models
    from study.train import efficiency
    from study.train.results import kernel_path

    started = time.monotonic()
    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    torch.manual_seed(spec["seed"])
    if spec.get("prewarm", True):
        # A fresh process's first step also pays one-time runtime set-up (kernel selection, allocator and
        # autograd structures: about 10-25 MB on a CPU) that does not depend on N; running the same model once
        # at a tiny length first keeps that constant out of the peak, so the growth with N is what is measured.
        twin = _cell_runner(spec, windows, min(PREWARM_LENGTH, spec["length"]))
        twin()
        del twin
        gc.collect()
    run = _cell_runner(spec, windows, spec["length"])
    limit, undo = _limit_memory(spec["memory_limit_mb"], device)
    try:
        peak_mb, exact = efficiency.measure_peak_mb(run, device)  # the first run is also the first warm-up
        for _ in range(spec["warmup"] - 1):
            run()
        timings: list[float] = []
        deadline = started + 0.8 * spec["timeout_s"]  # leave time to report before the supervisor gives up
        while len(timings) < spec["repeats"]:
            if timings and time.monotonic() + timings[-1] / 1000.0 > deadline:
                break
            timings.append(run())
    finally:
        if undo is not None:
            undo()
    what = "training step" if spec["mode"] == "train" else "inference batch"
    if device.type == "cuda":
        method = f"cuda max_memory_allocated, first {what}"
    else:
        method = f"fresh process {'VmHWM' if exact else 'ru_maxrss'} - baseline RSS, first {what}"
    if spec.get("prewarm", True):
        method += f" after a warm-up at N={min(PREWARM_LENGTH, spec['length'])}"
    # counted on a separate copy once everything is measured, so counting cannot touch the figures
    params = efficiency.count_parameters(models.build(spec["model"], **spec["config"], num_items=spec["num_items"],
                                                      max_len=spec["length"]))
    return {
        "status": "ok", "error": "", "peak_mem_mb": float(peak_mb), "mem_method": method,
        "time_ms_median": float(np.median(timings)), "time_ms_p95": float(np.percentile(timings, 95)),
        "time_ms_min": float(np.min(timings)), "runs": len(timings), "params": int(params),
        "memory_limit": limit, "threads": torch.get_num_threads(),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "kernel_path": kernel_path(device),
    }


def _die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel kill this process when the Ray worker that spawned it dies (a cancelled cell),
    so no orphan keeps a core busy while other cells are being timed."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _restore_priority(target: int | None) -> int:
    """Bring this process back to the study's scheduling priority; returns the niceness it runs at.

    Ray starts its workers at niceness 15 and the measuring process inherits it: on a shared machine the timed
    runs would then wait behind every other job. Raising priority needs privileges; without them the cell
    runs as it is, and the row says so.
    """
    current = os.nice(0)
    if target is not None and current > target:
        try:
            return os.nice(target - current)
        except OSError:
            pass
    return current


def _child_main() -> None:
    """Entry point of the measuring process: (spec, windows, parent pid, result fd) pickled on stdin, the
    outcome pickled to the result fd. Every failure becomes an outcome: the supervisor must always hear back."""
    spec, windows, parent_pid, result_fd = pickle.load(sys.stdin.buffer)
    _die_with_parent(parent_pid)
    niceness = _restore_priority(spec.get("niceness"))
    try:
        outcome = _measure(spec, windows)
    except BaseException as error:
        outcome = {"status": "oom" if _is_oom(error) else "failed", "error": _first_line(error)}
    outcome["niceness"] = niceness
    with os.fdopen(result_fd, "wb") as result:
        pickle.dump(outcome, result)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def run_cell(spec: dict[str, Any], windows: np.ndarray) -> dict[str, Any]:
    """Measure one cell in a fresh interpreter; never raises for a failing cell (its status says why).

    Runs as a Ray task. The measurement gets a fresh process of its own, rather than running in the Ray worker,
    because VmHWM must count nothing but this cell (a worker that ran earlier cells keeps their freed memory),
    and the memory cap (RLIMIT_DATA) must not apply to Ray's own threads. It is started with subprocess rather
    than multiprocessing, whose spawn would also start a resource-tracker process and re-run Ray's worker
    script in the child.
    """
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the measuring process imports study.scaling.core
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    child = subprocess.Popen([sys.executable, "-c", "from study.scaling.core import _child_main; _child_main()"],
                             stdin=subprocess.PIPE, pass_fds=(write_fd,), env=env)
    os.close(write_fd)  # the child holds the only writer now: its exit reads as end-of-file here
    try:
        child.stdin.write(pickle.dumps((spec, np.array(windows), os.getpid(), write_fd)))
        child.stdin.close()
        try:
            code = child.wait(timeout=spec["timeout_s"])
        except subprocess.TimeoutExpired:
            outcome = {"status": "timeout", "error": f"no result within measure.timeout_s={spec['timeout_s']:g} s"}
        else:
            payload = _read_all(read_fd)
            if payload:
                outcome = pickle.loads(payload)
            elif code == -signal.SIGKILL:
                outcome = {"status": "oom", "error": "the measuring process was killed by SIGKILL, most likely by "
                                                     "the kernel's out-of-memory killer"}
            else:
                outcome = {"status": "crashed", "error": f"the measuring process exited with code {code} before "
                                                         "reporting"}
    except BrokenPipeError:  # the child died before reading its input
        child.wait()
        outcome = {"status": "crashed", "error": f"the measuring process exited with code {child.returncode} "
                                                 "before reading the cell"}
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(read_fd)
    outcome.update(wall_s=time.monotonic() - started, node=socket.gethostname())
    return outcome


# ---------------------------------------------------------------------------------------------------------------
# Scheduling the cells on Ray


def _ray_failure(error: Exception) -> dict[str, Any]:
    import ray.exceptions as rex

    if isinstance(error, rex.OutOfMemoryError):
        return {"status": "oom", "error": "Ray's memory monitor killed the cell's worker (node memory nearly full)"}
    if isinstance(error, rex.TaskCancelledError):
        return {"status": "timeout", "error": "cancelled after its timeout plus start-up grace"}
    if isinstance(error, (rex.WorkerCrashedError, rex.NodeDiedError)):
        return {"status": "crashed", "error": _first_line(error)}
    cause = getattr(error, "cause", None)
    return {"status": "failed", "error": _first_line(cause if isinstance(cause, BaseException) else error)}


def execute(specs: list[dict[str, Any]], windows: dict[tuple[int, int], Any], *, cpu: float, gpu: float,
            max_concurrent: int, stop_after_failure: bool = True, progress: bool = False,
            on_row: Any = None) -> list[dict[str, Any]]:
    """Run cell specs as Ray tasks; returns one outcome per spec (``cell`` = its index), in order.

    A spec's ``series`` (model label, mode, batch) runs its lengths one after another in the order given, so
    that after an OOM, timeout or crash the larger lengths can be skipped rather than run. Different series
    run side by side, at most ``max_concurrent`` cells at a time. ``windows`` maps (length, batch_size) to the
    batch (an array or an ObjectRef to one).
    """
    import ray
    from tqdm.auto import tqdm

    # Workers are reused: every cell already measures in a fresh process of its own (run_cell), and one-shot
    # workers (max_calls=1) cost a Ray start-up per cell, make Ray prestart idle workers on a small machine, and
    # in Ray 2.60 abort at exit now and then ("Mutex corrupt", after the result is delivered). No retries: a
    # cell whose worker died is recorded as such, not silently measured again.
    task = ray.remote(run_cell).options(num_cpus=cpu, num_gpus=gpu, max_retries=0)
    queues: dict[tuple, deque] = {}
    for spec in specs:
        queues.setdefault(tuple(spec["series"]), deque()).append(spec)
    outcomes: dict[int, dict[str, Any]] = {}
    in_flight: dict[Any, tuple[dict[str, Any], float]] = {}
    busy: set[tuple] = set()
    bar = tqdm(total=len(specs), desc="cells", unit="cell", disable=not progress, file=sys.stderr)

    def finish(spec: dict[str, Any], outcome: dict[str, Any]) -> None:
        outcome = {"cell": spec["cell"], **outcome}
        outcomes[spec["cell"]] = outcome
        if on_row is not None:
            on_row(spec, outcome)
        bar.update(1)
        bar.set_postfix_str(f"{spec['label']} {spec['mode']} N={spec['length']}: {outcome['status']}")
        series = tuple(spec["series"])
        if stop_after_failure and outcome["status"] in STOPPING_STATUSES:
            while queues.get(series):
                skipped = queues[series].popleft()
                finish(skipped, {"status": "skipped", "error": f"skipped: {outcome['status']} at the smaller "
                                                               f"N={spec['length']}"})

    try:
        while any(queues.values()) or in_flight:
            for series, pending in queues.items():
                if len(in_flight) >= max_concurrent:
                    break
                if pending and series not in busy:
                    spec = pending.popleft()
                    ref = task.remote(spec, windows[(spec["length"], spec["batch_size"])])
                    in_flight[ref] = (spec, time.monotonic())
                    busy.add(series)
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            for ref in ready:
                spec, _ = in_flight.pop(ref)
                busy.discard(tuple(spec["series"]))
                try:
                    outcome = ray.get(ref)
                except Exception as error:  # a lost worker or a bug in the supervisor is still a data point
                    outcome = _ray_failure(error)
                finish(spec, outcome)
            now = time.monotonic()
            for ref, (spec, submitted) in list(in_flight.items()):
                if now - submitted > spec["timeout_s"] + STARTUP_GRACE_S:  # the supervisor itself is stuck
                    ray.cancel(ref, force=True)
                    in_flight.pop(ref)
                    busy.discard(tuple(spec["series"]))
                    finish(spec, {"status": "timeout", "error": f"cancelled: no answer within timeout_s + "
                                                                f"{STARTUP_GRACE_S:g} s of start-up grace"})
    finally:
        for ref in in_flight:
            ray.cancel(ref, force=True)
        bar.close()
    return [outcomes[spec["cell"]] for spec in specs if spec["cell"] in outcomes]


# ---------------------------------------------------------------------------------------------------------------
# Analysis: growth exponents, ratios, claims


@dataclass
class Growth:
    """Least-squares slope of log(value) against log(N): value ∝ N^exponent."""

    exponent: float
    r2: float
    points: int

    def describe(self) -> str:
        if not math.isfinite(self.exponent):
            return f"n/a ({self.points} point{'s' if self.points != 1 else ''})"
        r2 = f"{self.r2:.3f}" if math.isfinite(self.r2) else "n/a"
        return f"{self.exponent:.2f} (R² {r2}, {self.points} pts)"


def fit_growth(lengths: Any, values: Any) -> Growth:
    """Fit value = c·N^k on log-log axes; points that are missing or not positive are left out.

    R² is that of the log-log line (1 = an exact power law). With two points the fit is exact by construction,
    which is why the number of points is reported beside it.
    """
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(values, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    x, y = np.log(x[keep]), np.log(y[keep])
    if len(x) < 2 or np.ptp(x) == 0:
        return Growth(float("nan"), float("nan"), int(len(x)))
    slope, intercept = np.polyfit(x, y, 1)
    residual = ((y - (slope * x + intercept)) ** 2).sum()
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1.0 - residual / total if total > 0 else float("nan")
    return Growth(float(slope), float(r2), int(len(x)))


def ratio_frame(frame: Any, reference: str) -> Any:
    """Every successful cell divided by the reference model's cell of the same mode, batch and length."""
    import pandas as pd

    ok = frame[frame["status"] == "ok"]
    keys = ["mode", "batch", "length"]
    ref = ok[ok["label"] == reference][keys + ["peak_mem_mb", "time_ms_median"]]
    merged = ok.merge(ref, on=keys, suffixes=("", "_ref"))
    if merged.empty:
        return pd.DataFrame(columns=[*keys, "label", "memory_ratio", "time_ratio"])
    memory = merged["peak_mem_mb"] / merged["peak_mem_mb_ref"]
    merged["memory_ratio"] = memory.where((merged["peak_mem_mb"] > 0) & (merged["peak_mem_mb_ref"] > 0))
    merged["time_ratio"] = merged["time_ms_median"] / merged["time_ms_median_ref"]
    return merged


def _cell(frame: Any, label: str, mode: str, batch: str, length: int) -> Any:
    rows = frame[(frame["label"] == label) & (frame["mode"] == mode) & (frame["batch"] == batch)
                 & (frame["length"] == length)]
    return rows.iloc[0] if len(rows) else None


def _failures(rows: Any) -> str:
    """'oom at N=8192; N=16384 skipped' for one series."""
    notes, skipped = [], []
    for _, row in rows.sort_values("length").iterrows():
        if row["status"] == "skipped":
            skipped.append(str(row["length"]))
        elif row["status"] != "ok":
            notes.append(f"{row['status']} at N={row['length']}")
    if skipped:
        notes.append(f"N={','.join(skipped)} skipped")
    return "; ".join(notes)


def summarise(frame: Any, study: ScalingStudy) -> Any:
    """One row per series: fitted time and memory exponents, values and ratios at compare_length, failures."""
    import pandas as pd

    rows = []
    for entry in study.models:
        for mode in study.modes:
            for batch in study.batch_keys():
                series = frame[(frame["label"] == entry.label) & (frame["mode"] == mode) & (frame["batch"] == batch)]
                ok = series[(series["status"] == "ok") & (series["length"] >= study.fit_min_length)]
                time_fit = fit_growth(ok["length"], ok["time_ms_median"])
                memory_fit = fit_growth(ok["length"], ok["peak_mem_mb"])
                here = _cell(frame, entry.label, mode, batch, study.compare_length)
                ref = _cell(frame, study.reference, mode, batch, study.compare_length)
                here_ok = here is not None and here["status"] == "ok"
                both_ok = here_ok and ref is not None and ref["status"] == "ok"
                row = {
                    "label": entry.label, "model": entry.model, "mode": mode, "batch": batch,
                    "time_exponent": time_fit.exponent, "time_r2": time_fit.r2, "time_points": time_fit.points,
                    "memory_exponent": memory_fit.exponent, "memory_r2": memory_fit.r2,
                    "memory_points": memory_fit.points,
                    "compare_length": study.compare_length,
                    "time_ms": here["time_ms_median"] if here_ok else float("nan"),
                    "memory_mb": here["peak_mem_mb"] if here_ok else float("nan"),
                    "speedup_vs_reference": ref["time_ms_median"] / here["time_ms_median"] if both_ok else float("nan"),
                    "memory_vs_reference": (here["peak_mem_mb"] / ref["peak_mem_mb"]
                                            if both_ok and ref["peak_mem_mb"] > 0 else float("nan")),
                    "expected_growth": entry.expected_growth or "",
                    "failures": _failures(series),
                }
                rows.append(row)
    return pd.DataFrame(rows)


def _expectation(row: Any) -> str:
    """'met' / 'missed (time 1.31)' against the entry's expected_growth, or '' when none is declared."""
    growth = row["expected_growth"]
    if not growth:
        return ""
    low, high = EXPECTED_GROWTH[growth]
    missed, unknown = [], []
    for metric in ("time", "memory"):
        value = row[f"{metric}_exponent"]
        if not math.isfinite(value):
            unknown.append(metric)
        elif not low <= value <= high:
            missed.append(f"{metric} {value:.2f}")
    bound = f"≤ {high}" if growth == "linear" else f"{low}–{high}"
    if missed:
        return f"{growth} ({bound}): **missed** ({', '.join(missed)})"
    if unknown:
        return f"{growth} ({bound}): not fitted ({', '.join(unknown)})"
    return f"{growth} ({bound}): met"


@dataclass
class ClaimResult:
    claim: Claim
    batch: str
    verdict: str  # met | missed | not tested
    line: str


def _fmt(value: float, unit: str = "") -> str:
    if not math.isfinite(value):
        return "n/a"
    digits = 3 if abs(value) < 10 else (1 if abs(value) < 1000 else 0)
    return f"{value:,.{digits}f}{unit}"


def check_claims(frame: Any, study: ScalingStudy) -> list[ClaimResult]:
    """Each claim against the measured cells: met or missed with the numbers, or why it could not be tested."""
    results = []
    for claim in study.claims:
        column = METRICS[claim.metric]
        unit = " MB" if claim.metric == "memory" else " ms"
        bound = (f"model/reference ≤ {claim.max_ratio:g}×" if claim.max_ratio is not None
                 else f"reference/model ≥ {claim.min_factor:g}×")
        head = f"{claim.paper}: {claim.text}" if claim.paper else claim.text
        batches = [str(claim.batch_size)] if claim.batch_size else study.batch_keys()
        for batch in batches:
            where = f"{claim.mode}, batch {batch}, N = {claim.length}"
            here = _cell(frame, claim.model, claim.mode, batch, claim.length)
            ref = _cell(frame, claim.reference, claim.mode, batch, claim.length)
            problems = [f"{label} {row['status']}" + (f" ({row['error']})" if row["status"] != "skipped" else "")
                        for label, row in ((claim.model, here), (claim.reference, ref))
                        if row is not None and row["status"] != "ok"]
            if here is None or ref is None or problems:
                reason = "; ".join(problems) if problems else \
                    f"N = {claim.length} is not in this grid (lengths {study.lengths[0]}–{study.lengths[-1]})"
                hint = _largest_common(frame, claim, batch)
                results.append(ClaimResult(claim, batch, "not tested",
                                           f"**not tested**: {head} [{where}; needs {bound}]: {reason}.{hint}"))
                continue
            value, reference = float(here[column]), float(ref[column])
            if value <= 0 or reference <= 0:
                results.append(ClaimResult(claim, batch, "not tested",
                                           f"**not tested**: {head} [{where}]: a measured {claim.metric} is not "
                                           f"positive ({claim.model} {_fmt(value, unit)}, {claim.reference} "
                                           f"{_fmt(reference, unit)})."))
                continue
            ratio, factor = value / reference, reference / value
            met = ratio <= claim.max_ratio if claim.max_ratio is not None else factor >= claim.min_factor
            if claim.metric == "memory":
                change = f"{abs(1 - ratio):.0%} {'less' if ratio <= 1 else 'more'} memory"
            else:
                change = f"speed-up {factor:.2f}×"
            measured = (f"{claim.model} {_fmt(value, unit)} vs {claim.reference} {_fmt(reference, unit)}: "
                        f"model/reference {ratio:.3f}×, reference/model {factor:.2f}× ({change})")
            verdict = "met" if met else "missed"
            results.append(ClaimResult(claim, batch, verdict,
                                       f"**{verdict}**: {head} [{where}; needs {bound}]: {measured}."))
    return results


def _largest_common(frame: Any, claim: Claim, batch: str) -> str:
    """For an untestable claim, the same ratio at the largest length where both models ran, for orientation."""
    column = METRICS[claim.metric]
    ok = frame[(frame["status"] == "ok") & (frame["mode"] == claim.mode) & (frame["batch"] == batch)]
    here = ok[ok["label"] == claim.model].set_index("length")[column]
    ref = ok[ok["label"] == claim.reference].set_index("length")[column]
    common = sorted(set(here.index) & set(ref.index))
    if not common or here[common[-1]] <= 0 or ref[common[-1]] <= 0:
        return ""
    n = common[-1]
    return (f" At the largest length both ran (N = {n}): {ref[n] / here[n]:.2f}× "
            f"({here[n] / ref[n]:.3f}× of the reference).")


# ---------------------------------------------------------------------------------------------------------------
# Outputs


def write_plots(frame: Any, study: ScalingStudy, out: Path) -> list[Path]:
    """memory.*, time.* (log-log against N) and memory_ratio.*, time_ratio.* (against the reference)."""
    from study.analysis import plots

    ok = frame[frame["status"] == "ok"].copy()
    if ok.empty:
        return []
    labels = [e.label for e in study.models]
    palette = plots.palette_for(labels)  # a model keeps its colour in every figure, reference left out or not
    facets = {"col": "mode", "col_order": [m for m in study.modes if m in set(ok["mode"])], "palette": palette}
    if len(study.batch_keys()) > 1:
        facets.update(row="batch", row_order=study.batch_keys())
    paths = []
    for column, stem, ylabel in (("peak_mem_mb", "memory", "peak memory (MB)"),
                                 ("time_ms_median", "time", "median time (ms)")):
        data = ok[ok[column] > 0]
        if data.empty:
            continue
        figure = plots.loglog_lines(data, x="length", y=column, hue="label", xlabel="sequence length N",
                                    ylabel=ylabel, hue_order=[x for x in labels if x in set(data["label"])],
                                    title=f"{study.name}: {ylabel} against N", **facets)
        paths += plots.save_figure(figure, out / stem)
    ratios = ratio_frame(frame, study.reference)
    ratios = ratios[ratios["label"] != study.reference]
    for column, stem, ylabel in (("memory_ratio", "memory_ratio", f"peak memory / {study.reference}"),
                                 ("time_ratio", "time_ratio", f"time / {study.reference}")):
        data = ratios[ratios[column].notna() & (ratios[column] > 0)]
        if data.empty:
            continue
        figure = plots.ratio_lines(data, x="length", y=column, hue="label", xlabel="sequence length N",
                                   ylabel=ylabel, hue_order=[x for x in labels if x in set(data["label"])],
                                   title=f"{study.name}: {ylabel} (below 1 = cheaper than the reference)", **facets)
        paths += plots.save_figure(figure, out / stem)
    return paths


def write_markdown(frame: Any, summary: Any, claims: list[ClaimResult], study: ScalingStudy, env: dict[str, Any],
                   sequences: str) -> str:
    """scaling.md: the analogue of ELASTIC's Figure 3 as a table, the claims, the cells and the environment."""
    import models

    n = study.compare_length
    hardware = env.get("hardware", {})
    gpus = hardware.get("gpus") or []
    device = ", ".join(g["name"] for g in gpus) if gpus else f"CPU: {hardware.get('cpu_model', '?')}"
    counts = frame["status"].value_counts().to_dict()
    by_objective: dict[str, list[str]] = {}
    for entry in study.models:
        by_objective.setdefault(entry.train["objective"], []).append(entry.label)
    methods = frame["mem_method"].dropna()
    method = methods.iloc[0].split(", first")[0] if len(methods) else "n/a"
    limit_mb = study.measure["memory_limit_mb"]
    limit = f"{limit_mb:g} MB" if limit_mb else "none"
    run = env.get("scaling_run", {})
    loads = run.get("load_average_1min", {})
    load = ""
    if loads.get("start") is not None:
        load = (f"; load average {loads['start']:g} at the start, {loads['end']:g} at the end (above the core "
                "count, other jobs shared the CPU and the timings are noisy)"
                if max(loads["start"], loads["end"] or 0) > (hardware.get("cpus_usable") or 1)
                else f"; load average {loads['start']:g} at the start, {loads['end']:g} at the end")
    objectives = "; ".join(f"{objective} ({', '.join(labels)})" for objective, labels in by_objective.items()) \
        if len(by_objective) > 1 else next(iter(by_objective), "?")
    lines = [
        f"# Scaling study `{study.name}`",
        "",
        f"Peak memory and latency against sequence length N ∈ {{{', '.join(map(str, study.lengths))}}}, batch "
        f"{', '.join(study.batch_keys())}, modes {', '.join(study.modes)}; {len(frame)} cells "
        f"({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}).",
        "",
        f"- **Sequences**: {sequences}",
        f"- **Catalogue**: {int(frame['num_items'].iloc[0]):,} items (scores and loss run over all of them).",
        f"- **Train** = one step (forward + backward + Adam) with objective {objectives}; **inference** = "
        f"encoder + scores over all items + top-{study.measure['top_k']} for the batch.",
        f"- **Measurement**: each cell a Ray task measuring in a fresh process of its own; peak memory of the "
        f"first run ({method}); {study.measure['warmup']} warm-up run(s) including that one, then "
        f"{study.measure['repeats']} timed (median, p95); memory limit {limit}, timeout "
        f"{study.measure['timeout_s']:g} s per cell.",
        f"- **Device**: {device}; {hardware.get('cpus_usable', '?')} usable cores; threads per cell "
        f"{int(study.resources['cpu'])}, {run.get('cells_at_a_time', '?')} cell(s) at a time{load}; torch "
        f"{env.get('torch', {}).get('version', '?')}, ray {env.get('packages', {}).get('ray', '?')}.",
        "",
        f"## Growth exponents (fit over N ≥ {study.fit_min_length}) and ratios at N = {n} "
        f"(reference: {study.reference})",
        "",
        "Exponent = slope of log(value) against log(N) (1 = linear, 2 = quadratic); R² of that line. Speed-up = "
        "reference time / model time; memory = model memory / reference memory.",
        "",
        f"| model | mode | batch | time exponent | memory exponent | time @{n} | memory @{n} | speed-up vs "
        f"{study.reference} | memory vs {study.reference} | expected | failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, row in summary.iterrows():
        time_fit = Growth(row["time_exponent"], row["time_r2"], row["time_points"])
        memory_fit = Growth(row["memory_exponent"], row["memory_r2"], row["memory_points"])
        speedup = f"{row['speedup_vs_reference']:.2f}×" if math.isfinite(row["speedup_vs_reference"]) else "n/a"
        memory = f"{row['memory_vs_reference']:.3f}×" if math.isfinite(row["memory_vs_reference"]) else "n/a"
        lines.append(f"| {row['label']} | {row['mode']} | {row['batch']} | {time_fit.describe()} | "
                     f"{memory_fit.describe()} | {_fmt(row['time_ms'], ' ms')} | {_fmt(row['memory_mb'], ' MB')} | "
                     f"{speedup} | {memory} | {_expectation(row)} | {row['failures'] or ''} |")
    lines += ["", "## Paper claims", ""]
    if claims:
        lines += [f"- {result.line}" for result in claims]
        lines += ["", "The papers measured GPUs (ELASTIC: unspecified; LISA: V100, attention module only; Cotten4Rec: "
                  "V100, whole training step); these figures are whole models on the device above, so a miss says "
                  "what this configuration does here, not that the paper is wrong."]
    else:
        lines.append("No claims configured.")
    failed = frame[~frame["status"].isin(("ok", "skipped"))]
    if len(failed):
        lines += ["", "## Cells that did not finish", ""]
        lines += [f"- {row['label']} {row['mode']} N={row['length']} batch {row['batch']}: {row['status']}: "
                  f"{row['error']}" for _, row in failed.iterrows()]
    unused = sorted(set(models.available()) - {e.model for e in study.models})
    if unused:
        lines += ["", f"Registered models not in this grid: {', '.join(unused)}."]
    lines += ["", "Files: cells.parquet / cells.csv (every cell), summary.csv (this table), memory.*, time.*, "
              "memory_ratio.*, time_ratio.* (PNG + SVG), environment.json.", ""]
    return "\n".join(lines)


def _rows(study: ScalingStudy, cells: list[Cell], outcomes: list[dict], batches: dict, meta: dict,
          num_items: int, specs: list[dict]) -> Any:
    import pandas as pd

    by_cell = {o["cell"]: o for o in outcomes}
    rows = []
    for cell, spec in zip(cells, specs):
        outcome = by_cell.get(cell.index, {"status": "not run", "error": "the study was interrupted"})
        batch = batches[(cell.length, cell.batch_size)]
        entry = study.entry(cell.label)
        row = {
            "study": study.name, "cell": cell.index, "label": cell.label, "model": cell.model, "mode": cell.mode,
            "length": cell.length, "batch": cell.batch_key, "batch_size": cell.batch_size,
            "tokens": cell.length * cell.batch_size, "num_items": num_items, "objective": entry.train["objective"],
            "status": outcome["status"], "error": outcome.get("error", ""),
            "time_ms_median": outcome.get("time_ms_median", float("nan")),
            "time_ms_p95": outcome.get("time_ms_p95", float("nan")),
            "time_ms_min": outcome.get("time_ms_min", float("nan")), "runs": outcome.get("runs", 0),
            "peak_mem_mb": outcome.get("peak_mem_mb", float("nan")), "mem_method": outcome.get("mem_method"),
            "memory_limit": outcome.get("memory_limit", ""), "params": outcome.get("params", 0),
            "device": spec["device"], "device_name": outcome.get("device_name", ""), "node": outcome.get("node", ""),
            "threads": outcome.get("threads", spec["threads"]), "niceness": outcome.get("niceness"),
            "kernel_path": outcome.get("kernel_path", ""),
            "dataset": meta.get("name", ""), "dataset_hash": meta.get("content_hash", ""),
            "synthetic": bool(meta.get("synthetic", False)), "sequences": batch.description,
            "tiled_rows": batch.tiled_rows, "wall_s": outcome.get("wall_s", float("nan")),
            "config": json.dumps(entry.config, sort_keys=True),
        }
        rows.append(row)
    return pd.DataFrame(rows)


def _sequence_summary(batches: dict[tuple[int, int], RealBatch], meta: dict) -> str:
    lengths = meta.get("length") or {}  # the prepared dataset's sequence-length statistics
    tiled = {key: b.tiled_rows for key, b in batches.items()}
    worst = max(tiled, key=lambda key: (key[0], key[1]))
    name = meta.get("name", "?")
    kind = "synthetic (generated) histories" if meta.get("synthetic") else "real user histories"
    detail = ""
    if isinstance(lengths, dict) and "median" in lengths:
        detail = f" (median history {lengths['median']:g} items)"
    return (f"{kind} from {name}{detail}, {meta.get('num_users', '?'):,} users, {meta.get('num_items', '?'):,} items; "
            f"each row is one user's most recent N + 1 items, tiled (repeated end to end) when the history is "
            f"shorter: at N = {worst[0]}, {tiled[worst]} of {worst[1]} rows are tiled. The same users fill every "
            f"model's batch at a given (N, batch).")


# ---------------------------------------------------------------------------------------------------------------
# The run


def cell_specs(study: ScalingStudy, cells: list[Cell], *, num_items: int, device: str,
               threads: int) -> list[dict[str, Any]]:
    """What each cell's measuring process needs, as plain data (it crosses Ray and a process boundary)."""
    specs = []
    for cell in cells:
        entry = study.entry(cell.label)
        specs.append({
            "cell": cell.index, "series": list(cell.series), "label": cell.label, "model": cell.model,
            "mode": cell.mode, "length": cell.length, "batch_size": cell.batch_size, "config": dict(entry.config),
            "train": dict(entry.train), "num_items": num_items, "device": device, "threads": threads,
            "seed": study.seed, "niceness": os.nice(0), **study.measure,
        })
    return specs


def _start_ray(address: str, num_cpus: int | None, quiet: bool) -> bool:
    """Start (``local``) or join Ray via the shared helper; returns whether this call started it (must shut down)."""
    from study.cluster import start_ray

    return start_ray(address, num_cpus=num_cpus, quiet=quiet)


def _per_cell_resources(study: ScalingStudy, cluster: dict[str, float]) -> tuple[float, float, int]:
    cpu = float(study.resources["cpu"])
    gpu = study.resources["gpu"]
    cluster_gpus = float(cluster.get("GPU", 0))
    if gpu == "auto":
        gpu = 1.0 if cluster_gpus >= 1 else 0.0
    elif gpu > cluster_gpus:
        raise UserError(f"resources.gpu={gpu:g} per cell, but the Ray cluster has {cluster_gpus:g} GPU(s)")
    fits = [int(float(cluster.get("CPU", 1)) // cpu)]
    if gpu > 0:
        fits.append(int(cluster_gpus // gpu))
    concurrent = study.resources["max_concurrent"]
    limit = max(1, min(fits))
    return cpu, gpu, limit if concurrent == "auto" else min(int(concurrent), limit)


def run_study(study: ScalingStudy, *, address: str = "local", num_cpus: int | None = None, progress: bool = True,
              quiet: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Prepare the data, run every cell on Ray, write ``results/<study>/``; returns paths and a summary."""
    from study.data import load_prepared, prepare
    from study.environment import collect

    out = study.storage
    mirror = Mirror(out, study.storage_uri)
    for place, holds in ((out, (out / "cells.parquet").exists()), (mirror.uri, mirror.holds("cells.parquet"))):
        if holds and not overwrite:
            raise UserError(f"{place} already holds a scaling study; pass --overwrite to replace it, or choose "
                            "another name or storage")
    dataset = study.dataset
    path = prepare(dataset["name"], source=dataset["source"], kcore=dataset["kcore"], progress=progress,
                   **dataset["options"])
    data = load_prepared(path)
    check_data(study, int(np.count_nonzero(np.diff(data.history_indptr))), data.num_items)
    num_items = study.num_items or data.num_items
    cells = study.cells()
    batches = {(c.length, c.batch_size): None for c in cells}
    for length, batch_size in batches:
        batches[(length, batch_size)] = real_batch(data.history_indptr, data.history_indices, length, batch_size,
                                                   seed=study.seed, dataset_name=data.meta.get("name", "dataset"))
    started_ray = _start_ray(address, num_cpus, quiet)
    import ray

    try:
        cpu, gpu, concurrent = _per_cell_resources(study, ray.cluster_resources())
        out.mkdir(parents=True, exist_ok=True)
        env = collect(ray.cluster_resources())
        (out / "environment.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
        (out / "study.yaml").write_text(study.to_yaml())
        specs = cell_specs(study, cells, num_items=num_items, device="cuda" if gpu > 0 else "cpu",
                           threads=max(1, int(cpu)))
        refs = {key: ray.put(batch.windows) for key, batch in batches.items()}
        log = (out / "cells.jsonl").open("w")

        def on_row(spec: dict[str, Any], outcome: dict[str, Any]) -> None:
            # one line per finished cell, so an interrupted study still leaves its measurements behind
            log.write(json.dumps({**{k: spec[k] for k in ("label", "mode", "length", "batch_size")}, **outcome},
                                 default=str) + "\n")
            log.flush()
            mirror.push()  # throttled

        # the machine's load says how far CPU timings can be trusted (other jobs share the cores)
        load_start, cells_started = _load_average(), time.monotonic()
        try:
            outcomes = execute(specs, refs, cpu=cpu, gpu=gpu, max_concurrent=concurrent,
                               stop_after_failure=study.stop_after_failure, progress=progress, on_row=on_row)
        finally:
            log.close()
        env["scaling_run"] = {"cells_wall_s": round(time.monotonic() - cells_started, 1),
                              "load_average_1min": {"start": load_start, "end": _load_average()},
                              "cells_at_a_time": concurrent, "cpu_per_cell": cpu, "gpu_per_cell": gpu}
        (out / "environment.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
    finally:
        if started_ray:
            ray.shutdown()
    frame = _rows(study, cells, outcomes, batches, data.meta, num_items, specs)
    outputs = write_outputs(frame, study, env, _sequence_summary(batches, data.meta))
    mirror.push(force=True)
    if mirror.uri:
        outputs["text"] += f"\nmirrored to {mirror.uri}"
    return outputs


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def write_outputs(frame: Any, study: ScalingStudy, env: dict[str, Any], sequences: str) -> dict[str, Any]:
    """Parquet + CSV of the cells, the summary, the plots and scaling.md in ``study.storage``."""
    out = study.storage
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / "cells.parquet", index=False)
    frame.to_csv(out / "cells.csv", index=False)
    summary = summarise(frame, study)
    summary.to_csv(out / "summary.csv", index=False)
    claims = check_claims(frame, study)
    plots = write_plots(frame, study, out)
    markdown = write_markdown(frame, summary, claims, study, env, sequences)
    (out / "scaling.md").write_text(markdown)
    counts = frame["status"].value_counts().to_dict()
    lines = [f"scaling study {study.name}: {len(frame)} cells ("
             + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f"); results in {out}"]
    lines += [f"  {r.verdict}: {r.claim.paper} {r.claim.text} (batch {r.batch})" for r in claims]
    return {"out": out, "frame": frame, "summary": summary, "claims": claims, "plots": plots,
            "markdown": out / "scaling.md", "text": "\n".join(lines)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m study.scaling",
        description="Measure peak memory and latency against sequence length for every model of a YAML grid, one "
                    "isolated Ray task per cell; write parquet/CSV, log-log plots and scaling.md with growth "
                    "exponents, ratios and paper claims.",
        epilog=SCHEMA_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="the scaling YAML (see search_spaces/scaling.yaml and docs/scaling.md)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="override a field by its dotted path, e.g. --set lengths=[64,128] "
                             "--set measure.repeats=1 --set dataset.source=../data/ml-100k.zip")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate every cell, print the resolved study and the number of cells, and exit "
                             "without starting Ray")
    parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in the "
                                                                   "same storage folder")
    from study.cluster import add_address_argument

    add_address_argument(parser)
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs the local Ray may use (default: all)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--quiet", action="store_true", help="no worker output")
    return parser


def main(argv: list[str] | None = None) -> int:
    from models import ConfigError

    args = build_parser().parse_args(argv)
    try:
        study = load_scaling_study(args.study, args.overrides, check_machine=args.address == "local")
        if args.dry_run:
            mirrored = f", mirrored to {study.storage_uri}" if study.storage_uri else ""
            print(study.to_yaml(), end="")
            print(f"# valid: {len(study.cells())} cells ({len(study.models)} models × {len(study.lengths)} lengths × "
                  f"{len(study.batch_keys())} batch setting(s) × {len(study.modes)} mode(s)); results would go to "
                  f"{study.storage}{mirrored}", file=sys.stderr)
            return 0
        outcome = run_study(study, address=args.address, num_cpus=args.num_cpus,
                            progress=not args.no_progress and sys.stderr.isatty(), quiet=args.quiet,
                            overwrite=args.overwrite)
    except (UserError, ConfigError) as error:  # StudyConfigError too: one line per problem
        return print_error(error)
    except KeyboardInterrupt:
        print("interrupted; the cells measured so far are in cells.jsonl of the results folder", file=sys.stderr)
        return 130
    print(outcome["text"])
    return 0
