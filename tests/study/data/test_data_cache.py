"""The prepared-dataset cache: reuse, content hashing, --force, and atomic writes."""

from __future__ import annotations

from pathlib import Path

import pytest

import study.data.pipeline as pipeline
from study.data import list_prepared, load_prepared, prepare, prepared_copy
from study.errors import UserError


@pytest.fixture
def lastfm(synthetic_lastfm_file: Path) -> Path:
    """A file in LastFM.txt's format (synthetic sequences, so no ``../shared`` is needed)."""
    return synthetic_lastfm_file


def users_in(path: Path) -> int:
    """Users of an S3Rec file: one per line."""
    return len(path.read_text().splitlines())


def test_second_call_reuses_without_work(
    lastfm: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = prepare("lastfm", source=lastfm, progress=False)
    stamp = (first / "meta.json").stat().st_mtime_ns, (first / "sequences.parquet").stat().st_mtime_ns

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached dataset was rebuilt")

    monkeypatch.setattr(pipeline, "build_sequences", no_work)
    assert prepare("lastfm", source=lastfm, progress=False) == first
    assert (
        (first / "meta.json").stat().st_mtime_ns,
        (first / "sequences.parquet").stat().st_mtime_ns,
    ) == stamp
    assert [path for path, _ in list_prepared()] == [first]


def test_options_and_content_change_the_hash(lastfm: Path, data_cache: Path, tmp_path: Path) -> None:
    base = prepare("lastfm", source=lastfm, progress=False)
    other_k = prepare("lastfm", source=lastfm, kcore=2, progress=False)
    assert base != other_k
    assert all(p.name.startswith("lastfm-") and len(p.name) == len("lastfm-") + 12 for p in (base, other_k))

    # the same content at another path is the same dataset; changed content is a new one
    copy = tmp_path / "LastFM.txt"
    copy.write_bytes(lastfm.read_bytes())
    assert prepare("lastfm", source=copy, progress=False) == base
    lines = copy.read_text().splitlines()
    copy.write_text("\n".join(lines[:-1]) + "\n")
    changed = prepare("lastfm", source=copy, progress=False)
    assert changed != base and load_prepared(changed).meta["num_users"] == users_in(lastfm) - 1


def test_window_length_is_not_part_of_the_identity(lastfm: Path, data_cache: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """max_len is a model setting: every length shares one dataset (one hash), whose windows widen on demand."""
    short = prepare("lastfm", source=lastfm, max_len=50, progress=False)
    narrow = load_prepared(short)
    assert narrow.train.shape == (users_in(lastfm), 51)

    def no_source_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("widening must not re-read the source")

    monkeypatch.setattr(pipeline, "build_sequences", no_source_read)
    wide = prepare("lastfm", source=lastfm, max_len=120, progress=False)
    assert wide == short
    widened = load_prepared(wide)
    assert widened.train.shape == (users_in(lastfm), 121) and widened.meta["max_len"] == 120
    assert widened.meta["content_hash"] == narrow.meta["content_hash"]
    for split in ("train", "valid", "test"):  # the old windows are the right end of the new ones
        assert (getattr(widened, split)[:, -51:] == getattr(narrow, split)).all()
    assert prepare("lastfm", source=lastfm, max_len=30, progress=False) == short  # shorter: reused as is
    assert load_prepared(short).train.shape == (users_in(lastfm), 121)


def test_prepared_dataset_is_used_by_name(lastfm: Path, data_cache: Path, tmp_path: Path) -> None:
    copy = tmp_path / "LastFM.txt"
    copy.write_bytes(lastfm.read_bytes())
    first = prepare("lastfm", source=copy, progress=False)
    assert prepare("lastfm", progress=False) == first  # no --source: the prepared copy
    # another k-core re-reads the source recorded for that name
    k2 = prepare("lastfm", kcore=2, progress=False)
    assert k2 != first and load_prepared(k2).meta["source"]["path"] == str(copy.resolve())
    # a second, different source under the same name is ambiguous without --source
    lines = copy.read_text().splitlines()
    other = tmp_path / "LastFM-edited.txt"
    other.write_text("\n".join(lines[:-1]) + "\n")
    prepare("lastfm", source=other, progress=False)
    with pytest.raises(UserError, match=r"dataset 'lastfm' is prepared from 2 different sources: .*--source PATH"):
        prepare("lastfm", progress=False)
    assert prepare("lastfm", source=copy, progress=False) == first  # --source chooses



def test_a_trials_dataset_is_found_by_its_content_hash(lastfm: Path, data_cache: Path, tmp_path: Path) -> None:
    """A training state or an exported model records its dataset's name and content hash: the cached copy with
    that hash is used (widened if a longer window is asked for), else the source is prepared again and must give
    the same hash; another file's hash is refused, not silently trained on."""
    first = prepare("lastfm", source=lastfm, max_len=20, progress=False)
    identity = load_prepared(first).meta
    assert prepared_copy(identity, 40) == first and load_prepared(first).train.shape[1] == 41
    edited = tmp_path / "LastFM-edited.txt"
    edited.write_text("\n".join(lastfm.read_text().splitlines()[:-1]) + "\n")
    other = load_prepared(prepare("lastfm", source=edited, max_len=20, progress=False)).meta
    with pytest.raises(UserError, match="but the trial trained on"):
        prepared_copy({**other, "content_hash": "0" * 64}, 20, source=edited)
    with pytest.raises(UserError, match="records no dataset identity"):
        prepared_copy({"name": "lastfm"}, 20)

def test_force_rebuilds_in_place(lastfm: Path, data_cache: Path) -> None:
    first = prepare("lastfm", source=lastfm, progress=False)
    inode = (first / "meta.json").stat().st_ino
    again = prepare("lastfm", source=lastfm, force=True, progress=False)
    assert again == first and (first / "meta.json").stat().st_ino != inode
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]  # no temp or old copies left


def test_failure_midway_leaves_nothing(
    lastfm: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parquet file gets written, then the disk 'fills up': no directory may appear under any name."""
    real_write = pipeline.pq.write_table

    def write_then_fail(table: object, where: object, **kwargs: object) -> None:
        real_write(table, where, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pipeline.pq, "write_table", write_then_fail)
    with pytest.raises(OSError, match="No space left"):
        prepare("lastfm", source=lastfm, progress=False)
    assert list((data_cache / "prepared").iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setenv("SEQREC_DATA", str(data_cache))
    assert load_prepared(prepare("lastfm", source=lastfm, progress=False)).num_users == users_in(lastfm)


def test_a_copy_from_another_system_is_the_same_source(lastfm: Path, data_cache: Path, tmp_path: Path) -> None:
    """A copy with a byte order mark and CRLF line ends (as Windows tools write it) is the same source: the same
    prepared directory, and by name one source, not "prepared from 2 different sources"."""
    first = prepare("lastfm", source=lastfm, progress=False)
    copy = tmp_path / "LastFM.txt"
    copy.write_bytes(b"\xef\xbb\xbf" + lastfm.read_bytes().replace(b"\n", b"\r\n"))
    assert prepare("lastfm", source=copy, progress=False) == first
    k2 = prepare("lastfm", source=copy, kcore=2, progress=False)
    assert prepare("lastfm", progress=False) == first and prepare("lastfm", kcore=2, progress=False) == k2


def _udata(path: Path, rows: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(row + "\n" for row in rows))
    return path


def test_a_failed_preparation_keeps_no_source(data_cache: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A downloadable recipe keeps a --source in the cache, but only once its preparation succeeded: a refused
    file, or a failure after the build, leaves no copy that the name could later be prepared from."""
    rows = [f"{user}\t{item}\t4\t{10 * user + item}" for user in range(1, 5) for item in range(1, 5)]
    good = prepare("ml-100k", source=_udata(tmp_path / "good" / "u.data", rows), kcore=0, progress=False)
    kept = sorted(path for path in (data_cache / "sources").rglob("*") if path.is_file())
    assert len(kept) == 1
    with pytest.raises(UserError, match=r"u\.data, line 17: field 2 should be an integer"):
        prepare("ml-100k", source=_udata(tmp_path / "bad" / "u.data", [*rows, "5\t9x4\t4\t1"]), progress=False)

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pipeline, "_publish", disk_full)
    with pytest.raises(OSError, match="No space left"):
        prepare("ml-100k", source=_udata(tmp_path / "other" / "u.data", rows[:-1]), kcore=0, progress=False)
    monkeypatch.undo()
    monkeypatch.setenv("SEQREC_DATA", str(data_cache))
    assert sorted(path for path in (data_cache / "sources").rglob("*") if path.is_file()) == kept
    assert [path for path, _ in list_prepared()] == [good]
    assert prepare("ml-100k", kcore=0, progress=False) == good  # by name: the one source there is


def test_bad_inputs_write_nothing(lastfm: Path, data_cache: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="empty after the 1000-core filter"):
        prepare("lastfm", source=lastfm, kcore=1000, progress=False)
    with pytest.raises(UserError, match="max_len must be an integer of at least 2"):
        prepare("lastfm", source=lastfm, max_len=1, progress=False)
    with pytest.raises(UserError, match=r"dataset 'lastfm' does not take option\(s\) user_col"):
        prepare("lastfm", source=lastfm, user_col="u", progress=False)
    with pytest.raises(UserError, match=r"dataset 'beauty' needs --source PATH: one user per line"):
        prepare("beauty", progress=False)
    with pytest.raises(UserError, match=r"unknown dataset 'ml-2m'; known datasets: ml-100k, ml-1m"):
        prepare("ml-2m", progress=False)
    assert not (data_cache / "prepared").exists() or list((data_cache / "prepared").iterdir()) == []


def test_load_prepared_rejects_non_datasets(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a prepared dataset"):
        load_prepared(tmp_path)
