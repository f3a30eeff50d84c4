"""The Ray engine (``engine="ray"``) writes the dataset the pandas engine writes: same meta.json statistics, id
maps, sequences and train/valid/test windows, on generated data, on sharded CSV with timestamp ties and text ids,
and on real MovieLens-100K."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import study.data.ray_engine as ray_engine
from study.data import load_prepared, prepare
from study.data.__main__ import main
from study.errors import UserError

SHARED_ML100K = Path(__file__).resolve().parents[3].parent / "shared" / "datasets" / "ml-100k" / "ml-100k.inter"


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}})
    yield
    ray.shutdown()


def _prepare_with(engine: str, cache: Path, monkeypatch: pytest.MonkeyPatch, name: str, **kwargs) -> Path:
    monkeypatch.setenv("SEQREC_DATA", str(cache / engine))
    return prepare(name, engine=engine, progress=False, **kwargs)


def assert_same_dataset(pandas_dir: Path, ray_dir: Path) -> None:
    """Row for row and byte for byte where the layouts allow: meta.json (less its creation time and cache
    paths), the item id map, every sequences column, and the arrays every consumer loads."""
    assert pandas_dir.name == ray_dir.name  # the engine is not part of the dataset's identity
    assert (pandas_dir / "sequences.parquet").is_file() and (ray_dir / "sequences.parquet").is_dir()
    metas = [json.loads((d / "meta.json").read_text()) for d in (pandas_dir, ray_dir)]
    for meta in metas:
        meta.pop("created")
        meta["source"].pop("kept", None)  # where each cache keeps its copy of a downloadable recipe's source
    assert metas[0] == metas[1]
    assert (pandas_dir / "items.parquet").read_bytes() == (ray_dir / "items.parquet").read_bytes()
    expected, got = (pq.read_table(d / "sequences.parquet") for d in (pandas_dir, ray_dir))
    assert got.schema.equals(expected.schema)
    assert got.equals(expected)
    loaded = [load_prepared(d) for d in (pandas_dir, ray_dir)]
    for field in ("train", "valid", "test", "history_indptr", "history_indices", "raw_users"):
        np.testing.assert_array_equal(getattr(loaded[1], field), getattr(loaded[0], field))


def test_synthetic_kcore_over_several_parts_and_widening(ray_local, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_engine, "ROWS_PER_PART", 1500)  # several user ranges, so several parts
    options = {"users": 400, "items": 900, "length": 12, "seed": 3, "kcore": 5, "max_len": 8}
    pandas_dir = _prepare_with("pandas", tmp_path, monkeypatch, "synthetic", **options)
    ray_dir = _prepare_with("ray", tmp_path, monkeypatch, "synthetic", **options)
    meta = json.loads((ray_dir / "meta.json").read_text())
    assert meta["num_interactions"] < meta["raw"]["interactions"]  # the 5-core removed rows
    assert len(list((ray_dir / "sequences.parquet").glob("part-*.parquet"))) >= 3
    assert_same_dataset(pandas_dir, ray_dir)

    # A longer model input widens the stored windows in place, part by part for the Ray layout.
    options["max_len"] = 20
    assert_same_dataset(_prepare_with("pandas", tmp_path, monkeypatch, "synthetic", **options),
                        _prepare_with("ray", tmp_path, monkeypatch, "synthetic", **options))


def _shards_with_ties(folder: Path) -> Path:
    """Three CSV shards: text user ids (string order: u10 < u2), items seen first late in the file, many equal
    timestamps per user (file order decides, across shards too), and users the 2-core and the 3-item minimum drop."""
    rng = np.random.default_rng(7)
    rows = 3000
    frame = pd.DataFrame({
        "who": [f"u{u}" for u in rng.integers(0, 150, rows)],
        "what": [f"i{i}" for i in rng.zipf(1.6, rows) % 400],
        "when": rng.integers(0, 6, rows),  # six distinct times: ties everywhere
    })
    frame = pd.concat([frame, pd.DataFrame({"who": ["lonely", "pair", "pair"], "what": ["i1", "i2", "i3"],
                                            "when": [0, 1, 1]})], ignore_index=True)
    folder.mkdir()
    for index, lo in enumerate(range(0, len(frame), 1001)):
        frame.iloc[lo: lo + 1001].to_csv(folder / f"part-{index}.csv", index=False)
    return folder


def test_sharded_csv_with_ties_auto_engine_and_cli(ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    source = _shards_with_ties(tmp_path / "shards")
    options = {"source": source, "kcore": 2, "max_len": 10, "user_col": "who", "item_col": "what",
               "time_col": "when"}
    pandas_dir = _prepare_with("pandas", tmp_path, monkeypatch, "csv", **options)
    meta = json.loads((pandas_dir / "meta.json").read_text())
    assert meta["dropped_short_users"] >= 1 and meta["source"]["shards"] == 3

    # auto picks Ray above the threshold; the command line says nothing on stderr
    monkeypatch.setenv(ray_engine.ROWS_ENV, "100")
    monkeypatch.setenv("SEQREC_DATA", str(tmp_path / "ray"))
    argv = ["prepare", "csv", "--source", str(source), "--kcore", "2", "--max-len", "10", "--user-col", "who",
            "--item-col", "what", "--time-col", "when", "--quiet"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    ray_dir = Path(captured.out.strip().splitlines()[-1].split()[-1])
    assert_same_dataset(pandas_dir, ray_dir)


def test_ml100k_ray_engine_matches_the_pandas_engine(ray_local, ml100k_shaped_udata: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Real MovieLens-100K (5-core, many equal timestamps) where ../shared holds it; elsewhere a u.data with its
    counts and coarse, tied timestamps, so the test runs (and never skips) everywhere."""
    real = SHARED_ML100K if SHARED_ML100K.is_file() else None
    options = {"source": real or ml100k_shaped_udata, "max_len": 200}
    pandas_dir = _prepare_with("pandas", tmp_path, monkeypatch, "ml-100k", **options)
    ray_dir = _prepare_with("ray", tmp_path, monkeypatch, "ml-100k", **options)
    meta = json.loads((ray_dir / "meta.json").read_text())
    assert meta["raw"] == {"interactions": 100_000, "users": 943, "items": 1_682}
    assert meta["num_interactions"] < 100_000  # the 5-core removed rows
    assert_same_dataset(pandas_dir, ray_dir)


def test_engine_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ray_engine.ROWS_ENV, raising=False)
    table = tmp_path / "t.parquet"
    pd.DataFrame({"user": np.arange(1234), "item": 1, "timestamp": 0.0}).to_parquet(table)
    text = tmp_path / "t.csv"
    text.write_text("user,item,timestamp\n" + "".join(f"{u},{u % 7},{u}\n" for u in range(5000)))
    assert ray_engine.estimate_rows([table], None) == 1234
    assert abs(ray_engine.estimate_rows([text], None) - 5001) < 50
    assert ray_engine.estimate_rows(None, {"users": 1000, "length": 50}) == 50_000
    # ml-100k and every test dataset stay on pandas by default; Ray above the threshold, which the user sets
    assert ray_engine.choose_engine("auto", 100_000) == "pandas"
    assert ray_engine.choose_engine("auto", 30_000_000) == "ray"
    monkeypatch.setenv(ray_engine.ROWS_ENV, "1e5")
    assert ray_engine.choose_engine("auto", 100_001) == "ray"
    assert ray_engine.choose_engine("pandas", 10**9) == "pandas"
    with pytest.raises(UserError, match="engine must be one of"):
        ray_engine.choose_engine("spark", 1)
    monkeypatch.setenv(ray_engine.ROWS_ENV, "many")
    with pytest.raises(UserError, match=ray_engine.ROWS_ENV):
        ray_engine.choose_engine("auto", 1)


def test_file_order_without_timestamps_and_no_kcore(ray_local, synthetic_lastfm_file: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An S3Rec file has no timestamps (file order is the order) and its recipe no k-core."""
    options = {"source": synthetic_lastfm_file, "max_len": 50}
    assert_same_dataset(_prepare_with("pandas", tmp_path, monkeypatch, "lastfm", **options),
                        _prepare_with("ray", tmp_path, monkeypatch, "lastfm", **options))


def test_files_from_other_systems_and_bad_tokens(ray_local, synthetic_lastfm_file: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's read tasks run the same readers: a copy of an S3Rec file with a byte order mark, CRLF and tabs is the
    clean file's dataset; a bad token is the reader's one-line UserError, as on pandas, and leaves nothing behind."""
    source = tmp_path / "in" / "LastFM.txt"
    source.parent.mkdir()
    clean = synthetic_lastfm_file.read_bytes()
    source.write_bytes(clean)
    pandas_dir = _prepare_with("pandas", tmp_path, monkeypatch, "lastfm", source=source, max_len=20)
    source.write_bytes(b"\xef\xbb\xbf" + clean.replace(b" ", b"\t").replace(b"\n", b"\r\n") + b"\r\n")
    assert_same_dataset(pandas_dir, _prepare_with("ray", tmp_path, monkeypatch, "lastfm", source=source, max_len=20))

    lines = [line.split(" ") for line in clean.decode().splitlines()]
    lines[6][2] = "9x4"  # line 7, field 3: the user's second item
    source.write_text("".join(" ".join(ids) + "\n" for ids in lines))
    monkeypatch.setenv("SEQREC_DATA", str(tmp_path / "refused"))
    with pytest.raises(UserError) as refused:
        prepare("lastfm", source=source, engine="ray", progress=False)
    assert re.fullmatch(r".*LastFM\.txt, line 7: field 3 should be an integer \(.*\), got '9x4'", str(refused.value))
    assert [path for path in (tmp_path / "refused").rglob("*") if path.is_file()] == []
