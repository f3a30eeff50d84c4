"""The resolved study: what :func:`study.spec.study_file.load_study` returns once every section is read and checked.

It lives apart from the reading (:mod:`study.spec.study_file`) and the checks across sections (:mod:`study.spec.checks`)
so that both can name it without importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import models
from study.spec.fields import DEFAULT_CHECKPOINTS, Budget, Checkpoints, Resources, Scheduler, Searcher, Tracking
from study.spec.search_space import SearchParam


@dataclass
class Study:
    """A validated study. ``settings(point)`` gives the flat trial settings for one searched point."""

    name: str
    model: str
    dataset: dict[str, Any]
    protocol: dict[str, Any]
    fixed: dict[str, Any]
    search: dict[str, SearchParam]
    objectives: dict[str, str]
    budget: Budget
    scheduler: Scheduler | None  # as the budget leaves it (see Scheduler.fit)
    resources: Resources
    sampler: str  # as written: auto | tpe | nsga2 | random | grid
    searcher: Searcher  # the sampler it resolves to, with its settings
    seeds: dict[str, int]
    storage: Path  # the local folder every writer uses
    storage_uri: str | None = None  # where that folder is mirrored (s3://…), if anywhere: see study.storage
    source: Path | None = None
    adaptation: str = ""  # what a budget shorter than the schedule or sampler needs changed, one line ("": nothing)
    checked_points: int = 0
    exhaustive_check: bool = True
    checkpoint: Checkpoints = DEFAULT_CHECKPOINTS
    tracking: Tracking = Tracking()

    def settings(self, point: dict[str, Any] | None = None) -> dict[str, Any]:
        """Protocol + fixed keys + the budget's epochs + the training seed, then the searched point. A data-parallel
        worker or a streamed dataset holds no whole histories, so there `auto` windows are each user's newest
        (``window_step`` 0; a step the study gives is refused by :mod:`study.spec.checks`)."""
        base = {**self.protocol, **self.fixed, "max_epochs": self.budget.max_epochs}
        if self.resources.workers_per_trial > 1 or self.dataset["stream"]:
            base.setdefault("window_step", 0)
        if "seed" not in self.search:
            base["seed"] = self.seeds["train"]
        return {**base, **(point or {})}

    @property
    def is_grid(self) -> bool:
        return any(p.kind == "grid" for p in self.search.values())

    @property
    def grid_size(self) -> int:
        return math.prod(len(p.values) for p in self.search.values()) if self.is_grid else 0

    @property
    def resolved_sampler(self) -> str:
        return self.searcher.sampler

    def max_len_candidates(self) -> list[int]:
        """Every input length a trial may use; the dataset is prepared once for the longest."""
        if "max_len" in self.search:
            param = self.search["max_len"]
            return [int(v) for v in param.candidates()]
        default = models.model_class(self.model).config_class.max_len
        return [int(self.fixed.get("max_len", default))]

    def to_dict(self) -> dict[str, Any]:
        """The resolved study as plain YAML data (defaults filled in, overrides applied)."""
        return {
            "name": self.name,
            "model": self.model,
            "dataset": dict(self.dataset),
            "protocol": dict(self.protocol),
            "fixed": dict(self.fixed),
            "search": {name: p.to_yaml() for name, p in self.search.items()},
            "objectives": dict(self.objectives),
            "budget": self.budget.to_dict(),
            "scheduler": self.scheduler.to_dict() if self.scheduler else None,
            "resources": self.resources.to_dict(),
            # left out at its default, so that studies written before the section existed still --resume
            **({"checkpoint": self.checkpoint.to_dict()} if self.checkpoint != DEFAULT_CHECKPOINTS else {}),
            **({"tracking": self.tracking.to_dict()} if self.tracking != Tracking() else {}),
            "sampler": self.sampler,
            "searcher": self.searcher.to_dict(),
            "seeds": dict(self.seeds),
            "storage": self.storage_uri or str(self.storage),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=120)
