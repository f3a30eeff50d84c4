"""Typed sections of a study file: ``dataset``, ``budget``, ``scheduler``, ``resources``, ``checkpoint``, ``searcher``.

Each reader takes the parsed YAML and a :class:`~study.spec.yaml_io.ConfigErrors`, reports every problem of its
section there (naming the key) and returns a usable value anyway, so that the study's other checks still run.
Sweep studies (:mod:`study.spec.study_file`) use all of them; scaling studies share :func:`resolve_dataset` and
:func:`read_resources`.

A shortened run (``--set budget.max_epochs=1``, ``budget.num_samples=2``) is never refused for what the budget
leaves of the schedule or the sampler: :meth:`Scheduler.fit` and :func:`read_searcher` adapt instead and say what
they changed, which the sweep prints as one line and records in the resolved ``study.yaml``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from study.errors import UserError
from study.spec.yaml_io import ConfigErrors, check_keys, read_section, typed
from study.train.config import METRIC_KS
from study.train.metrics import METRIC_NAMES

VALID_METRICS = tuple(f"valid_{name}@{k}" for name in METRIC_NAMES for k in METRIC_KS)
# TPE's random start-up before it models anything: Optuna's default, scaled down for small budgets (a third of the
# trials, at least 2) so that small studies get some model-based suggestions at all.
OPTUNA_STARTUP_TRIALS = 10
TPE_EI_CANDIDATES = 24  # Optuna's default, written out so that study.yaml records what the sampler used
SEARCHER_KEYS = {"tpe": ("n_startup_trials", "multivariate", "n_ei_candidates"), "nsga2": ("population_size",),
                 "random": (), "grid": ()}


def _dict(instance: Any) -> dict[str, Any]:
    """A dataclass as YAML data, leaving out the settings that do not apply (None)."""
    return {k: v for k, v in dataclasses.asdict(instance).items() if v is not None}


# ---------------------------------------------------------------------------------------------------------------
# budget


@dataclass(frozen=True)
class Budget:
    """What a study may spend: trials, epochs per trial (also ASHA's horizon), wall clock of the whole study."""

    num_samples: int
    max_epochs: int
    time_budget_s: float  # 0 = no limit

    def to_dict(self) -> dict[str, Any]:
        return _dict(self)


def read_budget(budget_in: dict, errors: ConfigErrors, *, default_epochs: int, grid_size: int,
                notes: list[str]) -> Budget:
    """The ``budget:`` section; a grid bounds ``num_samples`` (each point runs once), so more is cut to the grid."""
    check_keys(budget_in, "budget", ("num_samples", "max_epochs", "time_budget_s"), errors)
    num_samples = typed(budget_in, "budget", "num_samples", int, errors, grid_size or 10)
    max_epochs = typed(budget_in, "budget", "max_epochs", int, errors, default_epochs)
    time_budget = typed(budget_in, "budget", "time_budget_s", (int, float), errors, 0)
    if num_samples < 1:
        errors.add(("budget", "num_samples"), f"must be >= 1, got {num_samples}")
    elif grid_size and num_samples > grid_size:
        notes.append(f"budget.num_samples {num_samples} -> {grid_size}, the points of the grid (each runs once; "
                     "search seed to repeat points)")
        num_samples = grid_size
    if max_epochs < 1:
        errors.add(("budget", "max_epochs"), f"must be >= 1, got {max_epochs}")
    if time_budget < 0:
        errors.add(("budget", "time_budget_s"), f"must be >= 0 (0 = no limit), got {time_budget}")
    return Budget(num_samples=num_samples, max_epochs=max_epochs, time_budget_s=time_budget)


# ---------------------------------------------------------------------------------------------------------------
# scheduler


@dataclass(frozen=True)
class Scheduler:
    """ASHA on a validation metric reported every epoch, stopping weak trials at rungs from ``grace_period`` on."""

    metric: str
    mode: str
    grace_period: int
    reduction_factor: float
    type: str = "asha"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "metric": self.metric, "mode": self.mode, "grace_period": self.grace_period,
                "reduction_factor": self.reduction_factor}

    def fit(self, budget: Budget) -> tuple[Scheduler | None, str]:
        """This schedule adapted to ``budget``, and a note on what changed ("" when nothing did).

        ASHA's first rung is at ``grace_period`` epochs and a trial ends anyway at ``max_epochs``: a rung at or past
        the end stops nothing, so the grace period is lowered to leave the survivors of the first rung
        ``reduction_factor`` times its epochs where the budget allows. With one epoch, or one trial, ASHA can
        stop nothing at all and is turned off.
        """
        if budget.max_epochs == 1:
            return None, "ASHA off: budget.max_epochs=1 leaves no epoch at which to stop a trial"
        if budget.num_samples == 1:
            return None, "ASHA off: budget.num_samples=1 leaves no trials to compare"
        if self.grace_period < budget.max_epochs:
            return self, ""
        grace = max(1, int(budget.max_epochs // self.reduction_factor))
        return dataclasses.replace(self, grace_period=grace), (
            f"scheduler.grace_period {self.grace_period} -> {grace} to fit budget.max_epochs={budget.max_epochs}")


def read_scheduler(data: dict, objectives: dict[str, str], errors: ConfigErrors) -> Scheduler | None:
    """The ``scheduler:`` section (a mapping, ``asha`` or ``none``), checked against the objectives."""
    raw = data.get("scheduler", {})
    if raw in (None, "none", False):
        return None
    if raw == "asha":
        raw = {}
    if not isinstance(raw, dict):
        errors.add(("scheduler",), f"expected a mapping, none, or asha; got {raw!r}")
        return None
    check_keys(raw, "scheduler", ("type", "metric", "mode", "grace_period", "reduction_factor"), errors)
    kind = raw.get("type", "asha")
    if kind in (None, "none"):
        return None
    if kind != "asha":
        errors.add(("scheduler", "type"), f"must be asha or none, got {kind!r}")
    first_valid = next((m for m in objectives if m in VALID_METRICS), "valid_ndcg@10")
    metric = raw.get("metric", first_valid)
    mode = raw.get("mode", objectives.get(metric, "max"))
    if metric not in VALID_METRICS:
        errors.add(("scheduler", "metric"), f"ASHA stops trials on a validation metric reported every epoch "
                                            f"({', '.join(VALID_METRICS)}); got {metric!r}")
    if mode not in ("max", "min"):
        errors.add(("scheduler", "mode"), f"must be max or min, got {mode!r}")
    elif metric in objectives and objectives[metric] != mode:
        errors.add(("scheduler", "mode"), f"{mode} contradicts objectives.{metric}: {objectives[metric]}")
    grace = typed(raw, "scheduler", "grace_period", int, errors, 1)
    factor = typed(raw, "scheduler", "reduction_factor", (int, float), errors, 2)
    if grace < 1:
        errors.add(("scheduler", "grace_period"), f"must be >= 1 epoch, got {grace}")
        grace = 1
    if factor <= 1:
        errors.add(("scheduler", "reduction_factor"), f"must be > 1, got {factor}")
        factor = 2
    return Scheduler(metric=str(metric), mode=str(mode), grace_period=grace, reduction_factor=factor)


# ---------------------------------------------------------------------------------------------------------------
# resources


@dataclass(frozen=True)
class Resources:
    """What one trial (or scaling cell) reserves, and how many run at once (``auto``: as many as fit)."""

    cpu: float
    gpu: float | str  # "auto" only where the reader allows it (scaling: one GPU when there is one)
    workers_per_trial: int | None  # data-parallel workers under a trial; None where a study has no such thing
    max_concurrent: int | str

    def to_dict(self) -> dict[str, Any]:
        return _dict(self)


def machine_resources() -> tuple[float, float]:
    """This machine's usable CPUs (its affinity mask) and CUDA GPUs."""
    import os

    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return float(cpus), float(torch.cuda.device_count() if torch.cuda.is_available() else 0)


def read_resources(data: dict, errors: ConfigErrors, *, check_machine: bool, unit: str = "trial",
                   gpu_auto: bool = False, data_parallel: bool = True) -> Resources:
    """The ``resources:`` section of a sweep (the defaults) or of a scaling study.

    ``unit`` names what reserves them in messages; ``gpu_auto`` allows (and defaults to) ``gpu: auto``;
    ``data_parallel`` allows ``workers_per_trial``. With ``check_machine`` a request this machine can never meet is
    an error (an embedded Ray only: a joined cluster may be larger).
    """
    raw = read_section(data, "resources", errors)
    allowed = ("cpu", "gpu") + (("workers_per_trial",) if data_parallel else ()) + ("max_concurrent",)
    check_keys(raw, "resources", allowed, errors)
    cpu = float(typed(raw, "resources", "cpu", (int, float), errors, 1))
    gpu: float | str = "auto" if gpu_auto else 0.0
    if raw.get("gpu") is not None and not (gpu_auto and raw["gpu"] == "auto"):
        gpu = float(typed(raw, "resources", "gpu", (int, float), errors, 0))
    workers = typed(raw, "resources", "workers_per_trial", int, errors, 1) if data_parallel else None
    concurrent = raw.get("max_concurrent", "auto")
    if concurrent != "auto":
        concurrent = typed(raw, "resources", "max_concurrent", int, errors, "auto")
        if concurrent != "auto" and concurrent < 1:
            errors.add(("resources", "max_concurrent"), f"must be >= 1 or auto, got {concurrent}")
    if cpu <= 0:
        errors.add(("resources", "cpu"), f"must be > 0, got {cpu:g}")
    if isinstance(gpu, float):
        if gpu < 0:
            errors.add(("resources", "gpu"), f"must be >= 0{' or auto' if gpu_auto else ''}, got {gpu:g}")
        elif gpu > 1 and not gpu.is_integer():
            errors.add(("resources", "gpu"), f"fractions are for sharing one GPU (gpu < 1); got {gpu:g}")
    if workers is not None and workers < 1:
        errors.add(("resources", "workers_per_trial"), f"must be >= 1, got {workers}")
    copies = workers or 1
    if check_machine and cpu > 0 and copies >= 1:
        machine_cpus, machine_gpus = machine_resources()
        if cpu * copies > machine_cpus:
            errors.add(("resources", "cpu"), f"a {unit} needs {cpu * copies:g} CPUs but this machine has "
                                             f"{machine_cpus:g}; no {unit} could ever start")
        if isinstance(gpu, float) and gpu > 0:
            if machine_gpus == 0:
                auto = " (gpu: auto uses one when there is one)" if gpu_auto else ""
                errors.add(("resources", "gpu"), f"{gpu:g} GPU per {unit} requested but this machine has no CUDA "
                                                 f"GPU{auto}")
            elif gpu * copies > machine_gpus:
                errors.add(("resources", "gpu"), f"a {unit} needs {gpu * copies:g} GPUs, this machine has "
                                                 f"{machine_gpus:g}")
    return Resources(cpu=cpu, gpu=gpu, workers_per_trial=workers, max_concurrent=concurrent)


# ---------------------------------------------------------------------------------------------------------------
# checkpoint: trial checkpoints and retries

CLUSTER_MAX_FAILURES = 3  # retries of a trial on a cluster, where a node may go away under it


@dataclass(frozen=True)
class Checkpoints:
    """How often a trial saves its training state (Tune checkpoints), how many it keeps, how often it is retried.

    ``auto`` resolves with where the study runs: on a cluster (``--address``) every epoch and 3 retries, since a
    lost node otherwise costs the trial; on one machine no retries, and a checkpoint as often as costs about 1 % of
    the training time (``local_every``, measured by the sweep before its first trial), so that a study stopped by
    Ctrl-C or its time budget resumes its trials where they were. A retried or ``--resume``d trial continues from
    its last checkpoint.
    """

    every: int | str  # epochs between checkpoints; 0 = none
    keep: int  # at most this many checkpoints per trial (the newest)
    max_failures: int | str  # retries of a failed trial, from its last checkpoint

    def resolve(self, on_cluster: bool, local_every: int = 0) -> tuple[int, int]:
        """``(every, max_failures)`` with ``auto`` decided by where the study runs (``local_every`` on one machine)."""
        every = (1 if on_cluster else local_every) if self.every == "auto" else int(self.every)
        failures = CLUSTER_MAX_FAILURES if on_cluster else 0
        if self.max_failures != "auto":
            failures = int(self.max_failures)
        return every, failures

    def to_dict(self) -> dict[str, Any]:
        return _dict(self)


DEFAULT_CHECKPOINTS = Checkpoints(every="auto", keep=2, max_failures="auto")


def read_checkpoints(data: dict, errors: ConfigErrors) -> Checkpoints:
    """The ``checkpoint:`` section: ``every`` (epochs, 0 = none, or auto), ``keep``, ``max_failures`` (or auto)."""
    raw = read_section(data, "checkpoint", errors)
    check_keys(raw, "checkpoint", ("every", "keep", "max_failures"), errors)
    values: dict[str, Any] = {}
    for key, least in (("every", 0), ("keep", 1), ("max_failures", 0)):
        default = getattr(DEFAULT_CHECKPOINTS, key)
        value = raw.get(key, default)
        if value == "auto" and default == "auto":
            values[key] = value
            continue
        value = typed(raw, "checkpoint", key, int, errors, default)
        if isinstance(value, int) and value < least:
            errors.add(("checkpoint", key), f"must be >= {least}{' or auto' if default == 'auto' else ''}, got {value}")
        values[key] = value
    return Checkpoints(**values)


# ---------------------------------------------------------------------------------------------------------------
# tracking: experiment trackers fed with every trial's reports

TRACKER_PACKAGES = {"mlflow": "mlflow-skinny (or mlflow)", "wandb": "wandb"}


@dataclass(frozen=True)
class Tracking:
    """Trackers that receive every trial's per-epoch reports (TensorBoard files Tune writes anyway, see docs)."""

    mlflow: dict[str, Any] | None = None  # {tracking_uri, experiment}
    wandb: dict[str, Any] | None = None  # {project}

    def to_dict(self) -> dict[str, Any]:
        return _dict(self)


def read_tracking(data: dict, errors: ConfigErrors, *, study_name: str) -> Tracking:
    """The ``tracking:`` section. A tracker whose package is not installed is refused here, before Ray starts."""
    import importlib.util

    raw = read_section(data, "tracking", errors)
    allowed = {"mlflow": ("tracking_uri", "experiment"), "wandb": ("project",)}
    check_keys(raw, "tracking", tuple(allowed), errors)
    chosen: dict[str, dict[str, Any]] = {}
    for tracker, keys in allowed.items():
        if raw.get(tracker) is None:
            continue
        section = read_section(raw, tracker, errors)
        check_keys(section, f"tracking.{tracker}", keys, errors)
        if importlib.util.find_spec(tracker) is None:
            errors.add(("tracking", tracker), f"needs the {tracker} package, which is not installed here: "
                                              f"pip install {TRACKER_PACKAGES[tracker].split()[0]}")
        defaults = {"mlflow": {"tracking_uri": None, "experiment": study_name}, "wandb": {"project": study_name}}
        chosen[tracker] = {**defaults[tracker], **{k: v for k, v in section.items() if k in keys}}
    uri = (chosen.get("mlflow") or {}).get("tracking_uri")
    if uri is not None and _mlflow_refuses_file_store(str(uri)):
        errors.add(("tracking", "mlflow", "tracking_uri"),
                   f"{uri} is an MLflow file store, which the installed MLflow opens only with "
                   "MLFLOW_ALLOW_FILE_STORE=true in the environment: set it, or use sqlite:///PATH/mlflow.db")
    return Tracking(**chosen)


def _mlflow_refuses_file_store(uri: str) -> bool:
    """Whether MLflow would refuse ``uri`` as a file store (MLflow 3 does, unless MLFLOW_ALLOW_FILE_STORE is set).

    Known here from the installed package's files, without importing it (seconds): the refusal comes with that
    environment variable. Found now, it is one error line before Ray starts, not a traceback from inside Tune.
    """
    import importlib.util
    import os
    import re

    scheme = re.match(r"^([A-Za-z][\w+.-]*):", uri)
    if (scheme and scheme.group(1).lower() != "file") or uri == "databricks":
        return False
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("true", "1"):
        return False
    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return False
    variables = Path(next(iter(spec.submodule_search_locations))) / "environment_variables.py"
    return variables.is_file() and "MLFLOW_ALLOW_FILE_STORE" in variables.read_text()


# ---------------------------------------------------------------------------------------------------------------
# searcher: the sampler's settings


@dataclass(frozen=True)
class Searcher:
    """The Optuna sampler a study uses and its settings; ``study.yaml`` records them as ``searcher:``."""

    sampler: str  # tpe | nsga2 | random | grid (``sampler: auto`` resolved)
    n_startup_trials: int | None = None  # TPE: random trials before it models the results
    multivariate: bool | None = None  # TPE: models the searched keys jointly
    n_ei_candidates: int | None = None  # TPE: candidates scored per suggestion
    population_size: int | None = None  # NSGA-II: trials per generation

    def to_dict(self) -> dict[str, Any] | None:
        settings = _dict(self)
        settings.pop("sampler")
        return settings or None


def default_startup_trials(choice_counts: list[int], num_samples: int) -> int:
    """Random start-up trials enough to draw each choice value once (the longest choice list), but never fewer
    than the budget-scaled floor ``max(2, min(10, num_samples // 3))`` nor more than ``num_samples``."""
    floor = max(2, min(OPTUNA_STARTUP_TRIALS, num_samples // 3))
    return min(num_samples, max([floor, *choice_counts]))


def read_searcher(data: dict, errors: ConfigErrors, *, sampler: str, choice_counts: list[int], num_samples: int,
                  notes: list[str]) -> Searcher:
    """The ``searcher:`` section: settings of the resolved ``sampler`` (TPE's or NSGA-II's; random and grid have
    none). ``choice_counts``: how many values each searched categorical key has."""
    raw = read_section(data, "searcher", errors)
    allowed = SEARCHER_KEYS.get(sampler, ())
    for key in raw:
        if key not in allowed:
            takes = f"takes {', '.join(allowed)}" if allowed else "takes no settings"
            errors.add(("searcher", key), f"not a setting of the {sampler} sampler, which {takes}")
    if sampler == "nsga2":
        # a generation smaller than Optuna's 50 so that small studies evolve at all
        population = typed(raw, "searcher", "population_size", int, errors, max(4, min(50, num_samples // 4)))
        if population < 2:
            errors.add(("searcher", "population_size"), f"must be >= 2, got {population}")
        return Searcher(sampler, population_size=population)
    if sampler != "tpe":
        return Searcher(sampler)
    startup = typed(raw, "searcher", "n_startup_trials", int, errors, None)
    if startup is None:
        startup = default_startup_trials(choice_counts, num_samples)
    elif startup < 0:
        errors.add(("searcher", "n_startup_trials"), f"must be >= 0, got {startup}")
        startup = 0
    elif startup > num_samples:
        notes.append(f"searcher.n_startup_trials {startup} -> {num_samples} to fit budget.num_samples")
        startup = num_samples
    multivariate = typed(raw, "searcher", "multivariate", bool, errors, True)
    candidates = typed(raw, "searcher", "n_ei_candidates", int, errors, TPE_EI_CANDIDATES)
    if candidates < 1:
        errors.add(("searcher", "n_ei_candidates"), f"must be >= 1, got {candidates}")
    return Searcher(sampler, n_startup_trials=startup, multivariate=multivariate, n_ei_candidates=candidates)


# ---------------------------------------------------------------------------------------------------------------
# dataset


def resolve_dataset(data: dict, errors: ConfigErrors, source: Path | None, streamable: bool = False) -> dict[str, Any]:
    """The ``dataset:`` section of a study file (sweep or scaling): recipe, source, k-core and recipe options, and
    (``streamable``: sweeps) ``stream``, whether trials read their training windows from Parquet every epoch."""
    from study.data import get_recipe

    if isinstance(data.get("dataset"), str):  # `dataset: lastfm` is a natural shorthand
        section = {"name": data["dataset"]}
    else:
        section = read_section(data, "dataset", errors, {"name": "ml-100k"})
    allowed = ("name", "source", "kcore", "options") + (("stream",) if streamable else ())
    check_keys(section, "dataset", allowed, errors)
    stream = typed(section, "dataset", "stream", bool, errors, False) if streamable else False
    name = typed(section, "dataset", "name", str, errors, "ml-100k")
    kcore = typed(section, "dataset", "kcore", int, errors, None)
    options = section.get("options") or {}
    if not isinstance(options, dict):
        errors.add(("dataset", "options"), f"must be a mapping of recipe options, got {options!r}")
        options = {}
    raw_source = section.get("source")
    dataset_source = None
    if raw_source is not None:
        if not isinstance(raw_source, str):
            errors.add(("dataset", "source"), f"expected a path, got {type(raw_source).__name__} {raw_source!r}")
        else:
            candidate = Path(raw_source).expanduser()
            # a relative source is read relative to the working directory first, then to the study file
            if not candidate.is_absolute() and not candidate.exists() and source is not None:
                beside = source.parent / candidate
                candidate = beside if beside.exists() else candidate
            if not candidate.exists():
                errors.add(("dataset", "source"), f"{raw_source} does not exist")
            dataset_source = str(candidate.resolve()) if candidate.exists() else raw_source
    if kcore is not None and kcore < 0:
        errors.add(("dataset", "kcore"), f"must be >= 0, got {kcore}")
    try:
        recipe = get_recipe(name)
    except UserError as error:
        errors.add(("dataset", "name"), str(error))
        recipe = None
    if recipe is not None:
        try:
            recipe.resolve_options(dict(options))
        except UserError as error:
            errors.add(("dataset", "options"), str(error))
        if recipe.synthetic and raw_source is not None:
            errors.add(("dataset", "source"), f"dataset '{name}' is generated and takes no source")
        if not recipe.synthetic and recipe.download is None and raw_source is None:
            errors.add(("dataset", "source"), f"dataset '{name}' cannot be downloaded; give a local copy "
                                              f"(--set dataset.source=PATH): {recipe.source_format}")
    return {"name": name, "source": dataset_source, "kcore": kcore, "options": dict(options), "stream": stream}
