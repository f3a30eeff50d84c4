"""The report's figures stay readable: hyperparameter axes with crowded sampled values, and front plots of 30
studies (short labels, the legend beside the axes, the title clear of it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from study.analysis import figures
from study.analysis.runs import short_labels
from study.analysis.tables import analyse_pareto

OBJECTIVES = {"valid_ndcg@10": "max", "peak_mem_mb": "min"}


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every figure the functions save, by file stem, kept open for inspection (saving draws it first)."""
    kept: dict[str, Any] = {}
    original = figures.save_figure

    def keep(figure: Any, stem: str | Path, **kwargs: Any) -> list[Path]:
        kept[Path(stem).name] = figure
        return original(figure, stem, **kwargs)

    monkeypatch.setattr(figures, "save_figure", keep)
    return kept


def _points(labels: list[str], per_label: int, **columns: list[Any]) -> pd.DataFrame:
    """Configurations of each label with objectives from a fixed random generator, and the given columns."""
    rng = np.random.default_rng(0)
    rows = []
    for label in labels:
        for number in range(per_label):
            rows.append({"label": label, "name": f"{label}-{number + 1}", "config_id": f"{label}{number}",
                         "valid_ndcg@10": rng.uniform(0.03, 0.08), "peak_mem_mb": rng.uniform(60, 500),
                         **{key: values[number] for key, values in columns.items()}})
    return pd.DataFrame(rows)


def _visible(ax: Any) -> list[str]:
    low, high = sorted(ax.get_xlim())
    return [label.get_text() for label, tick in zip(ax.get_xticklabels(), ax.get_xticks())
            if low <= tick <= high and label.get_text()]


def test_hyperparameter_axes_of_crowded_values_get_readable_ticks(tmp_path: Path, drawn: dict[str, Any]) -> None:
    # values close together: a tick at each would print its labels over each other
    points = _points(["sasrec"], 5, dropout=[0.10, 0.11, 0.12, 0.13, 0.40],
                     lr=[1.0e-4, 1.1e-4, 1.2e-4, 1.3e-4, 5.0e-3], hidden_size=[16, 17, 18, 19, 256],
                     num_heads=[1, 2, 4, 8, 8], attention=["softmax", "linear", "softmax", "linear", "softmax"])
    result = analyse_pareto(points, OBJECTIVES, None, 0.1)
    spec = {"dropout": {"uniform": [0.0, 0.5]}, "lr": {"loguniform": [1e-4, 1e-2]},
            "hidden_size": {"choice": [16, 17, 18, 19, 256]}, "num_heads": {"choice": [1, 2, 4, 8]},
            "attention": {"choice": ["softmax", "linear"]}}
    paths = figures.plot_hyperparameters(result, OBJECTIVES, {"sasrec": list(spec)}, {"sasrec": spec}, tmp_path)
    assert [p.name for p, _ in paths] == ["hyperparameters_sasrec.png"]
    axes = {ax.get_xlabel().removesuffix(" (log scale)"): ax for ax in drawn["hyperparameters_sasrec"].axes
            if ax.get_xlabel()}
    for key, ax in axes.items():
        assert not figures.labels_overlap(ax), (key, _visible(ax))
        assert not any(label.get_text() for label in ax.get_xticklabels(minor=True)), key  # minor ticks: unlabelled
        if key != "attention":
            assert 2 <= len(_visible(ax)) <= figures.MAX_ROUND_TICKS, (key, _visible(ax))
    assert _visible(axes["lr"]) == ["0.0001", "0.001"]  # round values on the log axis, not the sampled ones
    assert "0.11" not in _visible(axes["dropout"]) and "17" not in _visible(axes["hidden_size"])
    assert _visible(axes["num_heads"]) == ["1", "2", "4", "8"]  # a listed key with room keeps a tick per value
    assert _visible(axes["attention"]) == ["linear", "softmax"]  # categories keep their labels


def test_log_ticks_are_round_and_few() -> None:
    assert figures.log_ticks(8e-5, 1.2e-2) == [1e-4, 1e-3, 1e-2]
    assert figures.log_ticks(2.5e-4, 1.1e-3) == [5e-4, 1e-3]
    assert figures.log_ticks(1e-9, 1.0) == [1e-9, 1e-7, 1e-5, 1e-3, 1e-1]  # every other power over 10 decades
    assert figures.log_ticks(1.2e-3, 1.25e-3) == []  # within one step: the caller falls back to linear ticks


def test_short_labels_drop_what_the_study_names_repeat() -> None:
    labels = ["bert4rec@repro-ml100k-bert4rec", "bert4rec@repro-ml100k-bert4rec-long", "fpmc",
              "lisa@repro-ml100k-lisa-base", "lisa@repro-ml100k-lisa-soft", "sasrec@repro-ml100k-sasrec",
              "sasrec@repro-ml100k-baseline"]
    assert list(short_labels(labels).values()) == ["bert4rec", "bert4rec-long", "fpmc", "lisa-base", "lisa-soft",
                                                   "sasrec", "sasrec@baseline"]
    # a shortening that would make two labels read the same is not made
    assert short_labels(["a@x-a", "a@y-a"]) == {"a@x-a": "a@x-a", "a@y-a": "a@y-a"}


def test_a_front_plot_of_thirty_studies_keeps_its_legend_beside_the_axes(tmp_path: Path,
                                                                         drawn: dict[str, Any]) -> None:
    labels = [f"{model}@repro-ml100k-{model}{suffix}" for model in ("sasrec", "bert4rec", "elastic", "lisa", "hstu")
              for suffix in ("", "-long", "-mini", "-soft", "-w16", "-last")]
    result = analyse_pareto(_points(labels, 2), OBJECTIVES, None, 0.1)
    (path, _), = figures.plot_pairs(result, OBJECTIVES, tmp_path)
    assert path.name == "pareto_valid_ndcg@10__peak_mem_mb.png".replace("@", "_") and path.stat().st_size > 1000
    fig = drawn[path.stem]
    (ax,) = fig.axes
    legend = ax.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert len(labels) < len(texts) <= len(labels) + 3  # one entry per study, the fronts share three
    assert "sasrec" in texts and "lisa-w16" in texts and not any("@repro-ml100k-" in t for t in texts)
    annotations = [child.get_text() for child in ax.texts]
    assert annotations and not any("@repro-ml100k-" in t for t in annotations)  # front points by short name
    FigureCanvasAgg(fig).draw()  # saved and closed: drawn again on a canvas of its own to measure it
    renderer = fig.canvas.get_renderer()
    frame, box, title = ax.get_window_extent(renderer), legend.get_window_extent(renderer), \
        ax.title.get_window_extent(renderer)
    assert box.x0 >= frame.x1  # beside the axes, covering none of them
    assert not box.overlaps(title)
    figure_box = fig.bbox
    assert box.y0 >= figure_box.y0 - 1 and box.y1 <= figure_box.y1 + 1  # the figure is tall enough to hold it
    names = [Text.get_window_extent(text, renderer) for text in ax.texts]  # the text alone, not its leader line
    assert not any(one.overlaps(other) for i, one in enumerate(names) for other in names[i + 1:])
    assert all(frame.x0 <= name.x0 and name.x1 <= frame.x1 for name in names)  # front names stay inside the axes
