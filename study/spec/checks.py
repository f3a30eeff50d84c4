"""Checks of a study across its sections, run once its sections are read (:func:`study.spec.study_file.resolve`).

Every search point goes through :func:`study.train.config.split_settings` and ``models.make_config``, so the model
declares its own constraints and the sweep never repeats them; then the settings that only make sense together
(efficiency objectives and measuring, threads and the CPU share, streaming and the objective, device and GPUs), and
whether this machine can measure an energy objective at all (:func:`check_energy`).
"""

from __future__ import annotations

import itertools
import math
import textwrap
from typing import Any

import models
from models import ConfigError
from study.spec.resolved import Study
from study.spec.yaml_io import ConfigErrors
from study.train.config import TrainConfig, coerce, cuda_graph_conflict, split_settings
from study.train.results import ENERGY_METRICS, PROTOCOL_SETTINGS

# Efficiency figures a trial measures once before its first epoch and reports with every epoch (see
# study.search.trial): an objective on one of them needs measure_efficiency
MEASURED_OBJECTIVES = ("peak_mem_mb", "infer_ms_p50", "infer_ms_p95", "infer_energy_j_per_1k")
MAX_CHECKED_POINTS = 4096  # beyond this many search combinations, check one key at a time
MAX_BUILT_MODELS = 32  # models built to check the training objective, after de-duplicating their configs


def _points(study: Study) -> tuple[list[dict[str, Any]], bool]:
    """Search points to validate: the whole product of candidate values, or one key at a time when huge."""
    names = list(study.search)
    candidates = [study.search[name].candidates() for name in names]
    if math.prod(len(c) for c in candidates) <= MAX_CHECKED_POINTS:
        return [dict(zip(names, combo)) for combo in itertools.product(*candidates)], True
    base = {name: values[0] for name, values in zip(names, candidates)}
    points = [base]
    for name, values in zip(names, candidates):
        points += [{**base, name: value} for value in values[1:]]
    return points, False


def _data_placeholders(model: str) -> dict[str, int]:
    """Placeholders for the sizes the trainer takes from the dataset: no constraint may depend on them."""
    return {"num_items": 2, **({"num_users": 2} if models.model_class(model).needs_users else {})}


def check_combinations(study: Study, errors: ConfigErrors) -> None:
    """Run every search point through split_settings + make_config, and check the training objective.

    The model declares its own constraints (heads divide hidden size, ELASTIC's K square ...), so this stays
    generic over the registry. ``num_items`` (and ``num_users``) are placeholders: the trainer sizes them from the data.
    """
    from study.train.objectives import resolve_auto_settings, resolve_objective

    points, study.exhaustive_check = _points(study)
    study.checked_points = len(points)
    failures: dict[tuple[tuple, str], list[dict]] = {}
    objectives: dict[str, str | None] = {}  # the objective of each distinct model config, None where it fails
    for point in points:
        settings = study.settings(point)
        try:
            train_cfg, hparams = split_settings(study.model, settings)
            models.make_config(study.model, **_data_placeholders(study.model), **hparams)
        except ConfigError as error:
            for key, message in error.errors:
                failures.setdefault((_home(study, key), message), []).append(point)
            continue
        if study.resources.workers_per_trial > 1 and train_cfg.objective == "last":
            errors.add(("protocol", "objective"), "objective last expands each user into a varying number of "
                                                  "prefix batches, which data-parallel workers cannot keep in step; "
                                                  "use workers_per_trial: 1")
        identity = repr(sorted(hparams.items())) + train_cfg.objective
        if identity not in objectives and len(objectives) < MAX_BUILT_MODELS:
            try:  # the objective may depend on the model's config (a causal mixer trains like SASRec)
                model = models.build(study.model, **_data_placeholders(study.model), **hparams)
                objectives[identity] = resolve_objective(model, train_cfg.objective)
            except ConfigError as error:
                objectives[identity] = None
                for key, message in error.errors:
                    failures.setdefault((_home(study, key), message), []).append(point)
        objective = objectives.get(identity)
        if objective is None:  # unknown (past MAX_BUILT_MODELS) or already reported
            continue
        conflict = cuda_graph_conflict(train_cfg, objective)
        if conflict:  # refused before any trial starts, not as a crash or an error in every trial
            failures.setdefault((_home(study, "compile_mode"), conflict), []).append(point)
            continue
        max_len = hparams.get("max_len", models.model_class(study.model).config_class.max_len)
        try:
            resolve_auto_settings(train_cfg, objective, max_len, study.model)
        except ConfigError as error:
            for key, message in error.errors:
                failures.setdefault((_home(study, key), message), []).append(point)
            continue
        if train_cfg.window_step and (study.resources.workers_per_trial > 1 or study.dataset["stream"]):
            # like `last`, its windows come from every user's whole history, not from a worker's shard or a stream
            # (left `auto`, the runner trains such trials on each user's newest window)
            errors.add(_home(study, "window_step"),
                       f"window_step {train_cfg.window_step} cuts every user's whole history into windows, which "
                       "neither data-parallel workers nor a streamed dataset hold; set window_step: 0 (each user's "
                       "newest window) or use workers_per_trial: 1 and no stream")
    shown_per_key: dict[tuple, int] = {}
    for (path, message), failing in failures.items():
        shown_per_key[path] = shown_per_key.get(path, 0) + 1
        if shown_per_key[path] > 3:  # three examples say enough about one key; more would bury other problems
            continue
        if not study.search or len(failing) == len(points):
            errors.add(path, message)
            continue
        first = ", ".join(f"{k}={v}" for k, v in failing[0].items())
        more = f"; {len(failing)} of {len(points)} points fail" if len(failing) > 1 else ""
        errors.add(path, f"{message} (at search point {first}{more})")
    _check_study_settings(study, errors)


def _home(study: Study, key: str) -> tuple[str, str]:
    """The section that sets ``key``, where an error about it is reported."""
    if key in study.search:
        return ("search", key)
    if key in PROTOCOL_SETTINGS:
        return ("protocol", key)
    if key == "max_epochs":
        return ("budget", "max_epochs")
    if key == "seed":
        return ("seeds", "train")
    return ("fixed", key)


def _check_study_settings(study: Study, errors: ConfigErrors) -> None:
    """Combinations across sections: efficiency objectives need measuring, threads fit the CPU share."""
    settings = study.settings({k: p.candidates()[0] for k, p in study.search.items()})
    measure = settings.get("measure_efficiency", TrainConfig.measure_efficiency)
    for metric in study.objectives:
        if metric in MEASURED_OBJECTIVES and not coerce("measure_efficiency", measure, bool):
            errors.add(("objectives", metric), "needs measure_efficiency: true (fixed.measure_efficiency is false)")
    threads = settings.get("num_threads")
    cpu = study.resources.cpu
    if threads and int(threads) > max(1, math.floor(cpu)):
        errors.add(("fixed", "num_threads"), f"{threads} threads on resources.cpu={cpu:g} oversubscribes the CPU "
                                             "share of each trial; leave num_threads unset (= the CPU share)")
    if study.dataset["stream"] and (settings.get("objective") == "last" or study.resources.workers_per_trial > 1):
        errors.add(("dataset", "stream"), "needs workers_per_trial: 1 and an objective other than last")
    device = str(settings.get("device", "auto"))
    if study.resources.gpu > 0 and device == "cpu":
        errors.add(("fixed", "device"), "device cpu with resources.gpu > 0 reserves a GPU that no trial uses")
    if study.resources.gpu == 0 and device.startswith("cuda"):
        errors.add(("fixed", "device"), f"device {device} needs resources.gpu > 0: Ray hides GPUs from trials "
                                        "that reserve none")


# ---------------------------------------------------------------------------------------------------------------
# Energy: measured by the trials' device's own counter, or not at all


def trial_device(study: Study) -> str:
    """The device type the study's trials train on: a GPU when they reserve one (Ray hides GPUs from the others)."""
    device = str(study.settings().get("device", "auto"))
    return "cuda" if isinstance(study.resources.gpu, float) and study.resources.gpu > 0 and device != "cpu" else "cpu"


def energy_unavailable(study: Study) -> str:
    """Why this machine cannot measure the energy of the study's trials (no NVML device, no readable RAPL), ``""``
    when it can (:mod:`study.train.energy`)."""
    from study.train import energy

    return energy.probe(trial_device(study), poll_s=None)[1]


def check_energy(study: Study, errors: ConfigErrors, *, check_machine: bool) -> None:
    """An energy objective needs a counter: refused here, before Ray starts, rather than optimised as NaN by every
    trial. Only with ``check_machine`` (an embedded Ray: a joined cluster's nodes may have counters the driver lacks).
    Data-parallel trials record no training energy (see study.search.data_parallel)."""
    wanted = [metric for metric in study.objectives if metric in ENERGY_METRICS]
    if "train_energy_j_per_epoch" in wanted and study.resources.workers_per_trial > 1:
        errors.add(("objectives", "train_energy_j_per_epoch"), "data-parallel trials (workers_per_trial > 1) record "
                                                                "no training energy; use workers_per_trial: 1")
    why = energy_unavailable(study) if wanted and check_machine else ""
    for metric in wanted if why else ():
        errors.add(("objectives", metric), f"energy is not measured on this machine: {why}; rows would say "
                                           "energy_method: unavailable. Drop this objective or run where the "
                                           "trials' device has an energy counter (docs/sweep.md)")


def energy_line(study: Study, concurrency: int) -> str | None:
    """The sweep's one line about energy: that it is not measured here and why, or that trials at once share the
    counter, which counts the whole device; ``None`` when each trial has its device to itself."""
    why = energy_unavailable(study)
    line = None
    if why:
        line = f"energy: not measured on this machine ({why}); rows say energy_method: unavailable"
    elif concurrency > 1 and (study.resources.gpu < 1 if trial_device(study) == "cuda" else True):
        what = "GPU" if trial_device(study) == "cuda" else "CPU (every package)"
        line = (f"energy: the counter measures the whole {what}, which {concurrency} trials at a time share: each "
                "trial's energy includes its neighbours' (resources.max_concurrent: 1 measures each alone)")
    return textwrap.fill(line, width=120, subsequent_indent="  ") if line else None  # the console's width
