"""The sweep YAML: schema, ``--set`` overrides, and validation before Ray starts.

Data flow: :func:`load_study` reads the YAML (keeping each key's line number), applies ``--set`` overrides,
then :func:`resolve` checks every section and returns a :class:`Study`, or raises :class:`StudyConfigError`
listing every problem at once, each naming its key (``file:line: section.key: message``).

Typed sections (``dataset``, ``budget``, ``scheduler``, ``resources``, ``searcher``) are read by
:mod:`study.spec.fields`, the ``search:`` distributions by :mod:`study.spec.search_space`, and the checks across
sections (every search point, settings that only make sense together) live in :mod:`study.spec.checks`; this
module holds the :class:`Study` and the keys each section may name. A budget shorter than the schedule or the
sampler needs is adapted to rather than refused (:attr:`Study.adaptation` says how).

The schema is documented in ``docs/sweep.md`` and summarised in ``SCHEMA_HELP``,
which ``python -m study.sweep --help`` prints. Hyperparameter names in ``protocol``, ``fixed`` and ``search``
are exactly the keys of :class:`study.train.config.TrainConfig` and of the model's config, so ``--set`` on
``python -m study.train`` and the YAML agree; :func:`study.train.config.split_settings` and
``models.make_config`` decide what is valid, so the sweep never duplicates a model's constraints.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import models
from models import ConfigError
from study.errors import UserError
from study.schema import renamed_hint
from study.spec.checks import check_combinations, check_energy
from study.spec.fields import (
    VALID_METRICS,
    Budget,
    read_budget,
    read_checkpoints,
    read_resources,
    read_scheduler,
    read_searcher,
    read_tracking,
    resolve_dataset,
)
from study.spec.resolved import Study
from study.spec.search_space import SearchParam, read_search_param
from study.spec.yaml_io import (
    NAME_PATTERN,
    ConfigErrors,
    StudyConfigError,
    apply_overrides,
    check_keys,
    read_section,
    read_yaml,
    typed,
)
from study.storage import resolve_storage
from study.train.config import METRIC_KS, TRAIN_FIELDS, TrainConfig, coerce, field_type
from study.train.results import EFFICIENCY_METRICS, PROTOCOL_SETTINGS
from study.train.settings import EXECUTION, keys_with

SECTIONS = ("name", "model", "dataset", "protocol", "fixed", "search", "objectives", "budget", "scheduler",
            "resources", "checkpoint", "tracking", "sampler", "searcher", "seeds", "storage")
REQUIRED = ("name", "model")
EXECUTION_KEYS = keys_with(EXECUTION)  # set by the sweep from the resources, never searched
SAMPLERS = ("auto", "tpe", "nsga2", "random", "grid")
DATA_SIZED = {"num_items", "num_users"}  # model sizes the trainer takes from the dataset, never set by hand

# Settings that one study may give in two places; a --set of either wins over the file.
ALIASES = {("budget", "max_epochs"): ("fixed", "max_epochs"), ("seeds", "train"): ("fixed", "seed")}

SCHEMA_HELP = """\
study YAML (docs/sweep.md has the full reference):
  name: my-study                    # results go to results/<name>/ unless storage: is set
  model: sasrec                     # a registered model
  dataset: {name: ml-100k, source: null, kcore: null, options: {}, stream: false}   # a data recipe
  protocol: {objective: auto, eval_mode: full}                       # fixed for the whole study
  fixed: {max_len: 50, batch_size: 128}                              # trainer/model keys
  search:                           # one distribution per key
    lr: {loguniform: [1.0e-4, 1.0e-2]}
    hidden_size: {choice: [32, 64]}
    num_layers: {int: [1, 3]}       # inclusive; optional step:, log:
    dropout: {uniform: [0.1, 0.5]}
    num_heads: {grid: [1, 2]}       # grid: every value, exhaustively (no other distribution then)
  objectives: {valid_ndcg@10: max, peak_mem_mb: min}
  budget: {num_samples: 6, max_epochs: 8, time_budget_s: 0}          # time budget of the whole study
  scheduler: {type: asha, metric: valid_ndcg@10, mode: max, grace_period: 2, reduction_factor: 2}
  resources: {cpu: 1, gpu: 0, workers_per_trial: 1, max_concurrent: auto}
  checkpoint: {every: auto, keep: 2, max_failures: auto}   # epochs between trial checkpoints (0 = none); auto =
                                    #   every epoch and 3 retries with --address, none locally; retries resume
  tracking: {mlflow: {tracking_uri: null, experiment: NAME}, wandb: {project: NAME}}   # optional trackers
  sampler: auto                     # auto | tpe | nsga2 | random | grid
  searcher: {n_startup_trials: 8}   # TPE: random start-up (default: covers every choice value; <= num_samples),
                                    #   multivariate, n_ei_candidates; NSGA-II: population_size
  seeds: {sampler: 0, train: 0}
  storage: null                     # default results/<name>/; a URI (s3://bucket/prefix, gs://…) is mirrored
override any field with --set section.key=value (dotted; values are YAML: --set search.lr={choice: [0.001]})
a shortened budget is never refused: --set budget.max_epochs=1 turns ASHA off, =2 lowers its grace period
(one line says what changed; study.yaml records it)"""


def load_study(path: str | Path, assignments: list[str] | None = None, *, check_machine: bool = True) -> Study:
    """Read, override and validate a study file; raises :class:`StudyConfigError` listing every problem."""
    path = Path(path)
    data, lines = read_yaml(path)
    overridden = apply_overrides(data, assignments or [])
    return resolve(data, source=path, lines=lines, overridden=overridden, check_machine=check_machine)


# ---------------------------------------------------------------------------------------------------------------
# Validation


def _key_type(model: str, key: str) -> type:
    if key in TRAIN_FIELDS:
        return field_type(TRAIN_FIELDS[key], TrainConfig)
    fields = models.config_fields(model)
    return field_type(fields[key], models.model_class(model).config_class)


def _known_keys(model: str) -> set[str]:
    return (set(TRAIN_FIELDS) | set(models.config_fields(model))) - DATA_SIZED


def _resolve_objectives(data: dict, errors: ConfigErrors) -> dict[str, str]:
    section = data.get("objectives")
    if section is None:
        return {"valid_ndcg@10": "max"}
    if isinstance(section, list):  # [{valid_ndcg@10: max}, {peak_mem_mb: min}] reads naturally too
        merged = {}
        for item in section:
            if isinstance(item, dict):
                merged.update(item)
            else:
                errors.add(("objectives",), f"expected metric: max|min entries, got {item!r}")
        section = merged
    if not isinstance(section, dict) or not section:
        errors.add(("objectives",), f"expected a mapping such as {{valid_ndcg@10: max}}, got {section!r}")
        return {"valid_ndcg@10": "max"}
    objectives = {}
    for metric, mode in section.items():
        metric = str(metric)
        if metric.startswith("test_"):
            errors.add(("objectives", metric), "test metrics are recorded for the best-validation epoch but never "
                                               "used for selection; optimise the valid_ metric instead")
        elif metric not in VALID_METRICS + EFFICIENCY_METRICS:
            ks = ",".join(map(str, METRIC_KS))
            errors.add(("objectives", metric), f"unknown objective; use valid_{{hr,ndcg,mrr}}@{{{ks}}} "
                                               f"or one of {', '.join(EFFICIENCY_METRICS)}")
        if mode not in ("max", "min"):
            errors.add(("objectives", metric), f"mode must be max or min, got {mode!r}")
        objectives[metric] = mode
    return objectives


def resolve(data: dict[str, Any], *, source: Path | None = None, lines: dict[tuple, int] | None = None,
            overridden: set[tuple] | None = None, check_machine: bool = True) -> Study:
    """Validate every section of a parsed study; report all problems together, each naming its key.

    Each phase below reads one part of the study and adds its problems to ``errors`` instead of raising, so that one
    run reports them all; a phase whose input was bad goes on with a default, so the later phases still check.
    """
    errors = ConfigErrors(source, lines or {}, overridden or set())
    overridden = overridden or set()
    _check_sections(data, errors)
    name, model = _read_name_and_model(data, errors)
    dataset = resolve_dataset(data, errors, source, streamable=True)
    protocol, fixed, search_spec, budget_in, seeds_in = [
        read_section(data, section, errors) for section in ("protocol", "fixed", "search", "budget", "seeds")]
    _merge_aliases(fixed, {"budget": budget_in, "seeds": seeds_in}, overridden, errors)
    protocol, fixed = _read_settings(model, protocol, fixed, errors)
    search = _read_search(model, search_spec, fixed, errors)
    kinds = {p.kind for p in search.values()}
    objectives = _resolve_objectives(data, errors)

    grid_size = math.prod(len(p.values) for p in search.values()) if kinds == {"grid"} else 0
    notes: list[str] = []  # what a shortened budget changed, printed as one line (see Study.adaptation)
    budget = read_budget(budget_in, errors, default_epochs=TrainConfig.max_epochs, grid_size=grid_size, notes=notes)
    seeds = _read_seeds(seeds_in, search, errors)
    scheduler = read_scheduler(data, objectives, errors)
    if scheduler is not None:
        scheduler, note = scheduler.fit(budget)
        notes += [note] if note else []
    resources = read_resources(data, errors, check_machine=check_machine)
    sampler = _read_sampler(data, kinds, errors)
    searcher = read_searcher(data, errors, sampler=_sampler_kind(sampler, kinds),
                             choice_counts=[len(p.values) for p in search.values() if p.kind == "choice"],
                             num_samples=budget.num_samples, notes=notes)
    _fit_trial_time_budget(fixed, budget, notes)
    storage, storage_uri = _read_storage(data, name, errors)

    study = Study(name=str(name), model=str(model), dataset=dataset, protocol=protocol, fixed=fixed, search=search,
                  objectives=objectives, budget=budget, scheduler=scheduler, resources=resources, sampler=sampler,
                  searcher=searcher, seeds=seeds, storage=storage, storage_uri=storage_uri, source=source,
                  adaptation="; ".join(notes), checkpoint=read_checkpoints(data, errors),
                  tracking=read_tracking(data, errors, study_name=str(name)))
    if model is not None:  # the checks across sections need the model's keys
        check_combinations(study, errors)
    check_energy(study, errors, check_machine=check_machine)
    if errors.items:
        raise StudyConfigError(errors.items)
    return study


def _check_sections(data: dict[str, Any], errors: ConfigErrors) -> None:
    """Every top-level key is a known section and the required ones are there: a misspelt section would otherwise
    be ignored and the study run with its defaults."""
    for key in data:
        if key not in SECTIONS:
            errors.add((key,), f"unknown section; a study has {', '.join(SECTIONS)}")
    for key in REQUIRED:
        if data.get(key) is None:
            errors.add((key,), "required")


def _read_name_and_model(data: dict[str, Any], errors: ConfigErrors) -> tuple[Any, str | None]:
    """The study's name (a folder name: results go under it) and its model; an unknown model is ``None``, which
    tells the later phases to skip the checks that need the model's keys."""
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not NAME_PATTERN.match(name)):
        errors.add(("name",), f"must be a folder-safe name (letters, digits, . _ -), got {name!r}")
    model = data.get("model")
    if model is not None and model not in models.available():
        errors.add(("model",), f"unknown model {model!r}; known: {', '.join(models.available())}")
        model = None
    return name, model


def _merge_aliases(fixed: dict[str, Any], homes: dict[str, dict[str, Any]], overridden: set[tuple],
                   errors: ConfigErrors) -> None:
    """Settings given in two places (budget.max_epochs / fixed.max_epochs, seeds.train / fixed.seed) moved to
    one home, ``homes[section]``, in place. A ``--set`` of either wins over the file; both in the file is an
    error. Errors about the moved value still name the line the user wrote (``errors.alias``)."""
    for (section_a, key_a), (section_b, key_b) in ALIASES.items():
        a_in = homes[section_a]
        if key_a in a_in and key_b in fixed:
            a_set, b_set = (section_a, key_a) in overridden, (section_b, key_b) in overridden
            if a_set and not b_set:  # the command line wins over the file
                fixed.pop(key_b)
            elif b_set and not a_set:
                a_in.pop(key_a)
            else:
                errors.add((section_b, key_b), f"given twice: also {section_a}.{key_a}; keep one")
                fixed.pop(key_b)
        if key_b in fixed:  # one setting, one home: errors about it still name the line the user wrote
            a_in[key_a] = fixed.pop(key_b)
            errors.alias[(section_a, key_a)] = (section_b, key_b)


def _read_settings(model: str | None, protocol: dict[str, Any], fixed: dict[str, Any],
                   errors: ConfigErrors) -> tuple[dict[str, Any], dict[str, Any]]:
    """``protocol`` and ``fixed`` checked against the protocol keys and the model's keys, and their values typed.

    Only the valid keys are kept. Without a known model only ``protocol`` can be filtered, and nothing is typed.
    """
    if model is not None:
        known = _known_keys(model)
        for key in protocol:
            if key not in PROTOCOL_SETTINGS:
                errors.add(("protocol", key), f"not a protocol key; protocol takes {', '.join(PROTOCOL_SETTINGS)}"
                           + (" (a trainer or model key goes under fixed:)" if key in known else ""))
        for key in fixed:
            if key in PROTOCOL_SETTINGS:
                errors.add(("fixed", key), "a protocol key; put it under protocol:")
            elif key not in known:
                errors.add(("fixed", key), f"unknown key for model {model}{renamed_hint(key)}; known keys: "
                                           f"{', '.join(sorted(known))}")
    protocol = {k: v for k, v in protocol.items() if k in PROTOCOL_SETTINGS}
    if model is not None:
        fixed = {k: v for k, v in fixed.items() if k in _known_keys(model) and k not in PROTOCOL_SETTINGS}
        # Type every given value now: a bad one is reported here and left out, so that the combination check
        # below still runs (with the default in its place) and reports its own problems in the same go.
        for section_name, section in (("protocol", protocol), ("fixed", fixed)):
            for key in list(section):
                try:
                    section[key] = coerce(key, section[key], _key_type(model, key))
                except ConfigError as error:
                    errors.add((section_name, key), error.errors[0][1])
                    del section[key]
    return protocol, fixed


def _read_search(model: str | None, search_spec: dict[str, Any], fixed: dict[str, Any],
                 errors: ConfigErrors) -> dict[str, SearchParam]:
    """The ``search:`` distributions, one per searchable key. Protocol keys, execution settings, the epoch budget
    and fixed keys are refused, each with the reason; grid keys cannot be mixed with sampled ones."""
    search: dict[str, SearchParam] = {}
    if model is not None:
        known = _known_keys(model)
        for key, spec in search_spec.items():
            if key in PROTOCOL_SETTINGS:
                errors.add(("search", key), "protocol keys cannot be searched: metrics under different protocols "
                                            "are not comparable; run one study per protocol")
            elif key in EXECUTION_KEYS:
                errors.add(("search", key), "an execution setting, not a hyperparameter; set it under fixed:")
            elif key == "max_epochs":
                errors.add(("search", key), "the epoch budget is budget.max_epochs (ASHA stops weak trials early)")
            elif key not in known:
                errors.add(("search", key), f"unknown key for model {model}{renamed_hint(key)}; known keys: "
                                            f"{', '.join(sorted(known))}")
            elif key in fixed:
                errors.add(("search", key), "also set under fixed:; keep one")
            else:
                param = read_search_param(key, spec, _key_type(model, key), errors)
                if param is not None:
                    search[key] = param
    if not search_spec:
        errors.add(("search",), "empty; a sweep needs at least one searched key (python -m study.train runs one "
                                "configuration)")
    kinds = {p.kind for p in search.values()}
    if "grid" in kinds and kinds != {"grid"}:
        mixed = sorted(k for k, p in search.items() if p.kind != "grid")
        errors.add(("search",), f"grid cannot be combined with sampled keys ({', '.join(mixed)}): a grid is "
                                "enumerated exhaustively, the others are drawn by TPE; use choice instead of grid")
    return search


def _read_seeds(seeds_in: dict[str, Any], search: dict[str, SearchParam], errors: ConfigErrors) -> dict[str, int]:
    """The sampler's and the trainer's seeds; a fixed training seed contradicts a searched ``seed``."""
    check_keys(seeds_in, "seeds", ("sampler", "train"), errors)
    seeds = {"sampler": typed(seeds_in, "seeds", "sampler", int, errors, 0),
             "train": typed(seeds_in, "seeds", "train", int, errors, TrainConfig.seed)}
    if "train" in seeds_in and "seed" in search:
        errors.add(("seeds", "train"), "seed is searched; drop seeds.train")
    return seeds


def _read_sampler(data: dict[str, Any], kinds: set[str], errors: ConfigErrors) -> str:
    """The sampler, which must fit the search: a grid is enumerated by the grid sampler, and only a grid can be."""
    sampler = data.get("sampler", "auto") or "auto"
    if sampler not in SAMPLERS:
        errors.add(("sampler",), f"must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        sampler = "auto"
    if sampler == "grid" and kinds != {"grid"}:
        errors.add(("sampler",), "sampler grid needs every searched key to be a grid: distribution")
    if kinds == {"grid"} and sampler not in ("auto", "grid"):
        errors.add(("sampler",), f"a grid search is enumerated by the grid sampler, not {sampler}")
    return sampler


def _read_storage(data: dict[str, Any], name: Any, errors: ConfigErrors) -> tuple[Path, str | None]:
    """Where the study's results go; a bad ``storage:`` is reported and the default folder stands in, so that the
    :class:`Study` can still be built for the checks across sections."""
    try:
        return resolve_storage(data.get("storage"), str(name or "study"))
    except UserError as error:
        errors.add(("storage",), str(error))
        return resolve_storage(None, str(name or "study"))


def _sampler_kind(sampler: str, kinds: set[str]) -> str:
    """The sampler ``auto`` stands for: the grid sampler for a grid, TPE otherwise."""
    if sampler != "auto":
        return sampler
    return "grid" if kinds == {"grid"} else "tpe"


def _fit_trial_time_budget(fixed: dict[str, Any], budget: Budget, notes: list[str]) -> None:
    """A trial's own time budget (``fixed.time_budget_s``) longer than the whole study's is cut to the study's."""
    trial_budget = fixed.get("time_budget_s") or 0
    if budget.time_budget_s and float(trial_budget) > budget.time_budget_s:
        notes.append(f"fixed.time_budget_s {float(trial_budget):g} -> {budget.time_budget_s:g}, the whole study's "
                     "budget.time_budget_s")
        fixed["time_budget_s"] = budget.time_budget_s
