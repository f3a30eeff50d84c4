"""MovieLens recipes: the real ML-100K file's published counts, and on a generated u.data with ML-100K's raw counts
(no ``../shared`` needed) order, k-core, ids, split, download and file formats."""

from __future__ import annotations

import http.server
import io
import socket
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from study.data import PreparedDataset, load_prepared, prepare
from study.data.readers import read_atomic, read_movielens_csv, read_movielens_dat, read_movielens_udata
from study.errors import UserError

# Measured on the RecBole ml-100k.inter (= GroupLens u.data) with the iterative 5-core on users and items.
ML100K_5CORE = {"num_users": 943, "num_items": 1349, "num_interactions": 99_287}
ML100K_5CORE_LENGTH = {"mean": 105.2884, "median": 64.0, "max": 648, "min": 19}


@pytest.fixture(scope="module")
def ml100k_inter(shared_datasets: Path) -> Path:
    return shared_datasets / "ml-100k" / "ml-100k.inter"


@pytest.fixture(scope="module")
def ml100k(ml100k_prepared: Path) -> PreparedDataset:
    """ML-100K prepared once per session from the shared RecBole file (default 5-core, max_len 200)."""
    return load_prepared(ml100k_prepared)


@pytest.fixture(scope="module")
def generated(ml100k_shaped_udata: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedDataset:
    """The generated u.data through the ml-100k recipe (default 5-core, max_len 200), in a cache of its own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEQREC_DATA", str(tmp_path_factory.mktemp("generated-cache")))
        return load_prepared(prepare("ml-100k", source=ml100k_shaped_udata, progress=False))


def reference_sequences(path: Path, k: int) -> dict[int, list[int]]:
    """Independent pandas implementation of the recipe: stable sort by (user, time, file order), iterative
    k-core, items numbered by first appearance; the item ids of each kept user, in numeric user order."""
    df = pd.read_csv(path, sep="\t", header=None)
    df.columns = ["user", "item", "rating", "timestamp"]
    df["line"] = np.arange(len(df))
    df = df.sort_values(["user", "timestamp", "line"], kind="stable")
    while True:
        ucount = df.groupby("user")["item"].transform("size")
        icount = df.groupby("item")["user"].transform("size")
        keep = (ucount >= k) & (icount >= k)
        if keep.all():
            break
        df = df[keep]
    df = df.assign(iid=pd.factorize(df["item"])[0] + 1)
    return {user: group.tolist() for user, group in df.groupby("user", sort=True)["iid"]}


def test_ml100k_raw_counts(ml100k_inter: Path, ml100k: PreparedDataset) -> None:
    frame = read_atomic(ml100k_inter)
    assert (len(frame), frame["user"].nunique(), frame["item"].nunique()) == (100_000, 943, 1_682)
    assert ml100k.meta["raw"] == {"interactions": 100_000, "users": 943, "items": 1_682}
    assert ml100k.meta["verified"]["matched"] is True


def test_ml100k_5core_statistics(ml100k: PreparedDataset) -> None:
    meta = ml100k.meta
    assert {key: meta[key] for key in ML100K_5CORE} == ML100K_5CORE
    assert meta["length"] == ML100K_5CORE_LENGTH
    assert meta["kcore"] == 5 and meta["max_len"] == 200 and meta["split"] == "leave-one-out"
    assert meta["synthetic"] is False and meta["dropped_short_users"] == 0
    assert meta["source"]["sha256"] and meta["source"]["path"].endswith("ml-100k.inter")
    assert ml100k.path.name == f"ml-100k-{meta['content_hash'][:12]}"
    # every item really has >= 5 interactions after the filter, and every user too
    counts = np.bincount(ml100k.history_indices, minlength=ml100k.num_items + 1)[1:]
    assert counts.min() >= 5 and np.diff(ml100k.history_indptr).min() >= 5


def test_ml100k_matches_independent_reference(ml100k_shaped_udata: Path, generated: PreparedDataset) -> None:
    """Chronological order, the k-core result and first-appearance ids agree with a plain pandas pipeline."""
    expected = reference_sequences(ml100k_shaped_udata, 5)
    assert len(expected) == generated.num_users < 943  # the 5-core dropped users
    assert generated.num_items < 1_682
    for user, sequence in zip(expected, generated.items):
        assert sequence.tolist() == expected[user], user
    assert generated.raw_users.tolist() == [str(u) for u in expected]  # numeric order of raw ids


def test_ml100k_ids_and_padding(generated: PreparedDataset) -> None:
    ds = generated
    used = np.unique(ds.history_indices)
    assert used.tolist() == list(range(1, ds.num_items + 1))  # contiguous, 0 never used by an item
    # first appearance: scanning users in order, every new id is exactly one more than the largest so far
    first_seen = np.maximum.accumulate(ds.history_indices)
    assert np.all(np.diff(np.concatenate([[0], first_seen])) <= 1)
    for split in (ds.train, ds.valid, ds.test):
        assert split.dtype == np.int32 and split.shape == (ds.num_users, 201)
        assert split.min() == 0 and split.max() <= ds.num_items
        nonzero = split != 0
        # left padding only: once a row has started, it has no more zeros
        assert np.all(np.diff(nonzero.astype(np.int8), axis=1) >= 0)
    assert ds.history_indptr[0] == 0 and ds.history_indptr[-1] == ds.meta["num_interactions"]


def test_ml100k_leave_one_out(generated: PreparedDataset) -> None:
    ds, width = generated, 201
    for user, seq in enumerate(ds.items):
        assert (
            ds.test[user, -1] == seq[-1] and ds.valid[user, -1] == seq[-2] and ds.train[user, -1] == seq[-3]
        )
        for row, prefix in ((ds.test[user], seq), (ds.valid[user], seq[:-1]), (ds.train[user], seq[:-2])):
            tail = prefix[-width:]
            assert row[width - len(tail) :].tolist() == tail.tolist()
            assert not row[: width - len(tail)].any()
    # each split's input ends with the previous split's target
    assert np.array_equal(ds.valid[:, -2], ds.train[:, -1])
    assert np.array_equal(ds.test[:, -2], ds.valid[:, -1])


def test_item_popularity_counts_training_prefixes(generated: PreparedDataset) -> None:
    pop = generated.item_popularity()
    assert pop.shape == (generated.num_items + 1,) and pop[0] == 0
    assert pop.sum() == generated.meta["num_interactions"] - 2 * generated.num_users
    expected = np.bincount(np.concatenate([s[:-2] for s in generated.items]), minlength=generated.num_items + 1)
    assert np.array_equal(pop, expected)
    assert generated.item_popularity("test").sum() == generated.meta["num_interactions"]


def test_small_max_len_windows(ml100k_shaped_udata: Path, generated: PreparedDataset, data_cache: Path) -> None:
    ds = load_prepared(prepare("ml-100k", source=ml100k_shaped_udata, max_len=3, progress=False))
    assert ds.train.shape == (generated.num_users, 4) and ds.meta["max_len"] == 3
    seq = ds.history(0)
    assert ds.test[0].tolist() == seq[-4:].tolist()
    assert ds.valid[0].tolist() == seq[-5:-1].tolist()
    assert ds.train[0].tolist() == seq[-6:-2].tolist()


# ----------------------------------------------------------------------------------------------------
# Download path, against a local HTTP server


def _udata_zip(udata: Path, rows: int | None = None) -> bytes:
    """A GroupLens-style ml-100k.zip whose ml-100k/u.data holds the given u.data's rows (TSV, no header)."""
    lines = udata.read_text().splitlines()
    if rows is not None:
        lines = lines[:rows]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("ml-100k/u.data", "\n".join(lines) + "\n")
        zf.writestr("ml-100k/README", "MovieLens 100K (test copy)\n")
    return buffer.getvalue()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - signature of the base class
        pass


@pytest.fixture
def http_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder served on 127.0.0.1 and set as the MovieLens base URL."""
    root = tmp_path / "www"
    root.mkdir()

    def handler(*args: object, **kwargs: object) -> _QuietHandler:
        return _QuietHandler(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("SEQREC_MOVIELENS_URL", f"http://127.0.0.1:{server.server_address[1]}/movielens")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    (root / "movielens").mkdir()
    try:
        yield root / "movielens"
    finally:
        server.shutdown()
        server.server_close()


def test_download_end_to_end(
    ml100k_shaped_udata: Path,
    generated: PreparedDataset,
    data_cache: Path,
    http_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (http_root / "ml-100k.zip").write_bytes(_udata_zip(ml100k_shaped_udata))
    path = prepare("ml-100k", progress=False)
    ds = load_prepared(path)
    assert ds.meta["source"]["url"].endswith("/movielens/ml-100k.zip")
    assert ds.meta["source"]["file"].endswith("ml-100k.zip:ml-100k/u.data")
    assert ds.meta["verified"]["matched"] is True
    assert {key: ds.meta[key] for key in ML100K_5CORE} == {key: generated.meta[key] for key in ML100K_5CORE}
    assert np.array_equal(ds.test, generated.test)
    assert np.array_equal(ds.history_indices, generated.history_indices)
    assert (data_cache / "downloads" / "ml-100k.zip").is_file()
    assert not list((data_cache / "downloads").glob(".*part"))
    # the archive is cached: with the server gone, the same call still works and reuses the prepared copy
    monkeypatch.setenv("SEQREC_MOVIELENS_URL", "http://127.0.0.1:9/nothing-here")
    assert prepare("ml-100k", progress=False) == path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_download_connection_refused(data_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{_free_port()}/movielens"
    monkeypatch.setenv("SEQREC_MOVIELENS_URL", url)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with pytest.raises(UserError) as info:
        prepare("ml-1m", progress=False)
    message = str(info.value)
    assert f"download of {url}/ml-1m.zip failed" in message and "refused" in message.lower()
    assert "--source" in message
    assert not (data_cache / "prepared").exists() and not list(data_cache.rglob("*.part"))


def test_download_404(data_cache: Path, http_root: Path) -> None:
    with pytest.raises(UserError, match=r"ml-20m\.zip failed: HTTP 404 .*--source"):
        prepare("ml-20m", progress=False)
    assert not list(data_cache.rglob("*.zip"))


def test_download_with_wrong_counts_is_rejected(
    ml100k_shaped_udata: Path, data_cache: Path, http_root: Path
) -> None:
    (http_root / "ml-100k.zip").write_bytes(_udata_zip(ml100k_shaped_udata, rows=5_000))
    with pytest.raises(UserError, match=r"not the expected ml-100k: it has 5,000 interactions"):
        prepare("ml-100k", progress=False)
    assert not (data_cache / "downloads" / "ml-100k.zip").exists()  # removed, so a retry downloads again
    assert not (data_cache / "prepared").exists() or not any((data_cache / "prepared").iterdir())


def test_download_that_does_not_parse_is_not_kept(tmp_path: Path, data_cache: Path, http_root: Path) -> None:
    """A failed preparation leaves the cache as it found it: the archive it downloaded goes too (a retry downloads
    again instead of reusing a bad file forever), and a kept archive it did not download stays."""
    udata = tmp_path / "u.data"
    udata.write_text("1\t10\t5\t100\n1\t11\t3\t101\n2\t1e3\t4\t102\n")
    (http_root / "ml-100k.zip").write_bytes(_udata_zip(udata))
    with pytest.raises(UserError, match=r"ml-100k\.zip:ml-100k/u\.data, line 3: field 2 should be an integer"):
        prepare("ml-100k", progress=False)
    assert [path for path in data_cache.rglob("*") if path.is_file()] == []


# ----------------------------------------------------------------------------------------------------
# The other MovieLens file formats, and --source as zip / folder / file


def test_source_zip_folder_and_udata_agree(
    ml100k_shaped_udata: Path, generated: PreparedDataset, tmp_path: Path, data_cache: Path
) -> None:
    archive = tmp_path / "ml-100k.zip"
    archive.write_bytes(_udata_zip(ml100k_shaped_udata))
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp_path / "unpacked")
    for source in (archive, tmp_path / "unpacked", tmp_path / "unpacked" / "ml-100k" / "u.data"):
        ds = load_prepared(prepare("ml-100k", source=source, progress=False))
        assert np.array_equal(ds.history_indices, generated.history_indices), source
        assert ds.meta["verified"]["matched"] is True


def test_read_udata_keeps_file_order(tmp_path: Path) -> None:
    path = tmp_path / "u.data"
    path.write_text("3\t10\t4\t300\n1\t20\t5\t100\n3\t30\t1\t200\n")
    frame = read_movielens_udata(path)
    assert frame["user"].tolist() == [3, 1, 3] and frame["item"].tolist() == [10, 20, 30]
    assert frame["timestamp"].tolist() == [300.0, 100.0, 200.0]


def test_read_ratings_dat(tmp_path: Path) -> None:
    path = tmp_path / "ratings.dat"
    path.write_text("1::1193::5::978300760\n1::661::3::978302109\n2::1357::5::978298709\n")
    frame = read_movielens_dat(path)
    assert frame["user"].tolist() == [1, 1, 2] and frame["item"].tolist() == [1193, 661, 1357]
    assert frame["timestamp"].tolist() == [978300760.0, 978302109.0, 978298709.0]
    bad = tmp_path / "bad" / "ratings.dat"
    bad.parent.mkdir()
    bad.write_text("1::1193::5::978300760\n1::661::3\n")
    with pytest.raises(UserError, match=r"ratings\.dat, line 2: expected 4 fields"):
        read_movielens_dat(bad)


def test_read_ratings_csv(tmp_path: Path) -> None:
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n1,2,3.5,1112486027\n1,29,3.5,1112484676\n7,32,4.0,1\n")
    frame = read_movielens_csv(path)
    assert frame["user"].tolist() == [1, 1, 7] and frame["item"].tolist() == [2, 29, 32]
    assert frame["timestamp"].tolist() == [1112486027.0, 1112484676.0, 1.0]
    path.write_text("userId,movieId,rating,timestamp\n1,2,3.5,1112486027\n1,x,3.5,1112484676\n")
    with pytest.raises(UserError, match=r"ratings\.csv, line 3: field 2 should be an integer"):
        read_movielens_csv(path)
    path.write_text("user,movie\n1,2\n")
    with pytest.raises(UserError, match=r"line 1: expected the header"):
        read_movielens_csv(path)


def test_ml1m_from_local_ratings_dat(tmp_path: Path, data_cache: Path, capsys: pytest.CaptureFixture) -> None:
    """A small file in the ML-1M layout goes through the ml-1m recipe (with a count warning, not an error)."""
    rng = np.random.default_rng(0)
    rows = [
        f"{u}::{rng.integers(1, 40)}::{rng.integers(1, 6)}::{978300000 + 7 * i}"
        for i, u in enumerate(np.repeat(np.arange(1, 31), 12))
    ]
    folder = tmp_path / "ml-1m"
    folder.mkdir()
    (folder / "ratings.dat").write_text("\n".join(rows) + "\n")
    ds = load_prepared(prepare("ml-1m", source=tmp_path, kcore=2, progress=False))
    assert ds.meta["raw"]["interactions"] == 360 and ds.meta["verified"]["matched"] is False
    assert "warning:" in capsys.readouterr().err
    assert ds.meta["source"]["file"].endswith("ratings.dat")


def test_output_contract(generated: PreparedDataset) -> None:
    """The exact file layout the trainer and the sweep driver depend on."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(generated.path / "sequences.parquet")
    assert schema.field("user").type == pa.int64() and schema.field("raw_user").type == pa.string()
    assert schema.field("items").type == pa.list_(pa.int32())
    for split in ("train", "valid", "test"):
        assert schema.field(split).type == pa.list_(pa.int32(), 201)  # fixed_size_list<int32>[max_len + 1]
    table = pq.read_table(generated.path / "sequences.parquet", columns=["user"])
    assert table.column("user").to_numpy().tolist() == list(range(generated.num_users))
    required = {
        "name", "recipe", "synthetic", "num_users", "num_items", "num_interactions", "length", "source",
        "kcore", "max_len", "split", "dropped_short_users", "format_version", "content_hash", "created",
    }
    assert required <= set(generated.meta)
    assert set(generated.meta["length"]) == {"mean", "median", "max", "min"}
    assert {"path", "sha256"} <= set(generated.meta["source"])
    assert generated.meta["recipe"] == {"name": "ml-100k", "kcore": 5}  # the window length is no part of it
    assert generated.train.flags.writeable and generated.history_indices.dtype == np.int32
