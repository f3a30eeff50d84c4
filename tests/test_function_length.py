"""No function in ``study/`` runs past ``MAX_LINES``: a longer one is split into named phases (issue #51), so that
each step of a trial, a study or a check can be read, and named, on its own."""

from __future__ import annotations

import ast
from pathlib import Path

STUDY = Path(__file__).resolve().parents[1] / "study"
MAX_LINES = 100  # from the ``def`` line to the last line of the body, docstring and comments included


def _long_functions(root: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_in_study_is_longer_than_the_limit() -> None:
    too_long = _long_functions(STUDY, MAX_LINES)
    assert not too_long, f"split these into named phases (at most {MAX_LINES} lines each): " + "; ".join(too_long)
