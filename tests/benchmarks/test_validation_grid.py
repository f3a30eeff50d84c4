"""The validation grid: a study crossed with a grid, one run per cell, resumable, picked on validation."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks import validation_grid

REPRODUCTION = Path(__file__).resolve().parents[2] / "experiments" / "reproduction" / "studies"


def test_one_spelling_per_value() -> None:
    assert {validation_grid.canonical(v) for v in ("1e-3", "0.001", "1.0e-3", 0.001)} == {"0.001"}
    assert validation_grid.canonical("True") == validation_grid.canonical(True) == "true"
    assert validation_grid.canonical("4") == "4"
    assert validation_grid.canonical("sdpa") == "sdpa"


def test_a_grid_item_needs_a_key_and_values() -> None:
    assert validation_grid.parse_grid(["lr=1e-3, 2e-3", "mask_prob=0.2"]) == {"lr": ["1e-3", "2e-3"],
                                                                               "mask_prob": ["0.2"]}
    for bad in ("lr", "=1e-3", "lr="):
        with pytest.raises(ValueError, match="KEY=V1,V2"):
            validation_grid.parse_grid([bad])


def test_a_cell_is_its_whole_configuration_whatever_keys_named_it() -> None:
    _, model, _, settings = validation_grid.study_settings(REPRODUCTION / "bert4rec.yaml")
    plain = validation_grid.settings_text(model, {**settings, "seed": "1"})
    # the model's defaults, named or not, and another seed or device are the same cell
    assert validation_grid.settings_text(model, {**settings, "dropout": "0.1", "cloze_copies": "1", "lr": "1e-3",
                                                 "seed": "2", "device": "cuda"}) == plain
    assert "cloze_last_item_samples=false" in plain.split(";")
    assert "mask_prob=0.2" in plain.split(";")
    assert validation_grid.settings_text(model, {**settings, "mask_prob": "0.4"}) != plain


def test_rows_from_before_a_key_existed_join_the_cell_they_ran_as() -> None:
    def without(text: str, *keys: str) -> str:
        return ";".join(part for part in text.split(";") if part.split("=")[0] not in keys)

    _, model, _, settings = validation_grid.study_settings(REPRODUCTION / "sasrec.yaml")
    today = validation_grid.settings_text(model, {**settings, "seed": "1"})
    # a SASRec row written before compile_mode and cloze_window_step were trainer keys ran as today's defaults do
    older = without(today, "compile_mode", "cloze_window_step")
    assert older != today and validation_grid.same_cell(older, model) == today
    asked = today.replace("cloze_window_step=0", "cloze_window_step=None")
    assert validation_grid.same_cell(asked, model) == today
    graphs = today.replace("compile_mode=default", "compile_mode=reduce-overhead")
    assert validation_grid.same_cell(graphs, model) != today
    assert "output_bias" not in today  # BERT4Rec's key: not filled in for a model without it

    _, model, _, settings = validation_grid.study_settings(REPRODUCTION / "bert4rec-sliding-windows.yaml")
    sliding = validation_grid.settings_text(model, {**settings, "seed": "1"})
    assert "cloze_window_step=5" in sliding.split(";")  # 0.1 x max_len, whether the study names it or not
    unnamed = {key: value for key, value in settings.items() if key != "cloze_window_step"}
    assert validation_grid.settings_text(model, {**unnamed, "seed": "1"}) == sliding
    # a cloze row from before the key trained each user's newest window: another cell than the sliding windows
    assert "cloze_window_step=0" in validation_grid.same_cell(without(sliding, "cloze_window_step"), model).split(";")
    # a BERT4Rec row from before output_bias ran without the bias: the cell of a study that pins it off (the
    # newest-window study), never that of the whole-history study, which runs with it
    assert "output_bias=true" in sliding.split(";")
    assert "output_bias=false" in validation_grid.same_cell(without(sliding, "output_bias"), model).split(";")
    _, model, _, newest = validation_grid.study_settings(REPRODUCTION / "bert4rec.yaml")
    pinned = validation_grid.settings_text(model, {**newest, "seed": "1"})
    assert "output_bias=false" in pinned.split(";")
    assert validation_grid.same_cell(without(pinned, "output_bias"), model) == pinned
    biased = validation_grid.settings_text(model, {**newest, "output_bias": "true", "seed": "1"})
    assert biased != pinned and "output_bias=true" in biased.split(";")


def test_the_table_stars_the_best_validation_cell_and_shows_what_differs() -> None:
    def row(lr: str, seed: int, valid: float, test: float) -> dict[str, str]:
        return {"study": "sasrec", "model": "sasrec", "dataset": "ml-100k", "seed": str(seed),
                "valid_ndcg@10": str(valid), "test_ndcg@10": str(test), "best_epoch": "10", "epochs_run": "20",
                "settings": f"batch_size=128;lr={lr};max_len=50"}

    text = validation_grid.table([row("0.001", 1, 0.06, 0.03), row("0.001", 2, 0.04, 0.05),
                                  row("0.002", 1, 0.055, 0.06)])
    lines = text.splitlines()
    assert lines[0] == ("| study | dataset | lr | seeds | valid NDCG@10 | test NDCG@10 | best epoch | "
                        "epochs run |")  # batch_size and max_len are the same in every cell: not shown
    # 0.002 has the higher mean validation (0.055 > 0.050); the test column never chooses
    assert lines[2].startswith("| sasrec | ml-100k | 0.002 | 1 | 0.0550 ± 0.0000 * |")
    assert lines[3].startswith("| sasrec | ml-100k | 0.001 | 2 | 0.0500 ± 0.0141 |")


def test_a_grid_runs_each_cell_once_and_a_rerun_skips_them(tmp_path: Path, data_cache: Path,
                                                            synthetic_lastfm_file: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    study = tmp_path / "sasrec.yaml"
    study.write_text((REPRODUCTION / "sasrec.yaml").read_text().replace("max_epochs: 200", "max_epochs: 1"))
    out = tmp_path / "grid.csv"
    argv = [str(study), "--dataset", "lastfm", "--source", str(synthetic_lastfm_file), "--grid", "lr=1e-3,2e-3",
            "--device", "cpu", "--out", str(out)]
    assert validation_grid.main(argv) == 0
    with out.open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert sorted(row["lr"] for row in rows) == ["0.001", "0.002"]
    assert {row["epochs_run"] for row in rows} == {"1"}
    assert all("max_len=50" in row["settings"].split(";") and "objective=causal" in row["settings"].split(";")
               for row in rows)  # the study file's protocol and fixed keys, not the trainer's defaults
    assert validation_grid.main(argv) == 0
    assert "0 runs to do" in capsys.readouterr().out
    assert out.read_text().count("\n") == 3  # the header and the two rows, nothing appended
    # the same cell on a variant of the file, under its own label: run, not skipped for the recipe's row
    variant = [str(study), "--dataset", "lastfm", "--source", str(synthetic_lastfm_file), "--grid", "lr=1e-3",
               "--label", "lastfm-variant", "--device", "cpu", "--out", str(out)]
    assert validation_grid.main(variant) == 0
    assert "lastfm-variant: 1 runs to do" in capsys.readouterr().out
    with out.open(newline="") as file:
        assert sorted(row["dataset"] for row in csv.DictReader(file)) == ["lastfm", "lastfm", "lastfm-variant"]
    with pytest.raises(SystemExit):  # a label without its file would pass the recipe's data off as a variant
        validation_grid.main([str(study), "--grid", "lr=1e-3", "--label", "lastfm-variant", "--out", str(out)])
    with pytest.raises(SystemExit):
        validation_grid.main([str(study), "--grid", "patience=5", "--out", str(out)])
