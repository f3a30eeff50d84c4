"""The ``search:`` section of a sweep: one distribution per searched key.

``choice``/``grid`` list values (coerced to the key's type), ``int``/``uniform``/``loguniform`` give ``[low, high]``
with an optional ``step`` (and ``log`` for ints). Which keys may be searched, and their types, is the sweep's
business (:mod:`study.spec.study_file`); this module only reads and checks one distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from models import ConfigError
from study.spec.yaml_io import ConfigErrors, yaml_number
from study.train.config import coerce

DISTRIBUTIONS = ("choice", "grid", "int", "uniform", "loguniform")


@dataclass
class SearchParam:
    """One searched key: ``kind`` is a distribution; ``values`` for choice/grid, else ``low``/``high``."""

    name: str
    kind: str
    values: list[Any] = field(default_factory=list)
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    log: bool = False

    def candidates(self) -> list[Any]:
        """The values validation tries: every choice, or a range's two ends."""
        if self.kind in ("choice", "grid"):
            return list(self.values)
        return [self.low] if self.low == self.high else [self.low, self.high]

    def to_yaml(self) -> dict[str, Any]:
        if self.kind in ("choice", "grid"):
            return {self.kind: list(self.values)}
        spec: dict[str, Any] = {self.kind: [self.low, self.high]}
        if self.step is not None:
            spec["step"] = self.step
        if self.log and self.kind == "int":
            spec["log"] = True
        return spec


def read_search_param(key: str, spec: Any, target: type, errors: ConfigErrors) -> SearchParam | None:
    """One ``search:`` entry for a key of type ``target``; None (with the problem reported) when unusable."""
    path = ("search", key)
    if not isinstance(spec, dict):
        errors.add(path, f"expected a distribution such as {{choice: [..]}}, got {spec!r}; "
                         f"one of: {', '.join(DISTRIBUTIONS)} (a fixed value goes under fixed:)")
        return None
    kinds = [k for k in spec if k in DISTRIBUTIONS]
    extra = [k for k in spec if k not in DISTRIBUTIONS + ("step", "log")]
    if len(kinds) != 1 or extra:
        errors.add(path, f"needs exactly one of {', '.join(DISTRIBUTIONS)} (plus optional step/log), "
                         f"got {', '.join(map(str, spec)) or 'nothing'}")
        return None
    kind = kinds[0]
    body = spec[kind]
    if kind in ("choice", "grid"):
        if not isinstance(body, list) or not body:
            errors.add(path + (kind,), f"expected a non-empty list of values, got {body!r}")
            return None
        if "step" in spec or "log" in spec:
            errors.add(path, f"step/log apply to int/uniform ranges, not {kind}")
        values = []
        for index, value in enumerate(body):
            try:
                values.append(coerce(key, value, target))
            except ConfigError as error:
                errors.add(path + (kind, index), error.errors[0][1])
        if len(set(map(repr, values))) != len(values):
            errors.add(path + (kind,), f"repeats a value: {body!r}")
        return SearchParam(key, kind, values=values)
    if not isinstance(body, list) or len(body) != 2 or any(yaml_number(v) is None for v in body):
        errors.add(path + (kind,), f"expected [low, high] numbers, got {body!r}")
        return None
    low, high = (yaml_number(v) for v in body)
    step = yaml_number(spec["step"]) if "step" in spec else None
    log = spec.get("log", False)
    if "step" in spec and (step is None or step <= 0):
        errors.add(path + ("step",), f"must be a positive number, got {spec['step']!r}")
        step = None
    if not isinstance(log, bool):
        errors.add(path + ("log",), f"expected true or false, got {log!r}")
        log = False
    if kind == "int":
        if target is not int:
            errors.add(path, f"int needs an integer key; {key} is {target.__name__} (use uniform or loguniform)")
            return None
        if not all(float(v).is_integer() for v in (low, high)) or (step is not None and not float(step).is_integer()):
            errors.add(path + (kind,), f"int bounds and step must be integers, got {body!r}")
            return None
        low, high = int(low), int(high)
        step = int(step) if step is not None else None
        if low > high:
            errors.add(path + (kind,), f"low {low} exceeds high {high}")
        if log and (low < 1 or (step or 1) != 1):
            errors.add(path + ("log",), "a log-scale int range needs low >= 1 and no step")
        return SearchParam(key, kind, low=low, high=high, step=step, log=log)
    if target is not float:
        errors.add(path, f"{kind} samples floats; {key} is {target.__name__} (use int or choice)")
        return None
    if "log" in spec:
        errors.add(path + ("log",), f"log applies to int ranges; use loguniform instead of {kind} + log")
    low, high = float(low), float(high)
    if low >= high:
        errors.add(path + (kind,), f"low {low} must be below high {high}")
    if kind == "loguniform":
        if low <= 0:
            errors.add(path + (kind,), f"loguniform needs low > 0, got {low}")
        if step is not None:
            errors.add(path + ("step",), "loguniform takes no step")
    return SearchParam(key, kind, low=low, high=high, step=float(step) if step is not None else None)
