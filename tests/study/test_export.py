"""``python -m study.export`` says which trial it exported: its id, the study's selection metric at the kept epoch,
and why that trial (the study's best, or the one given with --trial). Without Ray or training: the choice and the
folder are stood in for; tests/study/test_export_recommend.py runs the command on a real study."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from study import export

STUDY = {"name": "tiny", "objectives": {"peak_mem_mb": "min", "valid_hit@10": "max"}}


def _fake_folder(out: Path, trial_id: str) -> Path:
    out.mkdir(parents=True)
    info = {"trial_id": trial_id, "study": STUDY["name"], "best_epoch": 3, "epoch": 3,
            "best_valid": {"hit@10": 0.123456, "ndcg@10": 0.05}, "best_test": {"hit@10": 0.1}}
    (out / "model.json").write_text(json.dumps(info))
    return out


@pytest.mark.parametrize("given", [None, "0f1e2d3c"])
def test_the_export_line_names_the_trial_its_metric_and_epoch(given: str | None, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    chosen: dict[str, Any] = {}

    def choose(study_dir: Path, trial: str | None) -> tuple[str, dict[str, Any]]:
        chosen["trial"] = trial
        return trial or "a1b2c3d4", STUDY

    monkeypatch.setattr(export, "choose_trial", choose)
    monkeypatch.setattr(export, "write_export", lambda study_dir, out, trial_id, study: _fake_folder(out, trial_id))
    argv = ["results/tiny", str(tmp_path / "model")] + (["--trial", given] if given else ["--best"])
    assert export.main(argv) == 0
    line = capsys.readouterr().out.strip()
    trial = given or "a1b2c3d4"
    why = "chosen with --trial" if given else "the best on valid_hit@10"
    # the study's first validation objective (not the first objective, not ndcg@10), at the kept epoch
    assert line == (f"exported trial {trial} of study tiny ({why}): valid_hit@10 0.1235 at epoch 3, "
                    f"to {tmp_path / 'model'}")
    assert chosen["trial"] == given


def test_the_export_line_says_when_the_metric_is_missing(tmp_path: Path) -> None:
    out = _fake_folder(tmp_path / "model", "a1b2c3d4")
    line = export.describe_export(out, "valid_mrr@10", chosen=False)
    assert "trial a1b2c3d4" in line and "valid_mrr@10 n/a at epoch 3" in line
