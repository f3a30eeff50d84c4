"""The report's figures: every objective pair with its fronts, and each model's hyperparameters against the objectives.

Each function draws from :class:`~study.analysis.tables.ParetoResult` and writes PNG + SVG through
:func:`study.analysis.plots.save_figure`; it returns ``(png path, caption)`` pairs for the document.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from study.analysis import pareto
from study.analysis.plots import save_figure
from study.analysis.runs import short_labels
from study.analysis.tables import SIGNIFICANT_DIGITS, ParetoResult, pair_column, plain_value

MAX_FACET_KEYS = 6  # hyperparameter columns per figure; more keys continue in a further figure
LEGEND_ROWS = 18  # entries per legend column beside a front plot; more entries continue in a further column
RING_PT = 7  # radius, in points, of the ring around a point on the front (and the space its name keeps from it)
NEAR_OFFSETS = 4  # the first offsets of a name sit by its point; further ones get a line to it
MAX_TICKED_VALUES = 6  # a listed key (a grid, a choice) with at most this many values is ticked at each value
MAX_ROUND_TICKS = 5  # round ticks on any other numeric axis: labelling every sampled value smears them together
TICK_SIZE = 8  # points: the facets are small


def _save(fig: Any, out: Path, stem: str) -> Path:
    """PNG + SVG through the shared helper; the PNG is the one the HTML embeds."""
    return next(p for p in save_figure(fig, out / stem) if p.suffix == ".png")


def safe_name(text: str) -> str:
    """``text`` as a file name: anything but letters, digits and ``._+-`` becomes ``_`` (``+`` joins study names)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text)


def plot_pairs(result: ParetoResult, objectives: dict[str, str], out: Path) -> list[tuple[Path, str]]:
    """A scatter per objective pair, coloured by model, with the global 2-D front drawn and its points named.

    It stays readable with many studies: labels are shortened (:func:`~study.analysis.runs.short_labels`), the
    legend stands beside the axes in columns of :data:`LEGEND_ROWS` and the figure grows with it, and the models'
    own fronts (dashed, each in its model's colour, drawn where a model has two or more points on it) share one
    legend entry. Every drawn element is in the legend.
    """
    import seaborn as sns

    plt = _pyplot()
    short = short_labels(result.points["label"])
    points = result.points.assign(model=result.points["label"].map(short),
                                  shown_name=[short[label] + name[len(label):] if name.startswith(label) else name
                                              for label, name in zip(result.points["label"], result.points["name"])])
    labels = list(dict.fromkeys(points["model"]))
    palette = _palette(labels)
    paths = []
    for a, b in result.pairs:
        data = points.dropna(subset=[a, b])
        # The attainment boundary: after a front point the best reachable value of y stays until the next
        # point's x (x minimised: 'post'), or is already the next point's (x maximised: 'pre').
        where = "pre" if objectives[a] == "max" else "post"
        own = {label: _front(data[data["model"] == label], a, b, objectives) for label in labels} \
            if len(labels) > 1 else {}
        own = {label: front for label, front in own.items() if len(front) > 1}  # one point: no line to draw
        entries = len(labels) + bool(own) + 2
        columns = math.ceil(entries / LEGEND_ROWS)
        fig, ax = plt.subplots(figsize=(6.4, max(4.6, 0.2 * math.ceil(entries / columns) + 1.0)))
        sns.scatterplot(data=data, x=a, y=b, hue="model", style="model", palette=palette, s=60, ax=ax, zorder=3,
                        legend="full")
        for label, front in own.items():
            ax.step(front[a], front[b], where=where, color=palette[label], lw=1, ls="--", alpha=0.7, zorder=2)
        front = data[data[pair_column(a, b)]].sort_values(a)
        ax.step(front[a], front[b], where=where, color="black", lw=1.6, zorder=4, label="Pareto front (all models)")
        ax.scatter(front[a], front[b], facecolors="none", edgecolors="black", s=140, lw=1.2, zorder=5,
                   label="on the front (named)")
        _name_points(ax, front[a], front[b], front["shown_name"])
        ax.set_xlabel(f"{a} ({'higher' if objectives[a] == 'max' else 'lower'} is better)")
        ax.set_ylabel(f"{b} ({'higher' if objectives[b] == 'max' else 'lower'} is better)")
        ax.set_title(f"{b} vs {a}")
        ax.grid(alpha=0.3)
        _significant_ticks(ax)
        handles, names = ax.get_legend_handles_labels()
        if own:
            handles.append(_line(color="0.35", lw=1, ls="--"))
            names.append("a model's own front (dashed, its colour)")
        ax.legend(handles, names, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
                  ncol=columns, frameon=False)
        caption = f"{b} against {a}: every configuration, the front over all models (black, named)" + (
            " and each model's own front (dashed)" if own else "")
        paths.append((_save(fig, out, f"pareto_{safe_name(a)}__{safe_name(b)}"), caption))
    return paths


def _name_points(ax: Any, xs: Any, ys: Any, names: Any, size: float = 8) -> None:
    """Each point's name near it, inside the axes, printing over no other name and no named point's ring.

    Offsets are tried nearest first (:func:`_label_offsets`); a name moved away from its point gets a thin line to
    it. Where no offset is free, the name goes beside its point all the same. Extents are estimated in points
    from the text's length, which is close enough to keep names apart.
    """
    ax.get_xlim()  # settles the data limits, so that the transform below is the final one
    scale = ax.figure.dpi / 72  # display pixels per point
    frame = ax.get_window_extent()
    inside = (frame.x0 / scale, frame.y0 / scale, frame.x1 / scale, frame.y1 / scale)
    anchors = [ax.transData.transform((x, y)) / scale for x, y in zip(xs, ys)]
    taken = [(px - RING_PT, py - RING_PT, px + RING_PT, py + RING_PT) for px, py in anchors]

    def free(box: tuple[float, float, float, float]) -> bool:
        within = inside[0] <= box[0] and box[2] <= inside[2] and inside[1] <= box[1] and box[3] <= inside[3]
        return within and not any(box[0] < o[2] and o[0] < box[2] and box[1] < o[3] and o[1] < box[3] for o in taken)

    for (px, py), x, y, name in zip(anchors, xs, ys, names):
        width, height = 0.6 * size * len(name), 1.2 * size
        offsets = _label_offsets(width, height)
        boxes = [(px + dx, py + dy, px + dx + width, py + dy + height) for dx, dy in offsets]
        number = next((i for i, box in enumerate(boxes) if free(box)), 0)
        taken.append(boxes[number])
        leader = {"arrowprops": {"arrowstyle": "-", "lw": 0.5, "color": "0.45"}} if number >= NEAR_OFFSETS else {}
        ax.annotate(name, (x, y), textcoords="offset points", xytext=offsets[number], fontsize=size, zorder=6,
                    **leader)


def _label_offsets(width: float, height: float) -> list[tuple[float, float]]:
    """Where a name of ``width`` × ``height`` points may go, nearest first: the four corners beside its point's
    ring (:data:`NEAR_OFFSETS`), then further up and down on either side."""
    gap = RING_PT
    right, left, above, below = gap, -gap - width, gap * 0.5, -gap * 0.5 - height
    offsets = [(right, above), (right, below), (left, above), (left, below)]
    for step in range(1, 6):
        shift = step * (height + 2)
        offsets += [(right, above + shift), (right, below - shift), (left, above + shift), (left, below - shift)]
    return offsets


def _front(group: pd.DataFrame, a: str, b: str, objectives: dict[str, str]) -> pd.DataFrame:
    """The 2-D front of ``group`` over objectives ``a`` and ``b``, sorted along ``a``."""
    mask = pareto.non_dominated_mask(group[[a, b]].to_numpy(float), [objectives[a], objectives[b]])
    return group[mask].sort_values(a)


def _palette(labels: list[str]) -> dict[str, Any]:
    """A colour per label: the colour-blind palette up to its ten colours, evenly spaced hues past them (the
    palette's colours repeat after ten, and two models sharing colour and front would read as one)."""
    import seaborn as sns

    colours = sns.color_palette("colorblind", len(labels)) if len(labels) <= 10 else \
        sns.color_palette("husl", len(labels))
    return dict(zip(labels, colours))


def _line(**style: Any) -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], **style)


def plot_hyperparameters(result: ParetoResult, objectives: dict[str, str], searched: dict[str, list[str]],
                         study_specs: dict[str, dict], out: Path) -> list[tuple[Path, str]]:
    """Per model: each searched hyperparameter (columns) against each objective (rows); front points in black.

    Every searched key with a value is drawn, :data:`MAX_FACET_KEYS` per figure (a second figure holds the
    rest). A numeric key is a numeric axis, logarithmic where the study searched it on a log scale; only
    non-numeric keys (names, booleans) are categories, labelled with every value. A numeric axis is ticked at
    each value where the study listed its values (choice, grid: at most :data:`MAX_TICKED_VALUES`, and only while
    their labels do not overlap), else at a few round values (:func:`_round_ticks`).
    """
    paths = []
    for label, group in result.points.groupby("label", sort=False):
        keys = [k for k in searched.get(label, []) if k in group and group[k].notna().any()]
        if len(group) < 2 or not keys:
            continue
        spec = study_specs.get(label, {})
        chunks = [keys[i:i + MAX_FACET_KEYS] for i in range(0, len(keys), MAX_FACET_KEYS)]
        for number, chunk in enumerate(chunks, start=1):
            fig = _hyperparameter_grid(label, group, chunk, list(objectives), spec)
            stem = f"hyperparameters_{safe_name(label)}" + (f"_{number}" if number > 1 else "")
            part = f" (part {number} of {len(chunks)})" if len(chunks) > 1 else ""
            paths.append((_save(fig, out, stem), f"{label}: searched hyperparameters against the objectives{part}"))
    return paths


def numeric_values(values: pd.Series) -> pd.Series | None:
    """``values`` as floats when every present value is a number (not a bool), else None (a categorical key)."""
    present = values.dropna()
    if present.empty or any(isinstance(v, (bool, np.bool_)) for v in present):
        return None
    converted = pd.to_numeric(present, errors="coerce")
    if converted.isna().any():
        return None
    return pd.to_numeric(values, errors="coerce").astype(float)


def is_log_searched(spec: Any) -> bool:
    """Whether a study's search entry samples on a log scale (``loguniform``, or an int range with ``log: true``)."""
    return isinstance(spec, dict) and ("loguniform" in spec or bool(spec.get("log")))


def _hyperparameter_grid(label: str, group: pd.DataFrame, keys: list[str], names: list[str],
                         spec: dict[str, Any]) -> Any:
    import seaborn as sns

    plt = _pyplot()
    fig, axes = plt.subplots(len(names), len(keys), figsize=(2.9 * len(keys) + 0.6, 2.3 * len(names) + 0.4),
                             squeeze=False)
    palette = {True: "black", False: "tab:blue"}
    ticked = []  # (axis, values, log) of the axes ticked at each value: checked for crowding once drawn
    for col, key in enumerate(keys):
        numbers = numeric_values(group[key])
        log = numbers is not None and is_log_searched(spec.get(key)) and bool((numbers.dropna() > 0).all())
        for row, metric in enumerate(names):
            ax = axes[row][col]
            first = row == 0 and col == 0
            if numbers is None:
                values = group[key]
                order = [plain_value(v) for v in sorted(values.dropna().unique(), key=_sort_key)]
                data = group.assign(**{key: values.map(plain_value), "on front": group["on_model_front"]})
                sns.stripplot(data=data, x=key, y=metric, hue="on front", order=order, ax=ax, size=6, jitter=0.15,
                              palette=palette, legend=first)
            else:
                data = group.assign(**{key: numbers, "on front": group["on_model_front"]})
                sns.scatterplot(data=data, x=key, y=metric, hue="on front", ax=ax, s=30, palette=palette,
                                legend=first)
                if log:
                    ax.set_xscale("log")
                distinct = sorted(numbers.dropna().unique())
                if _is_listed(spec.get(key)) and len(distinct) <= MAX_TICKED_VALUES:
                    _value_ticks(ax, distinct)
                    ticked.append((ax, distinct, log))
                else:
                    _round_ticks(ax, log)
            _significant_ticks(ax)
            ax.tick_params(axis="both", labelsize=TICK_SIZE)
            ax.set_xlabel((key + (" (log scale)" if log else "")) if row == len(names) - 1 else "")
            ax.set_ylabel(metric if col == 0 else "")
            ax.grid(alpha=0.3)
    fig.suptitle(f"{label}: hyperparameters against objectives\n(means over seeds; black = on {label}'s front)",
                 fontsize=10)
    fig.tight_layout()
    if ticked:
        fig.canvas.draw()  # places the tick labels, so their extents can be compared
        crowded = [(ax, log) for ax, _, log in ticked if labels_overlap(ax)]
        for ax, log in crowded:
            _round_ticks(ax, log)
            _significant_ticks(ax)
        if crowded:
            fig.tight_layout()
    return fig


def _is_listed(spec: Any) -> bool:
    """Whether a study's search entry lists its values (``choice``/``grid``), or is unknown (no study file): such a
    key is ticked at each value; a sampled one (``uniform``, ``loguniform``, ``int``) gets round ticks."""
    return not isinstance(spec, dict) or "choice" in spec or "grid" in spec


def _value_ticks(ax: Any, values: list[float]) -> None:
    """Ticks at each listed value, labelled as the study file writes it."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.set_xticklabels([plain_value(v) for v in values], rotation=30)
    ax.xaxis.set_minor_formatter(NullFormatter())


def _round_ticks(ax: Any, log: bool) -> None:
    """At most :data:`MAX_ROUND_TICKS` round ticks over the axis's range: 1, 2 or 5 × a power of ten on a log axis
    (:func:`log_ticks`), matplotlib's MaxNLocator on a linear one; minor ticks stay unlabelled."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

    low, high = sorted(ax.get_xlim())
    ticks = log_ticks(low, high) if log else []
    locator = FixedLocator(ticks) if ticks else MaxNLocator(nbins=MAX_ROUND_TICKS - 1, steps=[1, 2, 2.5, 5, 10],
                                                            min_n_ticks=2)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: plain_value(value)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelrotation=30)


def log_ticks(low: float, high: float) -> list[float]:
    """Between 2 and :data:`MAX_ROUND_TICKS` round values in ``[low, high]`` (``low > 0``): powers of ten (every
    k-th over many decades), else 1, 2 and 5 times them, else 1 to 9 times them; none where even those are too
    sparse (a range within one step), and the caller falls back to linear ticks."""
    exponents = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    for subs in ((1,), (1, 2, 5), tuple(range(1, 10))):
        ticks = [float(f"{s * 10.0 ** e:.12g}") for e in exponents for s in subs if low <= s * 10.0 ** e <= high]
        if len(ticks) > MAX_ROUND_TICKS:
            ticks = ticks[::math.ceil(len(ticks) / MAX_ROUND_TICKS)]
        if len(ticks) >= 2:
            return ticks
    return []


def labels_overlap(ax: Any) -> bool:
    """Whether any two of the axis's drawn x tick labels overlap (their extents, as last drawn)."""
    low, high = sorted(ax.get_xlim())
    boxes = sorted((label.get_window_extent() for label, tick in zip(ax.get_xticklabels(), ax.get_xticks())
                    if label.get_text() and low <= tick <= high), key=lambda box: box.x0)
    return any(first.x1 > second.x0 and first.y1 > second.y0 and second.y1 > first.y0
               for first, second in zip(boxes, boxes[1:]))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _significant_ticks(ax: Any) -> None:
    """Tick labels of linear numeric axes with at most SIGNIFICANT_DIGITS significant digits and no offset."""
    from matplotlib.ticker import FuncFormatter, ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "linear" and isinstance(axis.get_major_formatter(), ScalarFormatter):
            axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.{SIGNIFICANT_DIGITS}g}"))


def _sort_key(value: Any) -> tuple:
    return (0, float(value), "") if isinstance(value, (int, float, np.number)) else (1, 0.0, str(value))
