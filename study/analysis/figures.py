"""The report's figures: every objective pair with its fronts, and each model's hyperparameters against the objectives.

Each function draws from :class:`~study.analysis.tables.ParetoResult` and writes PNG + SVG through
:func:`study.analysis.plots.save_figure`; it returns ``(png path, caption)`` pairs for the document.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from study.analysis import pareto
from study.analysis.plots import save_figure
from study.analysis.tables import SIGNIFICANT_DIGITS, ParetoResult, pair_column, plain_value

MAX_FACET_KEYS = 6  # hyperparameter columns per figure; more keys continue in a further figure
MAX_TICKED_VALUES = 6  # a numeric key with at most this many values (a grid, a choice) is ticked at each value


def _save(fig: Any, out: Path, stem: str) -> Path:
    """PNG + SVG through the shared helper; the PNG is the one the HTML embeds."""
    return next(p for p in save_figure(fig, out / stem) if p.suffix == ".png")


def safe_name(text: str) -> str:
    """``text`` as a file name: anything but letters, digits and ``._+-`` becomes ``_`` (``+`` joins study names)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text)


def plot_pairs(result: ParetoResult, objectives: dict[str, str], out: Path) -> list[tuple[Path, str]]:
    """A scatter per objective pair, coloured by model, with the global 2-D front drawn and its points named;
    every drawn element (points, each model's dashed front, the global front and its rings) is in the legend."""
    import seaborn as sns

    plt = _pyplot()
    points = result.points
    labels = list(dict.fromkeys(points["label"]))
    palette = dict(zip(labels, sns.color_palette("colorblind", len(labels))))
    paths = []
    for a, b in result.pairs:
        data = points.dropna(subset=[a, b])
        fig, ax = plt.subplots(figsize=(6.4, 4.6))
        sns.scatterplot(data=data, x=a, y=b, hue="label", style="label", palette=palette, s=60, ax=ax, zorder=3)
        # The attainment boundary: after a front point the best reachable value of y stays until the next
        # point's x (x minimised: 'post'), or is already the next point's (x maximised: 'pre').
        where = "pre" if objectives[a] == "max" else "post"
        if len(labels) > 1:
            for label in labels:
                group = data[data["label"] == label]
                mask = pareto.non_dominated_mask(group[[a, b]].to_numpy(float), [objectives[a], objectives[b]])
                front = group[mask].sort_values(a)
                ax.step(front[a], front[b], where=where, color=palette[label], lw=1, ls="--", alpha=0.7, zorder=2,
                        label=f"{label}'s own front")
        front = data[data[pair_column(a, b)]].sort_values(a)
        ax.step(front[a], front[b], where=where, color="black", lw=1.6, zorder=4, label="Pareto front (all models)")
        ax.scatter(front[a], front[b], facecolors="none", edgecolors="black", s=140, lw=1.2, zorder=5,
                   label="on the front (named)")
        for _, row in front.iterrows():
            ax.annotate(row["name"], (row[a], row[b]), textcoords="offset points", xytext=(6, 6), fontsize=8,
                        zorder=6)
        ax.set_xlabel(f"{a} ({'higher' if objectives[a] == 'max' else 'lower'} is better)")
        ax.set_ylabel(f"{b} ({'higher' if objectives[b] == 'max' else 'lower'} is better)")
        ax.set_title(f"{b} vs {a}")
        ax.grid(alpha=0.3)
        _significant_ticks(ax)
        ax.legend(fontsize=8, loc="best")
        caption = (f"{b} against {a}: every configuration, the front over all models (black, named) and each "
                   "model's own front (dashed)")
        paths.append((_save(fig, out, f"pareto_{safe_name(a)}__{safe_name(b)}"), caption))
    return paths


def plot_hyperparameters(result: ParetoResult, objectives: dict[str, str], searched: dict[str, list[str]],
                         study_specs: dict[str, dict], out: Path) -> list[tuple[Path, str]]:
    """Per model: each searched hyperparameter (columns) against each objective (rows); front points in black.

    Every searched key with a value is drawn, :data:`MAX_FACET_KEYS` per figure (a second figure holds the
    rest). A numeric key is a numeric axis, logarithmic where the study searched it on a log scale; only
    non-numeric keys (names, booleans) are categories.
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
                if len(distinct) <= MAX_TICKED_VALUES:
                    ax.set_xticks(distinct)
                    ax.set_xticklabels([plain_value(v) for v in distinct], rotation=30)
                    ax.xaxis.set_minor_formatter(_null_formatter())
            _significant_ticks(ax)
            ax.set_xlabel((key + (" (log scale)" if log else "")) if row == len(names) - 1 else "")
            ax.set_ylabel(metric if col == 0 else "")
            ax.grid(alpha=0.3)
    fig.suptitle(f"{label}: hyperparameters against objectives\n(means over seeds; black = on {label}'s front)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _null_formatter() -> Any:
    from matplotlib.ticker import NullFormatter

    return NullFormatter()


def _significant_ticks(ax: Any) -> None:
    """Tick labels of linear numeric axes with at most SIGNIFICANT_DIGITS significant digits and no offset."""
    from matplotlib.ticker import FuncFormatter, ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "linear" and isinstance(axis.get_major_formatter(), ScalarFormatter):
            axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.{SIGNIFICANT_DIGITS}g}"))


def _sort_key(value: Any) -> tuple:
    return (0, float(value), "") if isinstance(value, (int, float, np.number)) else (1, 0.0, str(value))
