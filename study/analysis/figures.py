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
from study.analysis.tables import ParetoResult, pair_column, plain_value

MAX_FACET_KEYS = 6


def _save(fig: Any, out: Path, stem: str) -> Path:
    """PNG + SVG through the shared helper; the PNG is the one the HTML embeds."""
    return next(p for p in save_figure(fig, out / stem) if p.suffix == ".png")


def safe_name(text: str) -> str:
    """``text`` as a file name: anything but letters, digits and ``._-`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def plot_pairs(result: ParetoResult, objectives: dict[str, str], out: Path) -> list[tuple[Path, str]]:
    """A scatter per objective pair, coloured by model, with the global 2-D front drawn and its points named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

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
                ax.step(front[a], front[b], where=where, color=palette[label], lw=1, ls="--", alpha=0.7, zorder=2)
        front = data[data[pair_column(a, b)]].sort_values(a)
        ax.step(front[a], front[b], where=where, color="black", lw=1.6, zorder=4, label="Pareto front (all models)")
        ax.scatter(front[a], front[b], facecolors="none", edgecolors="black", s=140, lw=1.2, zorder=5)
        for _, row in front.iterrows():
            ax.annotate(row["name"], (row[a], row[b]), textcoords="offset points", xytext=(6, 6), fontsize=8,
                        zorder=6)
        ax.set_xlabel(f"{a} ({'higher' if objectives[a] == 'max' else 'lower'} is better)")
        ax.set_ylabel(f"{b} ({'higher' if objectives[b] == 'max' else 'lower'} is better)")
        ax.set_title(f"{b} vs {a}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        caption = (f"{b} against {a}: every configuration, the front over all models (black, named) and each "
                   "model's own front (dashed)")
        paths.append((_save(fig, out, f"pareto_{safe_name(a)}__{safe_name(b)}"), caption))
    return paths


def plot_hyperparameters(result: ParetoResult, objectives: dict[str, str], searched: dict[str, list[str]],
                         study_specs: dict[str, dict], out: Path) -> list[tuple[Path, str]]:
    """Per model: each searched hyperparameter (columns) against each objective (rows); front points ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    paths = []
    for label, group in result.points.groupby("label", sort=False):
        keys = [k for k in searched.get(label, []) if k in group and group[k].notna().any()][:MAX_FACET_KEYS]
        if len(group) < 2 or not keys:
            continue
        names = list(objectives)
        fig, axes = plt.subplots(len(names), len(keys), figsize=(2.9 * len(keys) + 0.6, 2.3 * len(names) + 0.4),
                                 squeeze=False)
        spec = study_specs.get(label, {})
        for col, key in enumerate(keys):
            values = group[key]
            numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
            categorical = not numeric or values.nunique() <= 6
            log = isinstance(spec.get(key), dict) and ("loguniform" in spec[key] or spec[key].get("log"))
            for row, metric in enumerate(names):
                ax = axes[row][col]
                data = group.assign(**{key: values.map(plain_value) if categorical else values,
                                       "on front": group["on_model_front"]})
                if categorical:
                    order = [plain_value(v) for v in sorted(values.dropna().unique(), key=_sort_key)]
                    sns.stripplot(data=data, x=key, y=metric, hue="on front", order=order, ax=ax, size=6, jitter=0.15,
                                  palette={True: "black", False: "tab:blue"}, legend=row == 0 and col == 0)
                else:
                    sns.scatterplot(data=data, x=key, y=metric, hue="on front", ax=ax, s=30,
                                    palette={True: "black", False: "tab:blue"}, legend=row == 0 and col == 0)
                    if log:
                        ax.set_xscale("log")
                ax.set_xlabel(key if row == len(names) - 1 else "")
                ax.set_ylabel(metric if col == 0 else "")
                ax.grid(alpha=0.3)
        fig.suptitle(f"{label}: hyperparameters against objectives\n(means over seeds; black = on {label}'s front)",
                     fontsize=10)
        fig.tight_layout()
        paths.append((_save(fig, out, f"hyperparameters_{safe_name(label)}"),
                      f"{label}: searched hyperparameters against the objectives"))
    return paths


def _sort_key(value: Any) -> tuple:
    return (0, float(value), "") if isinstance(value, (int, float, np.number)) else (1, 0.0, str(value))
