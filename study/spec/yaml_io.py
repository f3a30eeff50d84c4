"""The YAML toolkit of every study file: reading with line numbers, ``--set`` overrides, and the error collector.

Sweep studies (:mod:`study.spec.study_file`) and scaling studies (:mod:`study.spec.scaling_file`) read their files
through this module, so both report every problem at once as ``file:line: dotted.key: message`` and exit with code 2.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from study.errors import UserError

# study names and model labels become folder and file names
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class StudyConfigError(UserError):
    """Every problem of a study file; ``errors`` holds one ``"where: message"`` string per problem."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("; ".join(errors))

    def lines(self) -> list[str]:
        return list(self.errors)


def _line_map(node: yaml.Node, path: tuple = (), lines: dict | None = None,
              duplicates: list | None = None) -> tuple[dict[tuple, int], list[tuple[tuple, int]]]:
    """Line number (1-based) of every mapping key and list item, and the keys given twice.

    PyYAML silently keeps the last of two equal keys; a study file that says ``lr`` twice is a mistake.
    """
    lines = {} if lines is None else lines
    duplicates = [] if duplicates is None else duplicates
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = path + (str(key_node.value),)
            if child in lines:
                duplicates.append((child, key_node.start_mark.line + 1))
            lines[child] = key_node.start_mark.line + 1
            _line_map(value_node, child, lines, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = path + (index,)
            lines[child] = item.start_mark.line + 1
            _line_map(item, child, lines, duplicates)
    return lines, duplicates


def read_yaml(path: Path) -> tuple[dict[str, Any], dict[tuple, int]]:
    """Parse ``path``; a syntax error names the line and column, and duplicate keys are errors."""
    try:
        text = path.read_text()
    except OSError as error:
        raise UserError(f"{path}: cannot read the study file ({error.strerror or error})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        context = getattr(error, "context", None)
        raise StudyConfigError([f"{where}: malformed YAML: {problem}" + (f" ({context})" if context else "")]) from None
    if data is None:
        raise StudyConfigError([f"{path}: the study file is empty"])
    if not isinstance(data, dict):
        raise StudyConfigError([f"{path}:1: the study file must be a mapping of sections, got {type(data).__name__}"])
    lines, duplicates = _line_map(node)
    if duplicates:
        raise StudyConfigError([f"{path}:{line}: {'.'.join(map(str, key))}: given twice" for key, line in duplicates])
    return data, lines


def apply_overrides(data: dict[str, Any], assignments: list[str]) -> set[tuple[str, ...]]:
    """Apply ``--set a.b.c=value`` in place (values parsed as YAML); returns the overridden paths."""
    overridden = set()
    errors = []
    for assignment in assignments:
        dotted, sep, text = assignment.partition("=")
        path = tuple(part.strip() for part in dotted.split("."))
        if not sep or not all(path):
            errors.append(f"--set {assignment}: expected section.key=value, e.g. budget.num_samples=2")
            continue
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as error:
            errors.append(f"--set {assignment}: the value is not valid YAML ({str(error).splitlines()[0]})")
            continue
        target = data
        for depth, part in enumerate(path[:-1]):
            if target.get(part) is None:
                target[part] = {}
            if not isinstance(target[part], dict):
                errors.append(f"--set {assignment}: {'.'.join(path[:depth + 1])} is not a section")
                break
            target = target[part]
        else:
            target[path[-1]] = value
            overridden.add(path)
    if errors:
        raise StudyConfigError(errors)
    return overridden


class ConfigErrors:
    """Collects ``where: message`` lines; ``where`` is ``file:line: dotted.key`` or ``--set dotted.key``."""

    def __init__(self, source: Path | None, lines: dict[tuple, int], overridden: set[tuple]):
        self.source, self.lines, self.overridden, self.items = source, lines, overridden, []
        self.alias: dict[tuple, tuple] = {}

    def where(self, *path: Any) -> str:
        path = self.alias.get(tuple(path[:2]), tuple(path[:2])) + tuple(path[2:])
        dotted = ""
        for part in path:  # models[1].config.hidden_size: list positions as indices
            dotted += f"[{part}]" if isinstance(part, int) else (f".{part}" if dotted else str(part))
        for depth in range(len(path), 0, -1):
            if tuple(path[:depth]) in self.overridden:
                return f"--set {dotted}"
        name = str(self.source) if self.source else "<study>"
        for depth in range(len(path), 0, -1):
            line = self.lines.get(tuple(path[:depth]))
            if line is not None:
                return f"{name}:{line}: {dotted}"
        return f"{name}: {dotted}"

    def add(self, path: tuple, message: str) -> None:
        entry = f"{self.where(*path)}: {message}"
        if entry not in self.items:
            self.items.append(entry)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def yaml_number(value: Any) -> float | int | None:
    """A YAML number, also from strings: PyYAML reads ``1e-3`` (no dot) as a string."""
    if is_number(value):
        return value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return int(number) if re.fullmatch(r"[+-]?\d+", value.strip()) else number
    return None


def read_section(data: dict, name: str, errors: ConfigErrors, default: dict | None = None) -> dict:
    value = data.get(name)
    if value is None:
        return dict(default or {})
    if not isinstance(value, dict):
        errors.add((name,), f"must be a mapping, got {type(value).__name__} {value!r}")
        return dict(default or {})
    return dict(value)


def check_keys(section: dict, name: str, allowed: dict[str, Any] | tuple, errors: ConfigErrors) -> None:
    for key in section:
        if key not in allowed:
            errors.add((name, key), f"unknown key; {name} takes {', '.join(allowed)}")


def typed(section: dict, name: str, key: str, kind: type | tuple, errors: ConfigErrors, default: Any) -> Any:
    """Read ``section[key]`` as ``kind`` (numbers may come as strings), or report and return the default."""
    if key not in section or section[key] is None:
        return default
    value = section[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if bool in kinds and isinstance(value, bool):
        return value
    if (int in kinds or float in kinds) and not isinstance(value, bool):
        number = yaml_number(value)
        if number is not None:
            if int in kinds and float not in kinds:
                if float(number).is_integer():
                    return int(number)
            else:
                return float(number) if float in kinds and int not in kinds else number
    if str in kinds and isinstance(value, str):
        return value
    names = " or ".join(k.__name__ for k in kinds)
    errors.add((name, key), f"expected {names}, got {type(value).__name__} {value!r}")
    return default
