"""study.analysis.plots: files a report writes, and their bytes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from study.analysis.plots import line_grid, save_figure


def _figure():
    data = pd.DataFrame({"max_len": [50, 100, 200] * 2, "ms": [1.0, 2.1, 4.3, 0.8, 1.1, 1.5],
                         "model": ["sasrec"] * 3 + ["linrec"] * 3})
    return line_grid(data, x="max_len", y="ms", hue="model", logx=True, logy=True, title="step time")


def test_the_same_figure_saved_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    """A regenerated report whose numbers did not change must not change its tracked plots: no date in the SVG,
    no random element ids."""
    first = save_figure(_figure(), tmp_path / "a" / "steps")
    second = save_figure(_figure(), tmp_path / "b" / "steps")
    assert [p.suffix for p in first] == [".png", ".svg"]
    for one, other in zip(first, second):
        assert one.read_bytes() == other.read_bytes(), one.name
    svg = first[1].read_text()
    assert "<dc:date>" not in svg and "sasrec" in svg


def test_a_different_figure_gives_different_bytes(tmp_path: Path) -> None:
    first = save_figure(_figure(), tmp_path / "a" / "steps")
    changed = _figure()
    changed.suptitle("another title")
    second = save_figure(changed, tmp_path / "b" / "steps")
    assert all(one.read_bytes() != other.read_bytes() for one, other in zip(first, second))
