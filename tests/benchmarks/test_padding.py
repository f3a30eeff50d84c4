"""The padding benchmark on LastFM's real windows: both rows train; the trimmed row computes fewer positions and
fewer FLOPs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import padding
from study.errors import EXIT_USER_ERROR


def test_trimmed_row_computes_fewer_positions_and_more_of_them_are_items(
        shared_datasets: Path, prepared_cache: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SEQREC_DATA", str(prepared_cache))
    source = shared_datasets / "s3rec" / "LastFM.txt"
    assert padding.main(["--dataset", "lastfm", "--source", str(source), "--model", "sasrec", "--steps", "2",
                         "--rounds", "1", "--set", "num_layers=1"]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in ("full", "trimmed"):
            rows[cells[0]] = {"ms": float(cells[1]), "positions": int(cells[2].replace(",", "")),
                              "real": int(cells[3].rstrip("%")), "gflop": float(cells[5])}
    full, trimmed = rows["full"], rows["trimmed"]
    assert full["positions"] == round(50 * 1090 / 9)  # every batch at max_len: LastFM's 1,090 users in 9 batches
    assert trimmed["positions"] < 0.7 * full["positions"] and trimmed["real"] > full["real"]
    assert full["ms"] > 0 and trimmed["ms"] > 0
    assert 0 < trimmed["gflop"] < full["gflop"]  # the counted matrix products shrink with the positions


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_cuda_without_a_gpu_is_a_user_error_before_any_data_is_read(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-file.txt"  # never opened: the device is checked first
    assert padding.main(["--dataset", "lastfm", "--source", str(missing), "--device", "cuda"]) == EXIT_USER_ERROR
    assert "CUDA is not available" in capsys.readouterr().err
