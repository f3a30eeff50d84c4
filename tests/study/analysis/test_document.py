"""The report document on hand-made results folders (no Ray): rounding, figures, layout, small samples, max_len.

Two studies (sasrec, gru4rec) of four configurations each, searched over seven keys, every configuration run
under seeds 0, 1, 2 (so the tests pair and have little power). The studies differ in ``max_len`` but share the
dataset hash, as they do once the prepared data no longer depends on ``max_len``.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from study import replicate as replicate_cli
from study import report as report_cli
from study.analysis import figures
from study.analysis.document import default_out, low_power_note
from study.analysis.render import TABLE_BOX_CLASS, WRAP_CLASS
from study.analysis.significance import POWERED_SEEDS, compare, minimum_detectable_effect
from study.analysis.tables import fmt, plain_value, results_table

SEARCH = {"hidden_size": {"choice": [16, 32]}, "lr": {"loguniform": [1e-4, 1e-2]},
          "dropout": {"uniform": [0.0, 0.5]}, "num_layers": {"int": [1, 4]}, "num_heads": {"choice": [1, 2]},
          "attention": {"choice": ["softmax", "linear"]}, "weight_decay": {"loguniform": [1e-6, 1e-3]}}
LONG_LR = 0.00031622776601683794  # what a loguniform sampler returns: 17 significant digits


def _configs() -> list[dict[str, Any]]:
    return [{"hidden_size": 16, "lr": LONG_LR, "dropout": 0.123456789, "num_layers": 1, "num_heads": 1,
             "attention": "softmax", "weight_decay": 1.2345678e-6},
            {"hidden_size": 32, "lr": 0.0012345678, "dropout": 0.2, "num_layers": 2, "num_heads": 2,
             "attention": "linear", "weight_decay": 3.3e-5},
            {"hidden_size": 16, "lr": 0.0087654321, "dropout": 0.35, "num_layers": 3, "num_heads": 2,
             "attention": "softmax", "weight_decay": 2.2e-4},
            {"hidden_size": 32, "lr": 0.0001, "dropout": 0.45, "num_layers": 4, "num_heads": 1,
             "attention": "linear", "weight_decay": 9.9e-4}]


def write_study(folder: Path, model: str, max_len: int, offset: float) -> Path:
    """A results folder as a sweep writes it: trials.parquet and study.yaml, 4 configurations x seeds 0-2."""
    rng = np.random.default_rng(len(model))
    rows = []
    for number, settings in enumerate(_configs()):
        for seed in range(3):
            config = {**settings, "max_len": max_len, "seed": seed}
            ndcg = offset + 0.01 * number + rng.normal(0, 0.003)
            rows.append({"trial_id": f"{model}-{number}-{seed}", "status": "ok", "model": model,
                         "study": folder.name, "seed": seed, "config": json.dumps(config),
                         **{f"config.{k}": v for k, v in config.items()},
                         "dataset": "lastfm", "dataset_hash": "same-data", "eval_mode": "full", "num_negatives": 0,
                         "negative_sampler": "", "mask_history": True, "objective": "causal",
                         "valid_ndcg@10": ndcg, "test_ndcg@10": ndcg * 0.9 + rng.normal(0, 0.002),
                         "peak_mem_mb": 100.0 + 37.123456 * number + offset * 100,
                         "infer_ms_p50": 2.0 + 0.7654321 * (3 - number), "stop_reason": "max_epochs"})
    folder.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(folder / "trials.parquet", index=False)
    (folder / "study.yaml").write_text(yaml.safe_dump({"name": folder.name, "model": model, "search": SEARCH,
                                                       "fixed": {"max_len": max_len}}))
    return folder


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both studies reported once, with plots; every figure is kept open for inspection before it is saved."""
    root = tmp_path_factory.mktemp("document")
    studies = [write_study(root / "lastfm-sasrec", "sasrec", 50, 0.10),
               write_study(root / "lastfm-gru4rec", "gru4rec", 200, 0.12)]
    drawn: dict[str, Any] = {}
    original = figures.save_figure

    def keep(figure: Any, stem: str | Path, **kwargs: Any) -> list[Path]:
        drawn[Path(stem).name] = {"axes": figure.axes, "legends": [[t.get_text() for t in ax.get_legend().get_texts()]
                                                                  for ax in figure.axes if ax.get_legend()]}
        return original(figure, stem, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEQREC_DATA", str(root / "cache"))
        patch.setattr(figures, "save_figure", keep)
        code = report_cli.main([str(p) for p in studies] + ["--metrics", "test_ndcg@10"])
    assert code == 0
    out = root / "report-lastfm-sasrec+lastfm-gru4rec"  # the default folder of several studies
    return {"out": out, "figures": drawn, "markdown": (out / "report.md").read_text(),
            "html": (out / "report.html").read_text()}


def test_numbers_have_at_most_four_significant_digits() -> None:
    assert [fmt(v) for v in (0.123456, 1.23456, 12.3456, 123.456, 1234.56, 1234567.8, 0.00123456, 1.23456e-7)] == \
        ["0.1235", "1.235", "12.35", "123.5", "1,235", "1,235,000", "0.001235", "1.235e-07"]
    assert fmt(1090) == "1,090" and fmt(np.int64(7)) == "7"  # counts are exact
    assert plain_value(LONG_LR) == "0.0003162" and plain_value(32.0) == "32" and plain_value("linear") == "linear"
    chosen = pd.DataFrame([{"label": "a", "name": "a-1", "n_seeds": 2, "m": 0.123456, "m_std": 0.0123456},
                           {"label": "b", "name": "b-1", "n_seeds": 2, "m": 0.1, "m_std": np.nan}])
    table, numbers, _ = results_table(chosen, ["m"], pd.DataFrame(), None, None)
    assert table["m"].tolist() == ["**0.1235** ± 0.0123", "0.1000", "+23.46%"]
    assert numbers["mean"].tolist() == [0.123456, 0.1]  # the files keep full precision


def test_report_tables_round_but_files_keep_full_precision(report: dict[str, Any]) -> None:
    markdown = report["markdown"]
    assert str(LONG_LR) not in markdown and "0.0003162" in markdown
    assert "0.123456789" not in markdown and "0.1235" in markdown
    configurations = pd.read_csv(report["out"] / "configurations.csv")
    assert LONG_LR in configurations["lr"].tolist()


def test_studies_with_different_max_len_compare_and_show_it(report: dict[str, Any]) -> None:
    markdown = report["markdown"]
    assert "MIXED PROTOCOLS" not in markdown
    selected = pd.read_parquet(report["out"] / "selected.parquet").set_index("label")
    assert selected.loc["sasrec", "max_len"] == 50 and selected.loc["gru4rec", "max_len"] == 200
    front = pd.read_parquet(report["out"] / "pareto_front.parquet")
    assert "max_len" in front
    protocol = markdown.split("## Studies and protocol")[1].split("## Dataset")[0]
    header = next(line for line in protocol.splitlines() if line.startswith("| study | dataset |"))
    assert "| max_len |" in header
    rows = [line for line in protocol.splitlines() if line.startswith("| lastfm-")]
    assert any("| 50 |" in row for row in rows) and any("| 200 |" in row for row in rows)


def test_every_searched_key_is_plotted_on_a_numeric_axis(report: dict[str, Any]) -> None:
    drawn = report["figures"]
    for model in ("sasrec", "gru4rec"):
        stems = sorted(s for s in drawn if s.startswith(f"hyperparameters_{model}"))
        assert stems == [f"hyperparameters_{model}", f"hyperparameters_{model}_2"]  # 7 keys: 6 + 1
        axes = [ax for stem in stems for ax in drawn[stem]["axes"] if ax.get_xlabel()]
        by_key = {ax.get_xlabel().removesuffix(" (log scale)"): ax for ax in axes}
        assert set(by_key) == set(SEARCH)
        for key in ("lr", "weight_decay"):  # log-searched
            assert by_key[key].get_xscale() == "log" and by_key[key].get_xlabel().endswith("(log scale)")
        for key in ("hidden_size", "dropout", "num_layers", "num_heads"):
            assert by_key[key].get_xscale() == "linear"
        # numeric: the axis spans the values themselves, not category positions 0 … k-1
        assert by_key["hidden_size"].get_xlim()[1] > 30
        # listed values (choice) are ticked each; sampled ones (uniform, loguniform) at a few round values
        assert visible_ticks(by_key["hidden_size"]) == ["16", "32"]
        assert visible_ticks(by_key["num_heads"]) == ["1", "2"]
        assert visible_ticks(by_key["dropout"]) == ["0.2", "0.3", "0.4"]
        assert visible_ticks(by_key["lr"]) == ["0.0001", "0.001", "0.01"]
        assert visible_ticks(by_key["attention"]) == ["linear", "softmax"]


def visible_ticks(ax: Any) -> list[str]:
    """The labels of an axis's major x ticks inside its limits (a locator also returns ticks just beyond)."""
    low, high = sorted(ax.get_xlim())
    return [label.get_text() for label, tick in zip(ax.get_xticklabels(), ax.get_xticks())
            if low <= tick <= high and label.get_text()]


def test_every_drawn_element_of_a_front_plot_is_in_its_legend(report: dict[str, Any]) -> None:
    pair_plots = {stem: info for stem, info in report["figures"].items() if stem.startswith("pareto_")}
    assert len(pair_plots) == 3
    own_fronts = 0
    for info in pair_plots.values():
        (legend,) = info["legends"]
        (ax,) = info["axes"]
        # a model's own front is drawn (dashed) where it has two points or more; one entry explains them all
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        own_fronts += len(dashed)
        expected = {"sasrec", "gru4rec", "Pareto front (all models)", "on the front (named)"}
        assert set(legend) == expected | ({"a model's own front (dashed, its colour)"} if dashed else set())
        assert ax.yaxis.get_major_formatter()(0.123456789, 0) == "0.1235"
    assert own_fronts >= 2


class _Layout(HTMLParser):
    """Each table's and image's parent element, and the page's CSS rules by selector."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[tuple[str, str]] = []  # (tag, class) of the elements enclosing the current position
        self.parents: dict[str, list[tuple[str, str]]] = {"table": [], "img": []}
        self.css = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.parents:
            self.parents[tag].append(self.open[-1])
        if tag not in ("img", "meta", "br"):  # void elements enclose nothing
            self.open.append((tag, dict(attrs).get("class") or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag not in ("img", "meta", "br"):
            assert self.open.pop()[0] == tag

    def handle_data(self, data: str) -> None:
        if self.open and self.open[-1][0] == "style":
            self.css += data

    def rule(self, selector: str) -> str:
        return dict(re.findall(r"([^{}]+)\{([^}]*)\}", self.css)).get(selector, "")


def test_tables_scroll_inside_the_page_and_images_fit_it(report: dict[str, Any]) -> None:
    # what tests/browser/report_check.py measures in Chromium at 1400 px rests on these: a table wider than the page
    # scrolls inside a box as wide as the page, and an image shrinks to the page's width
    layout = _Layout()
    layout.feed(report["html"])
    assert layout.open == []  # every element closed: the page parses as the browser will
    assert len(layout.parents["table"]) >= 8 and len(layout.parents["img"]) >= 5
    assert set(layout.parents["table"]) == {("div", TABLE_BOX_CLASS)}
    assert {"max-width:100%", "overflow-x:auto"} <= set(layout.rule(f".{TABLE_BOX_CLASS}").split(";"))
    assert set(layout.parents["img"]) == {("figure", "")}
    assert "max-width:100%" in layout.rule("img").split(";")
    # names, numbers and dates keep to one line; long text (the fronts' name lists) wraps at its spaces
    assert "white-space:nowrap" in layout.rule("th,td").split(";")
    assert "white-space:normal" in layout.rule(f"td.{WRAP_CLASS}").split(";")
    assert f'<td class="{WRAP_CLASS}">gru4rec-1, gru4rec-2' in report["html"]
    # text that could be wider than the page (long names, paths) breaks instead of overflowing
    assert "overflow-wrap:anywhere" in layout.rule("h1,h2,h3,p,li,figcaption")


def test_default_output_folder_joins_the_study_names_with_plus(tmp_path: Path) -> None:
    assert default_out([tmp_path / "a", tmp_path / "b"]) == tmp_path / "report-a+b"
    assert default_out([tmp_path / "a"]) == tmp_path / "a" / "report"


def test_minimum_detectable_effect_matches_power_tables_and_simulation() -> None:
    # G*Power / Cohen (1988): n = 5 pairs → d_z 1.68; 5 per group → d 2.02; 26 per group → d 0.79
    assert minimum_detectable_effect(5, 5, paired=True) == pytest.approx(1.682, abs=2e-3)
    assert minimum_detectable_effect(5, 5, paired=False) == pytest.approx(2.024, abs=2e-3)
    assert minimum_detectable_effect(26, 26, paired=False) == pytest.approx(0.792, abs=2e-3)
    assert np.isnan(minimum_detectable_effect(1, 1, paired=True))
    # at that effect, a paired t-test on 4 pairs rejects 80 % of the time
    effect = minimum_detectable_effect(4, 4, paired=True)
    differences = np.random.default_rng(0).normal(effect, 1.0, size=(20000, 4))
    rejected = stats.ttest_1samp(differences, 0.0, axis=1).pvalue < 0.05
    assert rejected.mean() == pytest.approx(0.8, abs=0.015)


def test_small_samples_mark_effects_unreliable_and_say_what_they_could_detect(report: dict[str, Any]) -> None:
    seeds = range(3)
    few = compare(pd.Series([0.30, 0.33, 0.31], index=seeds), pd.Series([0.20, 0.22, 0.23], index=seeds))
    assert few["test"] == "paired-t" and not few["effect_reliable"] and np.isnan(few["effect_ci_low"])
    assert few["mde"] == pytest.approx(minimum_detectable_effect(3, 3, paired=True))
    rng = np.random.default_rng(1)
    many = compare(pd.Series(rng.normal(1, 1, 8)), pd.Series(rng.normal(0, 1, 8)))
    assert many["effect_reliable"] and many["effect_ci_low"] < many["effect"] < many["effect_ci_high"]
    note = low_power_note(pd.DataFrame([{"candidate": "b", **few}]))
    assert "LOW POWER" in note and f"|d_z| ≥ {fmt(few['mde'])} (3 pairs)" in note
    assert low_power_note(pd.DataFrame([{"candidate": "b", **many}])) == ""
    section = report["markdown"].split("## Significance")[1].split("## Pareto fronts")[0]
    assert "LOW POWER" in section and f"fewer than {POWERED_SEEDS} seeds per side" in section
    assert f"(unreliable: n < {POWERED_SEEDS})" in section


def test_replicate_plan_shows_rounded_values() -> None:
    plan = [{"source_trial_id": "t1", "config_id": "abc", "name": "sasrec-1", "seed": seed,
             "config": {"lr": LONG_LR, "dropout": 0.123456789, "hidden_size": 32, "seed": seed}} for seed in (1, 2)]
    text = replicate_cli.describe(plan)
    assert "lr=0.0003162, dropout=0.1235, hidden_size=32" in text and "seeds 1, 2" in text
    assert str(LONG_LR) not in text


def test_studies_table_locates_each_results_folder_from_the_report(report: dict[str, Any]) -> None:
    studies = pd.read_csv(report["out"] / "studies.csv").set_index("study")
    for name in ("lastfm-sasrec", "lastfm-gru4rec"):
        folder = studies.loc[name, "folder"]
        assert not Path(folder).is_absolute()  # no one's home directory in a committed report
        assert (report["out"] / folder / "trials.parquet").is_file()


# ---------------------------------------------------------------------------------------------------------------
# A report of three studies: one fixed a key the others searched, one lacks a key, one was resumed twice and
# has a trial still running; two share a model, so their labels are model@study


def _rewrite(folder: Path, search: dict[str, Any], fixed: dict[str, Any], drop: tuple[str, ...] = ()) -> None:
    """Set ``fixed`` keys in every trial's config, drop the ``drop`` keys, add the table's other test metrics."""
    trials = pd.read_parquet(folder / "trials.parquet")
    configs = [{k: v for k, v in {**json.loads(c), **fixed}.items() if k not in drop} for c in trials["config"]]
    trials["config"] = [json.dumps(c) for c in configs]
    for key, value in fixed.items():
        trials[f"config.{key}"] = value
    trials = trials.drop(columns=[f"config.{k}" for k in drop])
    for metric, factor in (("hr@10", 2.0), ("mrr@10", 0.7), ("hr@20", 2.6), ("ndcg@20", 1.2), ("mrr@20", 0.75)):
        trials[f"test_{metric}"] = trials["test_ndcg@10"] * factor
    trials.to_parquet(folder / "trials.parquet", index=False)
    study = yaml.safe_load((folder / "study.yaml").read_text())
    (folder / "study.yaml").write_text(yaml.safe_dump({**study, "search": search, "fixed": {**study["fixed"],
                                                                                            **fixed}}))


SESSION_TIMES = ("2026-01-02T03:04:05+00:00", "2026-01-02T09:00:00+00:00", "2026-01-03T10:00:00+00:00")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mixed")
    elastic = write_study(root / "repro-lastfm-elastic", "elastic", 50, 0.10)
    _rewrite(elastic, {k: v for k, v in SEARCH.items() if k != "hidden_size"}, {"hidden_size": 64})
    gru_a = write_study(root / "repro-lastfm-gru4rec-with-a-long-study-name-for-its-first", "gru4rec", 50,
                        0.12)
    _rewrite(gru_a, {k: v for k, v in SEARCH.items() if k != "num_heads"}, {}, drop=("num_heads",))
    gru_b = write_study(root / "repro-lastfm-gru4rec-with-a-long-study-name-for-its-other", "gru4rec", 50,
                        0.11)
    _rewrite(gru_b, {k: v for k, v in SEARCH.items() if k != "num_heads"}, {}, drop=("num_heads",))
    # the first session's environment predates the record of torch's CPU kernels; the last two differ in them alone
    sessions = [{"recorded": t, "hardware": {"accelerator": a, "cpu_model": "EPYC", **kernels}}
                for t, a, kernels in zip(SESSION_TIMES, ("gpu", "cpu", "cpu"),
                                         ({}, {"cpu_kernels": "AVX512"}, {"cpu_kernels": "AVX2"}))]
    (elastic / "environment.json").write_text(json.dumps({**sessions[-1], "previous_sessions": sessions[:-1]}))
    (elastic / "trials").mkdir()
    (elastic / "trials" / "late_00099.history.jsonl").write_text(
        json.dumps({"epoch": 7, "best_epoch": 5, "best_valid_ndcg@10": 0.05, "wall_time_s": 90.0}) + "\n")
    out = root / "report"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEQREC_DATA", str(root / "cache"))
        capture = io.StringIO()
        with contextlib.redirect_stdout(capture):
            code = report_cli.main([str(elastic), str(gru_a), str(gru_b), "--out", str(out), "--no-plots"])
    assert code == 0
    return {"out": out, "markdown": (out / "report.md").read_text(), "console": capture.getvalue()}


def _section(markdown: str, heading: str) -> str:
    return markdown.split(f"## {heading}\n")[1].split("\n## ")[0]


def test_a_key_a_study_fixed_shows_its_value_and_a_key_its_model_lacks_a_dash(mixed: dict[str, Any]) -> None:
    selected = pd.read_parquet(mixed["out"] / "selected.parquet").set_index("label")
    assert selected.loc["elastic", "hidden_size"] == 64  # fixed in its study file: a value, not "–"
    assert selected.loc["elastic", "num_heads"] in (1, 2)  # searched by elastic only
    gru = [label for label in selected.index if label.startswith("gru4rec@")]
    assert len(gru) == 2 and selected.loc[gru, "num_heads"].isna().all()  # gru4rec has none
    chosen = _section(mixed["markdown"], "Results").split("Chosen configurations")[1]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in chosen.splitlines()
            if line.startswith("| ") and not line.startswith("|---")]
    table = pd.DataFrame(rows[1:], columns=rows[0]).set_index("label")
    assert table.loc["elastic", "hidden_size"] == "64" and table.loc["elastic", "num_heads"] in ("1", "2")
    assert (table.loc[gru, "num_heads"] == "–").all() and (table.loc[gru, "hidden_size"] != "–").all()


def test_the_environment_gives_when_a_resumed_study_started(mixed: dict[str, Any]) -> None:
    environment = pd.read_parquet(mixed["out"] / "environment.parquet").set_index("study")
    assert environment.loc["repro-lastfm-elastic", "started"] == SESSION_TIMES[0]
    assert environment.loc["repro-lastfm-elastic", "sessions"] == 3
    assert (environment.drop(index="repro-lastfm-elastic")["sessions"] == 1).all()
    section = _section(mixed["markdown"], "Environment")
    assert SESSION_TIMES[0] in section and "recorded" not in section
    assert (f"`repro-lastfm-elastic` (sweep) ran in 3 sessions: started {SESSION_TIMES[0]}, resumed "
            f"{SESSION_TIMES[1]}, {SESSION_TIMES[2]}") in section
    # kernels that round differently are another machine: a seed's figures differ under them
    assert "the sessions ran on gpu (EPYC); cpu (EPYC, AVX512); cpu (EPYC, AVX2)" in section
    assert environment.loc["repro-lastfm-elastic", "cpu"] == "EPYC, AVX2"  # the last session's


def test_a_study_still_running_is_reported_as_far_as_it_got(mixed: dict[str, Any]) -> None:
    markdown = mixed["markdown"]
    assert "STILL RUNNING: repro-lastfm-elastic has 1 trial(s) without a record yet (late_00099 at epoch 7)" in \
        markdown
    assert markdown.index("STILL RUNNING") < markdown.index("## Studies")
    studies = pd.read_parquet(mixed["out"] / "studies.parquet").set_index("study")
    assert studies["unfinished"].to_dict() == {name: int(name.endswith("elastic")) for name in studies.index}
    assert "still running: repro-lastfm-elastic: 1 trial(s) not finished (late_00099 at epoch 7)" in mixed["console"]


def test_the_console_tables_fit_120_columns(mixed: dict[str, Any]) -> None:
    lines = mixed["console"].splitlines()
    assert lines[0] == "results (mean ± std over n seeds; every column in results.csv; Improv.: best vs runner-up):"
    table = lines[1:next(i for i, line in enumerate(lines) if i and not line.startswith("  "))]
    assert len(table) == 5  # header, three models, the improvement: no column left off
    assert table[0].split() == ["model", "n", "HR@10", "NDCG@10", "MRR@10", "HR@20", "NDCG@20", "MRR@20"]
    assert all(len(line) <= 120 for line in lines if not line.startswith(("report:", "        ", "tables and")))
    # long model@study labels lose what their study names repeat
    assert [line.split()[0] for line in table[1:4]] == ["elastic", "gru4rec@first", "gru4rec@other"]
    assert table[1].split()[2].count("±") == 1  # mean±std, without the spaces the report has
