"""Plotting helpers shared by the studies: faceted line plots on log or linear axes, saved as PNG and SVG.

Every function takes a tidy ``pandas.DataFrame`` (one row per point) and column names, so the scaling study,
the sweep analysis and ad-hoc notebooks draw the same kind of figure the same way:

* :func:`line_grid`: one line per ``hue`` value, optional facets by ``col``/``row``, log axes on request, an
  optional horizontal reference line (e.g. ratio = 1);
* :func:`loglog_lines`: :func:`line_grid` with both axes logarithmic (growth against a size);
* :func:`ratio_lines`: ratios to a reference on log-log axes with the parity line drawn;
* :func:`palette_for`: one fixed colour per label, so a model keeps its colour across a study's figures;
* :func:`save_figure`: writes ``<stem>.png`` and ``<stem>.svg`` and closes the figure.

Matplotlib runs on the non-interactive Agg backend: these helpers write files and never open a window.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

FORMATS = ("png", "svg")


def _pyplot():
    """pyplot on the Agg backend, imported on first use (importing this module stays cheap)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: a study on a headless worker must never need a display
    import matplotlib.pyplot as plt

    return plt


def palette_for(labels: Sequence[str]) -> dict[str, tuple]:
    """A colour per label in the given order (seaborn's default cycle, a wider one past ten labels).

    Pass it as ``palette`` to every figure of a study: a ratio plot that leaves the reference out would
    otherwise shift every other line to a different colour.
    """
    import seaborn as sns

    labels = list(dict.fromkeys(labels))
    colours = sns.color_palette(n_colors=len(labels)) if len(labels) <= 10 else sns.color_palette("husl", len(labels))
    return dict(zip(labels, colours))


def _plain_log_formatter():
    """Log-axis tick labels as plain numbers (27, 0.6), labelling minor ticks only where the axis spans less than
    a couple of decades (these axes often span less than one)."""
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:g}" if super().__call__(x, pos) else ""

    return PlainLogFormatter(base=10, labelOnlyBase=False, minor_thresholds=(2, 0.5))


def save_figure(figure: Figure, stem: str | Path, *, dpi: int = 150) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg`` (folders created as needed), close the figure, return the paths."""
    plt = _pyplot()
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    # The same figure gives the same bytes (an SVG without its date, its element ids from a fixed salt), so a
    # regenerated report whose numbers did not change leaves its tracked files, a campaign's among them,
    # unchanged.
    with plt.rc_context({"svg.hashsalt": "seqrec-study"}):
        for suffix in FORMATS:
            path = stem.with_suffix(f".{suffix}")
            figure.savefig(path, dpi=dpi, bbox_inches="tight", metadata={"Date": None} if suffix == "svg" else None)
            paths.append(path)
    plt.close(figure)
    return paths


def line_grid(data: pd.DataFrame, *, x: str, y: str, hue: str, col: str | None = None, row: str | None = None,
              logx: bool = False, logy: bool = False, base: int = 2, hline: float | None = None,
              title: str | None = None, xlabel: str | None = None, ylabel: str | None = None,
              hue_order: Sequence[str] | None = None, col_order: Sequence | None = None,
              row_order: Sequence | None = None, palette: dict | None = None, height: float = 3.6,
              aspect: float = 1.25) -> Figure:
    """Lines of ``y`` against ``x``, one per ``hue`` value, faceted by ``col`` and ``row``.

    Points are marked so a line with a single surviving point (e.g. a model that ran out of memory after its
    first length) is still visible. Log axes use ``base`` for ``x`` (lengths are usually powers of two) and
    base 10 for ``y``; ticks show plain values (``256``, ``0.6``) rather than powers.
    """
    if data.empty:
        raise ValueError("nothing to plot: the data frame is empty")
    _pyplot()
    import seaborn as sns
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    grid = sns.relplot(data=data, x=x, y=y, hue=hue, col=col, row=row, kind="line", marker="o", markersize=5,
                       hue_order=hue_order, col_order=col_order, row_order=row_order, palette=palette,
                       height=height, aspect=aspect,
                       facet_kws={"sharey": False, "sharex": True}, errorbar=None)
    for axis in grid.axes.flat:
        if logx:
            axis.set_xscale("log", base=base)
            ticks = sorted(data[x].dropna().unique())
            axis.set_xticks(ticks)
            axis.xaxis.set_major_formatter(ScalarFormatter())
            axis.xaxis.set_minor_formatter(NullFormatter())
            axis.tick_params(axis="x", labelrotation=45)
        if logy:
            axis.set_yscale("log")
            axis.yaxis.set_major_formatter(_plain_log_formatter())
            axis.yaxis.set_minor_formatter(_plain_log_formatter())
        if hline is not None:
            axis.axhline(hline, color="0.4", linestyle="--", linewidth=1, zorder=0)
        axis.grid(True, which="major", alpha=0.3)
    grid.set_axis_labels(xlabel or x, ylabel or y)
    if title:
        grid.figure.suptitle(title, y=1.02)
    return grid.figure


def loglog_lines(data: pd.DataFrame, *, x: str, y: str, hue: str, **kwargs) -> Figure:
    """Growth of ``y`` with ``x`` on log-log axes: a power law N^k is a straight line of slope k."""
    return line_grid(data, x=x, y=y, hue=hue, logx=True, logy=True, **kwargs)


def ratio_lines(data: pd.DataFrame, *, x: str, y: str, hue: str, **kwargs) -> Figure:
    """Ratios to a reference (``y`` = value / reference value) on log-log axes, with the parity line at 1."""
    return line_grid(data, x=x, y=y, hue=hue, logx=True, logy=True, hline=1.0, **kwargs)
