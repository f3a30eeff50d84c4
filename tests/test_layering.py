"""The layout shows the data flow: the results-folder contract is light, writers never import the reader, and the
platform never imports the lab (benchmarks, campaigns)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORM = ("study", "models", "kernels")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_results_layout_loads_no_pandas_torch_or_ray() -> None:
    code = ("import sys, study.layout, study.analysis.runs; "
            "print(sorted(m for m in ('pandas', 'torch', 'ray', 'matplotlib') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_the_sweeps_writers_name_files_through_the_layout_not_the_reader() -> None:
    writers = sorted((REPO / "study" / "search").glob("*.py"))
    offenders = [str(p.relative_to(REPO)) for p in writers if "study.analysis.runs" in _imports(p)]
    assert not offenders, offenders


def test_the_platform_imports_no_benchmark_or_campaign_code() -> None:
    offenders = []
    for package in PLATFORM:
        for path in sorted((REPO / package).rglob("*.py")):
            lab = {name for name in _imports(path) if name.split(".")[0] in ("benchmarks", "experiments")}
            if lab:
                offenders.append(f"{path.relative_to(REPO)}: {', '.join(sorted(lab))}")
    assert not offenders, offenders
