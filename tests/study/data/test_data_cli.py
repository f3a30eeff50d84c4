"""``python -m study.data`` in a subprocess: the statistics table, ``list``, one-line errors with exit 2."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def run_cli(*args: str, cache: Path, movielens_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SEQREC_DATA": str(cache), "PYTHONPATH": str(REPO), "no_proxy": "127.0.0.1"}
    env.pop("SEQREC_MOVIELENS_URL", None)
    if movielens_url:
        env["SEQREC_MOVIELENS_URL"] = movielens_url
    return subprocess.run(
        [sys.executable, "-m", "study.data", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_prepare_prints_statistics_and_list_shows_it(synthetic_lastfm_file: Path, tmp_path: Path) -> None:
    from study.data.readers import read_s3rec

    cache = tmp_path / "cache"
    done = run_cli("prepare", "lastfm", "--source", str(synthetic_lastfm_file), cache=cache)
    assert done.returncode == 0, done.stderr
    table = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in done.stdout.splitlines())
    frame = read_s3rec(synthetic_lastfm_file)  # the statistics, counted apart
    lengths = frame.groupby("user").size()
    assert (table["users"], table["items"], table["interactions"]) == (
        f"{frame['user'].nunique():,}", f"{frame['item'].nunique():,}", f"{len(frame):,}")
    assert (table["length mean"], table["length median"], table["length max"]) == (
        f"{lengths.mean():.1f}", f"{lengths.median():g}", f"{lengths.max():,}")
    assert table["output"].startswith(str(cache / "prepared" / "lastfm-"))
    listed = run_cli("list", cache=cache)
    assert listed.returncode == 0 and "ml-100k" in listed.stdout and "synthetic" in listed.stdout
    assert Path(table["output"]).name in listed.stdout
    assert "options" not in listed.stdout  # LastFM's recipe takes none


def test_list_shows_the_columns_a_table_was_read_with(tmp_path: Path) -> None:
    """A request by name reads the table with these columns again, so the list says which they are."""
    cache, table = tmp_path / "cache", tmp_path / "events.csv"
    table.write_text("who,what\n" + "".join(f"{user},{item}\n" for user in (1, 2, 3) for item in (4, 5, 6, 7)))
    done = run_cli("prepare", "csv", "--source", str(table), "--user-col", "who", "--item-col", "what",
                   "--time-col", "none", cache=cache)
    assert done.returncode == 0, done.stderr
    listed = " ".join(run_cli("list", cache=cache).stdout.split())  # unwrapped
    assert "options user_col=who, item_col=what, time_col=none" in listed


def _bad_zip(tmp: Path) -> Path:
    path = tmp / "ml-100k.zip"
    path.write_bytes(b"PK\x03\x04 this is not really a zip archive")
    return path


def _zip_without_ratings(tmp: Path) -> Path:
    path = tmp / "movies.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("ml-100k/README", "no ratings here")
    return path


def _bad_line(tmp: Path) -> Path:
    path = tmp / "u.data"
    path.write_text("1\t10\t5\t881250949\n1\t11\t3\t881250950\n2\tabc\t4\t881250951\n")
    return path


def _bad_token(tmp: Path) -> Path:
    path = tmp / "LastFM.txt"
    path.write_text("1 1 2 3\n2 2 3 4\n3 1 9x4 2\n")
    return path


def _tiny_udata(tmp: Path) -> Path:
    path = tmp / "tiny" / "u.data"
    path.parent.mkdir()
    path.write_text("".join(f"{u}\t{i}\t4\t{100 * u + i}\n" for u in range(1, 4) for i in range(1, 4)))
    return path


CASES = {
    "unknown name": (
        lambda tmp: ["prepare", "ml-2m"],
        r"unknown dataset 'ml-2m'; known datasets: ml-100k, ml-1m",
    ),
    "missing file": (
        lambda tmp: ["prepare", "ml-100k", "--source", str(tmp / "nowhere.zip")],
        r"source not found: .*nowhere\.zip",
    ),
    "corrupt zip": (
        lambda tmp: ["prepare", "ml-100k", "--source", str(_bad_zip(tmp))],
        r"ml-100k\.zip: not a valid zip archive",
    ),
    "zip without ratings": (
        lambda tmp: ["prepare", "ml-1m", "--source", str(_zip_without_ratings(tmp))],
        r"movies\.zip: no u\.data / ratings\.dat / ratings\.csv / \*\.inter inside this zip",
    ),
    "unparsable line": (
        lambda tmp: ["prepare", "ml-100k", "--source", str(_bad_line(tmp))],
        r"u\.data, line 3: field 2 should be an integer",
    ),
    "bad token": (
        lambda tmp: ["prepare", "lastfm", "--source", str(_bad_token(tmp))],
        r"LastFM\.txt, line 3: field 3 should be an integer .*got '9x4'$",
    ),
    "empty after k-core": (
        lambda tmp: ["prepare", "ml-100k", "--source", str(_tiny_udata(tmp))],
        r"dataset 'ml-100k' is empty after the 5-core filter .* use a smaller --kcore",
    ),
    "max_len < 2": (
        lambda tmp: ["prepare", "synthetic", "--max-len", "1"],
        r"max_len must be an integer of at least 2",
    ),
    "needs --source": (
        lambda tmp: ["prepare", "video"],
        r"dataset 'video' needs --source PATH: one interaction per",
    ),
    "wrong option": (
        lambda tmp: ["prepare", "synthetic", "--param", "colour=red"],
        r"synthetic: unknown parameter 'colour'",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2(case: str, tmp_path: Path) -> None:
    make_args, pattern = CASES[case]
    cache = tmp_path / "cache"
    done = run_cli(*make_args(tmp_path), cache=cache)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    assert re.search(pattern, lines[0]), lines[0]
    # nothing in the cache: no prepared directory, no kept copy of the source, no download
    assert [path for path in cache.rglob("*") if path.is_file()] == []


def test_download_failure_via_cli(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = run_cli(
        "prepare", "ml-1m", "--quiet", cache=tmp_path / "cache", movielens_url=f"http://127.0.0.1:{port}"
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: download of http://127.0.0.1:{port}/ml-1m.zip failed: ")
    assert "--source PATH" in line


def test_list_fits_120_columns(tmp_path: Path, data_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``list`` wraps the recipes' descriptions and shortens long paths in the middle: no line over 120 columns,
    and nothing that says what a dataset is goes missing."""
    from study.data import RECIPES, prepare
    from study.data.__main__ import main

    deep = tmp_path.joinpath(*[f"a-rather-long-folder-name-number-{n}" for n in range(6)])
    deep.mkdir(parents=True)
    source = _tiny_udata(deep)
    prepared = prepare("ml-100k", source=source, kcore=0, progress=False)  # kept in the cache: a second path
    assert len(str(source)) > 200
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120, out
    words = " ".join(out.split())
    for recipe in RECIPES.values():
        assert " ".join(recipe.description.split()) in words, recipe.name
    assert prepared.name in out and "u.data" in out and "kept in the cache: <cache>/sources/ml-100k/" in out
    source_line = next(line for line in out.splitlines() if line.lstrip().startswith("source: "))
    assert source_line.endswith("/tiny/u.data") and str(tmp_path)[:10] in source_line and "..." in source_line
