"""Code carries no diary: the shipped code and study files say why, never when.

The docstrings and comments of ``study/``, ``models/`` and ``kernels/`` state the choices a paper leaves open and
cite papers (a paper's year is not a date here); the comments of the shipped study files explain their settings.
Neither dates a change, nor points at the logs of particular runs (``benchmarks/results/``) as evidence: a date
is true of a run, not of the code, and a run log is not shipped with the package.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CODE_DIRS = ("study", "models", "kernels")
STUDY_FILES = "search_spaces"

MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
DIARY = {
    "an ISO date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a calendar date": re.compile(rf"\b(?:\d{{1,2}} )?(?:{MONTHS}) (?:\d{{1,2}}, )?20\d\d\b"),
    "a pointer to run logs": re.compile(r"benchmarks/results/"),
}


def shipped_files() -> list[Path]:
    files = [path for folder in CODE_DIRS for path in (REPO / folder).rglob("*.py")]
    files += (REPO / STUDY_FILES).rglob("*.yaml")
    # a campaign's study files and campaign file are shipped too (its NOTES.md may keep dated notes)
    files += (REPO / "experiments").glob("*/studies/*.yaml")
    files += (REPO / "experiments").glob("*/campaign.yaml")
    return sorted(path for path in files if "__pycache__" not in path.parts)


def diary_lines(text: str) -> list[tuple[int, str, str]]:
    """``(line number, what, line)`` for every line of ``text`` that dates something or points at run logs."""
    return [(number, what, line.strip()) for number, line in enumerate(text.splitlines(), 1)
            for what, pattern in DIARY.items() if pattern.search(line)]


def test_the_patterns_find_a_diary_and_leave_citations_alone() -> None:
    diary = ("as the zoo did until 2026-11-27\n"
             "# the default since 27 November 2026\n"
             "figures in benchmarks/results/gpu_h200.md\n")
    assert [(number, what) for number, what, _ in diary_lines(diary)] == [
        (1, "an ISO date"), (2, "a calendar date"), (3, "a pointer to run logs")]
    citations = ("ELASTIC (Deng et al., AAAI 2025)\n"
                 "(CVE-2023-48022)\n"
                 "keys (Lample et al. 2019), seed 2020, arXiv 2506.13315\n"
                 "python -m benchmarks.padding --device cuda\n")
    assert diary_lines(citations) == []


def test_the_scan_covers_the_shipped_code_and_study_files() -> None:
    files = {path.relative_to(REPO).as_posix() for path in shipped_files()}
    assert {"models/bert4rec.py", "study/train/config.py", "kernels/_triton_utils.py",
            "search_spaces/sasrec.yaml", "search_spaces/paper/sasrec-ml1m.yaml",
            "experiments/reproduction/studies/bert4rec.yaml", "experiments/reproduction/campaign.yaml"} <= files


def test_code_and_study_files_carry_no_diary() -> None:
    found = [f"{path.relative_to(REPO).as_posix()}:{number}: {what}: {line}"
             for path in shipped_files()
             for number, what, line in diary_lines(path.read_text(encoding="utf-8"))]
    if found:
        pytest.fail("dated notes or run-log pointers (state the choice and why instead):\n" + "\n".join(found),
                    pytrace=False)
