"""The scaling-study file (schema: ``docs/scaling.md``): the resolved grid of models × lengths × batches × modes.

:func:`load_scaling_study` applies ``--set`` overrides and checks every section and every cell before anything runs,
reporting every problem at once as ``file:line: dotted.key: message``; :mod:`study.scaling` runs the study.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from study.analysis.claims import Claim
from study.errors import UserError
from study.spec import yaml_io
from study.spec.yaml_io import NAME_PATTERN, ConfigErrors, StudyConfigError, check_keys, read_section
from study.storage import resolve_storage
from study.train.settings import STEP_COST, keys_with

# torch and the model zoo are imported inside the functions that need them: ``--dry-run`` and every scaling
# module import this one, and torch alone takes seconds to load.

MODES = ("train", "inference")
METRICS = {"memory": "peak_mem_mb", "time": "time_ms_median"}
# The trainer keys that change what one training step costs; the rest (epochs, evaluation, patience ...) mean
# nothing for a single step, and device/threads are set by the study from resources.
TRAIN_KEYS = keys_with(STEP_COST)
STUDY_SET_KEYS = ("num_items", "max_len")  # every cell sets these itself
TOP_LEVEL = ("name", "dataset", "num_items", "models", "train", "lengths", "batch_sizes", "tokens_per_batch",
             "modes", "measure", "fit", "compare_length", "reference", "claims", "resources", "stop_after_failure",
             "seed", "storage")
ENTRY_KEYS = ("label", "model", "config", "train", "expected_growth")
MEASURE_DEFAULTS = {"warmup": 1, "repeats": 3, "timeout_s": 300.0, "memory_limit_mb": None, "top_k": 20,
                    "prewarm": True}
CLAIM_KEYS = ("paper", "text", "model", "reference", "mode", "metric", "length", "max_ratio", "min_factor",
              "batch_size")
# What "grows linearly" and "grows quadratically" mean for a fitted log-log slope (see docs/scaling.md).
EXPECTED_GROWTH = {"linear": (0.0, 1.15), "quadratic": (1.7, 2.3)}
DEFAULT_OBJECTIVE = "last"  # see docs/scaling.md: the papers' RecBole baselines, and no O(N·items) loss term

@dataclass
class ModelEntry:
    """One line of the plots: a registered model with its config and the training settings of its steps."""

    label: str
    model: str
    config: dict[str, Any]  # typed model hyperparameters (num_items and max_len are set per cell)
    train: dict[str, Any]  # TRAIN_KEYS, typed, objective resolved for this model
    expected_growth: str | None = None


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
        return [f"{self.tokens_per_batch} tokens"] if self.tokens_per_batch else [str(b) for b in self.batch_sizes]

    def batch_size(self, batch_key: str, length: int) -> int:
        return self.tokens_per_batch // length if self.tokens_per_batch else int(batch_key)

    def entry(self, label: str) -> ModelEntry:
        return next(e for e in self.models if e.label == label)

    def cells(self) -> list[Cell]:
        """Every cell, grouped by series (label, mode, batch) and in increasing length within a series."""
        grid = itertools.product(self.models, self.modes, self.batch_keys(), self.lengths)
        return [Cell(index, entry.label, entry.model, mode, length, self.batch_size(batch_key, length), batch_key)
                for index, (entry, mode, batch_key, length) in enumerate(grid)]

    def to_dict(self) -> dict[str, Any]:
        """The resolved study as plain YAML data (defaults filled in, overrides applied)."""
        batches = ({"tokens_per_batch": self.tokens_per_batch} if self.tokens_per_batch
                   else {"batch_sizes": list(self.batch_sizes)})
        return {
            "name": self.name, "dataset": dict(self.dataset), "num_items": self.num_items,
            "models": [{"label": e.label, "model": e.model, "config": dict(e.config), "train": dict(e.train),
                        "expected_growth": e.expected_growth} for e in self.models],
            "lengths": list(self.lengths), **batches,
            "modes": list(self.modes), "measure": dict(self.measure), "fit": {"min_length": self.fit_min_length},
            "compare_length": self.compare_length, "reference": self.reference,
            "claims": [claim_dict(c) for c in self.claims],
            "resources": dict(self.resources), "stop_after_failure": self.stop_after_failure, "seed": self.seed,
            "storage": self.storage_uri or str(self.storage),
        }

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


# Reading and validation: every problem at once, each as "file:line: dotted.key: message"


def _entry_section(item: dict, key: str, path: tuple, errors: ConfigErrors, allowed: tuple[str, ...]) -> dict:
    """A model entry's ``config:`` or ``train:`` mapping, unknown keys reported. Not read_section + check_keys:
    those name a top-level section (``train.lr``), and these errors name the entry (``models[2].train.lr``)."""
    value = item.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.add(path + (key,), f"must be a mapping, got {type(value).__name__} {value!r}")
        return {}
    for unknown in value:
        if unknown not in allowed:
            errors.add(path + (key, unknown), f"unknown key; {key} takes {', '.join(allowed)}")
    return value


# Not the toolkit's typed(): it names its errors section.key only and checks no bound, while these name any path
# (lengths[0], claims[1].length, measure.timeout_s) with the bound in the message. Integers must also be written as
# integers here (typed() would take the string "64"), as this file has always required.
def _integer(value: Any, path: tuple, errors: ConfigErrors, minimum: int | None = None) -> int | None:
    if not yaml_io.is_number(value) or not float(value).is_integer():
        errors.add(path, f"expected an integer, got {type(value).__name__} {value!r}")
        return None
    if minimum is not None and value < minimum:
        errors.add(path, f"must be >= {minimum}, got {value}")
        return None
    return int(value)


def _number(value: Any, path: tuple, errors: ConfigErrors, positive: bool = True) -> float | None:
    number = yaml_io.yaml_number(value)  # also a string: PyYAML reads 1e-3 (no dot) as one
    if number is None or not math.isfinite(number):
        errors.add(path, f"expected a number, got {type(value).__name__} {value!r}")
        return None
    if positive and number <= 0:
        errors.add(path, f"must be > 0, got {number}")
        return None
    return float(number)


def _distinct_list(data: dict, key: str, errors: ConfigErrors, what: str, item: Any, default: Any = None) -> list:
    """``data[key]`` as a non-empty list of distinct items; ``item(value, path)`` types one or returns None."""
    raw = data.get(key, default)
    if not isinstance(raw, list) or not raw:
        errors.add((key,), f"must be a non-empty list of {what}, got {raw!r}")
        return []
    values = []
    for index, value in enumerate(raw):
        value = item(value, (key, index))
        if value in values:
            errors.add((key, index), f"{value} is listed twice")
        elif value is not None:
            values.append(value)
    return values


def _int_list(data: dict, key: str, errors: ConfigErrors, minimum: int) -> list[int]:
    return _distinct_list(data, key, errors, "integers", lambda value, path: _integer(value, path, errors, minimum))


def load_scaling_study(path: str | Path, assignments: list[str] | None = None, *,
                       check_machine: bool = True) -> ScalingStudy:
    """Read, override and validate a scaling YAML; raises :class:`StudyConfigError` listing every problem."""
    path = Path(path)
    data, lines = yaml_io.read_yaml(path)
    overridden = yaml_io.apply_overrides(data, assignments or [])
    return resolve(data, source=path, lines=lines, overridden=overridden, check_machine=check_machine)


def resolve(data: dict[str, Any], *, source: Path | None = None, lines: dict[tuple, int] | None = None,
            overridden: set[tuple] | None = None, check_machine: bool = True) -> ScalingStudy:
    """Check every section and every cell against its model's constraints; all errors at once."""
    from study.spec.fields import read_resources, resolve_dataset

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

    fit = read_section(data, "fit", errors)
    check_keys(fit, "fit", ("min_length",), errors)
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
    resources = read_resources(data, errors, check_machine=check_machine, unit="cell", gpu_auto=True,
                               data_parallel=False).to_dict()
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
    def mode(value: Any, path: tuple) -> str | None:
        if value in MODES:
            return value
        errors.add(path, f"unknown mode {value!r}; modes: {', '.join(MODES)}")
        return None

    return _distinct_list(data, "modes", errors, ", ".join(MODES), mode, default=list(MODES))


def _resolve_measure(data: dict, errors: ConfigErrors) -> dict[str, Any]:
    raw = read_section(data, "measure", errors)
    check_keys(raw, "measure", MEASURE_DEFAULTS, errors)
    measure = dict(MEASURE_DEFAULTS)
    for key in ("warmup", "repeats", "top_k"):
        if key in raw:
            measure[key] = _integer(raw[key], ("measure", key), errors, 1) or MEASURE_DEFAULTS[key]
    if "timeout_s" in raw:
        measure["timeout_s"] = _number(raw["timeout_s"], ("measure", "timeout_s"), errors) or measure["timeout_s"]
    if raw.get("memory_limit_mb") is not None:
        measure["memory_limit_mb"] = _number(raw["memory_limit_mb"], ("measure", "memory_limit_mb"), errors)
    if "prewarm" in raw:
        if isinstance(raw["prewarm"], bool):
            measure["prewarm"] = raw["prewarm"]
        else:
            errors.add(("measure", "prewarm"), f"expected true or false, got {raw['prewarm']!r}")
    return measure


def _resolve_models(data: dict, errors: ConfigErrors, lengths: list[int], num_items: int | None) -> list[ModelEntry]:
    import models

    shared_train = read_section(data, "train", errors)
    check_keys(shared_train, "train", TRAIN_KEYS, errors)
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
        backend = (item.get("config") if isinstance(item.get("config"), dict) else {}).get("attention_backend")
        label = item.get("label", f"{name}-{backend}" if backend else str(name))
        if not isinstance(label, str) or not NAME_PATTERN.match(label):
            errors.add(path + ("label",), f"expected a name (letters, digits, '.', '_', '-'), got {label!r}")
            continue
        if label in seen:
            errors.add(path + ("label",), f"{label!r} is also the label of models[{seen[label]}]; give each entry "
                                          "its own label")
            continue
        seen[label] = index
        config = _entry_section(item, "config", path, errors, tuple(models.config_fields(name)))
        for key in STUDY_SET_KEYS:
            if key in config:
                source_of = "lengths:" if key == "max_len" else "num_items: or the dataset"
                errors.add(path + ("config", key), f"set by the study for every cell (from {source_of}); remove it")
        own_train = _entry_section(item, "train", path, errors, TRAIN_KEYS)
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
        homes = ((config, path + ("config", key)), (own_train, path + ("train", key)), (shared_train, ("train", key)))
        return next((where for section, where in homes if key in section), path)

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
        choices = (("model", labels, "{!r} is not a model label; labels: " + ", ".join(labels)),
                   ("reference", labels, "{!r} is not a model label; labels: " + ", ".join(labels)),
                   ("mode", modes, "{!r} is not a mode of this study (" + ", ".join(modes) + ")"),
                   ("metric", METRICS, "must be one of " + ", ".join(METRICS) + ", got {!r}"))
        ok = True
        for key, allowed, message in choices:
            if item.get(key) not in allowed:
                errors.add(path + (key,), message.format(item.get(key)))
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
        # max_ratio: model / reference <= bound; min_factor: reference / model >= bound (Claim.holds)
        claims.append(Claim(text=str(item.get("text", "")), source=str(item.get("paper", "")),
                            candidate=item["model"], kind=bounds[0], reference=item["reference"], bound=bound,
                            metrics=(item["metric"],),
                            cell=(("mode", item["mode"]), ("length", length), ("batch_size", batch))))
    return claims


def claim_dict(claim: Claim) -> dict[str, Any]:
    """A scaling claim as its study file states it (the keys of :data:`CLAIM_KEYS`; no batch_size: every batch)."""
    where = claim.where
    data = {"paper": claim.source, "text": claim.text, "model": claim.candidate, "reference": claim.reference,
            "mode": where["mode"], "metric": claim.metrics[0], "length": where["length"], claim.kind: claim.bound}
    return data | ({"batch_size": where["batch_size"]} if where.get("batch_size") is not None else {})
