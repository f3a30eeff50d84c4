"""Readers and recipes for the S3Rec, SASRec, RecBole atomic and generic CSV/Parquet formats."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from study.data import load_prepared, prepare
from study.data.readers import (
    read_atomic,
    read_movielens_csv,
    read_movielens_dat,
    read_movielens_udata,
    read_s3rec,
    read_sasrec,
    read_table,
)
from study.errors import UserError

# From ../shared/datasets/README.md: users, items, interactions, (mean, median, max) length.
SHARED_TABLE = {
    "lastfm": ("s3rec/LastFM.txt", read_s3rec, 1_090, 3_646, 52_551, (48.2, 19, 899)),
    "beauty": ("s3rec/Beauty.txt", read_s3rec, 22_363, 12_101, 198_502, (8.9, 6, 204)),
    "video": ("sasrec/Video.txt", read_sasrec, 31_013, 23_715, 287_107, (9.3, 6, 860)),
}


def test_reader_counts_match_shared_readme(shared_datasets: Path) -> None:
    """The real files, read by their readers, have the published statistics (one test: the files are the point)."""
    for name, (file, reader, users, items, interactions, (mean, median, longest)) in SHARED_TABLE.items():
        frame = reader(shared_datasets / file)
        assert (frame["user"].nunique(), frame["item"].nunique(), len(frame)) == (users, items, interactions), name
        assert frame["timestamp"].isna().all(), name  # these formats carry no time; file order is the order
        lengths = frame.groupby("user").size()
        assert (round(lengths.mean(), 1), lengths.median(), lengths.max()) == (mean, median, longest), name


@pytest.mark.parametrize("name", ["lastfm", "beauty"])
def test_s3rec_recipe_keeps_the_file_as_is(name: str, synthetic_lastfm_file: Path, data_cache: Path) -> None:
    """kcore=0 by default and ids already numbered by first appearance: the prepared data is the file."""
    file = synthetic_lastfm_file  # S3Rec's format, synthetic sequences
    frame = read_s3rec(file)
    lengths = frame.groupby("user").size()
    users, items, interactions = frame["user"].nunique(), frame["item"].nunique(), len(frame)
    ds = load_prepared(prepare(name, source=file, progress=False))
    meta = ds.meta
    assert (meta["num_users"], meta["num_items"], meta["num_interactions"]) == (users, items, interactions)
    assert (meta["length"]["mean"], meta["length"]["median"], meta["length"]["max"]) == pytest.approx(
        (lengths.mean(), lengths.median(), lengths.max())
    )
    # not the published file: the recipe says so (a warning), and keeps it as it is all the same
    assert meta["kcore"] == 0 and meta["dropped_short_users"] == 0 and meta["verified"]["matched"] is False
    assert np.array_equal(ds.history_indices, frame["item"].to_numpy())
    assert ds.raw_users.tolist() == [str(u) for u in range(1, users + 1)]


def test_video_recipe_drops_users_too_short_to_split(tmp_path: Path, data_cache: Path) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=200)  # users of 1 or 2 interactions among longer ones, as in Video.txt
    rows = [f"{user} {rng.integers(1, 300)}" for user, length in enumerate(lengths, start=1) for _ in range(length)]
    file = tmp_path / "Video.txt"
    file.write_text("\n".join(rows) + "\n")
    short = int((lengths < 3).sum())
    assert short > 0
    ds = load_prepared(prepare("video", source=file, progress=False))
    meta = ds.meta
    assert meta["raw"]["interactions"] == len(rows) and meta["raw"]["users"] == len(lengths)
    # leave-one-out cannot split a user of 1 or 2 interactions
    assert meta["dropped_short_users"] == short and meta["num_users"] == len(lengths) - short
    assert meta["length"]["min"] == 3 and any("dropped" in note for note in meta["notes"])
    frame = read_sasrec(file)
    sizes = frame.groupby("user").size()
    assert int((sizes < 3).sum()) == short
    assert meta["num_interactions"] == int(sizes[sizes >= 3].sum())


def test_source_folder_finds_the_recipe_file(synthetic_lastfm_file: Path, data_cache: Path) -> None:
    path = prepare("lastfm", source=synthetic_lastfm_file.parent, progress=False)
    assert load_prepared(path).meta["source"]["file"].endswith("LastFM.txt")


def test_atomic_reader_any_column_order(tmp_path: Path) -> None:
    path = tmp_path / "x.inter"
    path.write_text("timestamp:float\titem_id:token\trating:float\tuser_id:token\n5\ta\t1\tu2\n3\tb\t2\tu1\n")
    frame = read_atomic(path)
    assert frame["user"].tolist() == ["u2", "u1"] and frame["item"].tolist() == ["a", "b"]
    assert frame["timestamp"].tolist() == [5.0, 3.0]
    path.write_text("item_id:token\tuser_id:token\na\tu1\n")  # no timestamp column: file order
    assert read_atomic(path)["timestamp"].isna().all()
    path.write_text("item:token\tuser_id:token\na\tu1\n")
    with pytest.raises(UserError, match=r"x\.inter, line 1: .*no 'item_id' column"):
        read_atomic(path)
    path.write_text("user_id:token\titem_id:token\ttimestamp:float\nu1\ta\t1\nu1\tb\tsoon\n")
    with pytest.raises(UserError, match=r"x\.inter, line 3: field 3 should be a number"):
        read_atomic(path)


def test_s3rec_and_sasrec_bad_lines(tmp_path: Path) -> None:
    s3rec = tmp_path / "S.txt"
    s3rec.write_text("1 1 2 3\n\n2 4 5\n3\n")
    with pytest.raises(UserError, match=r"S\.txt, line 4: expected 'user item1 item2 \.\.\.'"):
        read_s3rec(s3rec)
    sasrec = tmp_path / "V.txt"
    sasrec.write_text("1 1\n1 2\n2 3 4\n")
    with pytest.raises(UserError, match=r"V\.txt, line 3: expected 2 fields"):
        read_sasrec(sasrec)
    sasrec.write_text("1 1\n1\n")
    with pytest.raises(UserError, match=r"V\.txt, line 2: expected 2 fields"):
        read_sasrec(sasrec)


INTEGER_ID_FILES = {  # file name, reader, text with "{}" where the second line's item id goes (line 2)
    "S3Rec": ("S.txt", read_s3rec, "1 1 2 3\n2 {} 6\n"),
    "SASRec": ("V.txt", read_sasrec, "1 1\n1 {}\n"),
    "u.data": ("u.data", read_movielens_udata, "1\t1\t5\t10\n1\t{}\t5\t11\n"),
    "ratings.dat": ("ratings.dat", read_movielens_dat, "1::1::5::10\n1::{}::5::11\n"),
    "ratings.csv": ("ratings.csv", read_movielens_csv, "userId,movieId,rating,timestamp\n1,{},5,11\n"),
}


@pytest.mark.parametrize("fmt", list(INTEGER_ID_FILES))
def test_integer_ids_are_strict(fmt: str, tmp_path: Path) -> None:
    """Ids are integers where the format's own code parses them with int: anything else (what pandas or numpy
    would take as a number or as text) names its line, rather than becoming an item or a float cast back."""
    name, reader, text = INTEGER_ID_FILES[fmt]
    path = tmp_path / name
    path.write_text(text.format("+7"))
    assert 7 in reader(path)["item"].tolist()
    for token in ("9x4", "5.0", "1e3", "1_0", "\u0663", "99999999999999999999", "0x1"):
        path.write_text(text.format(token), encoding="utf-8")
        with pytest.raises(UserError, match=rf"{re.escape(name)}, line 2: field 2 should be an integer"):
            reader(path)


def test_generic_csv_with_column_flags(tmp_path: Path, data_cache: Path) -> None:
    """Named columns, string ids, date strings as times, and equal times keeping file order."""
    path = tmp_path / "events.csv"
    rows = ["when,who,what,extra"]
    for user in ("alice", "bob", "carol"):
        for day, item in zip((3, 1, 2, 2), ("x", "y", "z", "w"), strict=True):
            rows.append(f"2024-01-0{day},{user},{item}-{user[0]},1")
    path.write_text("\n".join(rows) + "\n")
    frame = read_table(path, user_col="who", item_col="what", time_col="when")
    assert frame["timestamp"].iloc[0] == pd.Timestamp("2024-01-03", tz="UTC").timestamp()

    ds = load_prepared(
        prepare(
            "csv", source=path, max_len=4, user_col="who", item_col="what", time_col="when", progress=False
        )
    )
    assert ds.raw_users.tolist() == ["alice", "bob", "carol"]
    # per user: y (day 1), z then w (both day 2, file order), x (day 3)
    assert ds.history(0).tolist() == [1, 2, 3, 4] and ds.history(1).tolist() == [5, 6, 7, 8]
    assert ds.test[0].tolist() == [0, 1, 2, 3, 4] and ds.valid[0].tolist() == [0, 0, 1, 2, 3]
    assert ds.meta["recipe"]["user_col"] == "who" and ds.meta["kcore"] == 0

    no_time = load_prepared(
        prepare("csv", source=path, user_col="who", item_col="what", time_col="none", progress=False)
    )
    assert no_time.history(0).tolist() == [1, 2, 3, 4] and no_time.path != ds.path
    assert load_prepared(no_time.path).meta["recipe"]["time_col"] is None

    with pytest.raises(
        UserError, match=r"events\.csv: missing column\(s\) 'user', 'item', 'timestamp' \(columns: when, who"
    ):
        prepare("csv", source=path, progress=False)


def test_generic_csv_bad_values_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("user,item,timestamp\n1,2,10\n\n1,3,\n")
    with pytest.raises(UserError, match=r"e\.csv, line 4: column 'timestamp' is empty"):
        read_table(path)
    path.write_text("user,item,timestamp\n1,2,10\n1,3,later\n")
    with pytest.raises(UserError, match=r"e\.csv, line 3: column 'timestamp' should be a number or a date"):
        read_table(path)


def test_generic_parquet(tmp_path: Path, data_cache: Path) -> None:
    path = tmp_path / "log.parquet"
    pd.DataFrame(
        {
            "uid": np.repeat([10, 2], 4),
            "iid": [7, 8, 9, 7, 9, 8, 7, 9],
            "ts": pd.to_datetime([4, 3, 2, 1, 1, 2, 3, 4], unit="D"),
        }
    ).to_parquet(path)
    ds = load_prepared(
        prepare("parquet", source=path, user_col="uid", item_col="iid", time_col="ts", progress=False)
    )
    assert ds.raw_users.tolist() == ["2", "10"]  # numeric order of the raw ids
    assert ds.history(0).tolist() == [1, 2, 3, 1]  # user 2 by time: items 9, 8, 7, 9
    assert ds.history(1).tolist() == [3, 1, 2, 3]  # user 10 by time: items 7, 9, 8, 7
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(UserError, match=r"broken\.parquet: cannot read as Parquet"):
        read_table(tmp_path / "broken.parquet")

def test_a_csv_prepared_with_its_columns_is_read_with_them_again_by_name(tmp_path: Path, data_cache: Path) -> None:
    """``prepare csv --source FILE --time-col when`` once, then ``--dataset csv`` (``study.train`` takes no column
    flags): the name reads FILE's columns again, for the prepared copy and for another k-core alike."""
    path = tmp_path / "events.csv"
    rows = ["when,who,what"] + [f"{day},{user},{item}" for user in ("u1", "u2", "u3")
                                for day, item in enumerate(("a", "b", "c", "a", "d"))]
    path.write_text("\n".join(rows) + "\n")
    columns = {"user_col": "who", "item_col": "what", "time_col": "when"}
    first = prepare("csv", source=path, progress=False, **columns)
    assert prepare("csv", progress=False) == first
    other_k = load_prepared(prepare("csv", kcore=3, progress=False))
    assert other_k.path != first and {key: other_k.meta["recipe"][key] for key in columns} == columns
    # a name the copies were read with differently takes the recipe's default unless the request names it
    prepare("csv", source=path, progress=False, **{**columns, "time_col": "none"})
    with pytest.raises(UserError, match=r"missing column\(s\) 'timestamp'"):
        prepare("csv", progress=False)
    assert prepare("csv", progress=False, time_col="when") == first
