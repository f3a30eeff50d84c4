"""Every reader against what files from other systems hold, through ``prepare``: one table of formats, one of
variants.

A clean file of each format is prepared once. Each variant that means the same thing (a byte order mark, CRLF line
ends, both, blank lines at the end, tabs where blanks separate the fields) must prepare to the same dataset: the
same ``content_hash`` and the same tables, ids included, read again from the variant in a cache of its own. A bad
token must be a UserError naming the file and its line; an empty file and a header alone, a UserError that says
so. A refused file leaves nothing in the cache.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from study.data import prepare
from study.errors import UserError

# user, item, rating, timestamp: user 10 sorts after 2 only as a number, the order a BOM on "1" used to break
ROWS = [
    (1, 10, 5, 100), (1, 20, 4, 101), (1, 30, 3, 102),
    (2, 20, 5, 200), (2, 40, 1, 201), (2, 10, 2, 202),
    (10, 30, 4, 50), (10, 10, 4, 51), (10, 50, 2, 52),
    (3, 50, 5, 300), (3, 20, 5, 301), (3, 40, 5, 302),
]
BAD_ROW = 4  # 0-based index in ROWS of the row whose id (or time) becomes "9x4": (2, 40, 1, 201)


def _lines(pattern: str, header: str | None = None, rows: list[tuple] = ROWS) -> str:
    text = "".join(pattern.format(*row) + "\n" for row in rows)
    return (header + "\n" if header else "") + text


def _s3rec() -> str:
    users: dict[int, list[int]] = {}
    for user, item, _, _ in ROWS:
        users.setdefault(user, []).append(item)
    return "".join(f"{user} {' '.join(map(str, items))}\n" for user, items in users.items())


@dataclass
class Format:
    """One format: its source (a file, or a folder of shards), the recipe that reads it, and how a bad token, a
    header alone, an empty file are reported."""

    recipe: str
    files: dict[str, str]  # relative path -> clean text
    bad: tuple[str, int, str, str]  # (file, 1-based line, old text, new text): one token spoilt
    header_only: str  # the first line alone (for formats without a header: a header someone added)
    header_error: str  # what the error says about it (a regex, after the file name)
    source: str = ""  # relative path given as --source; "" = the only file
    blank_separated: bool = False  # fields separated by blanks: tabs for spaces mean the same
    options: dict = field(default_factory=lambda: {"kcore": 0})


FORMATS = {
    "movielens u.data": Format(
        "ml-100k", {"u.data": _lines("{}\t{}\t{}\t{}")}, ("u.data", 5, "\t40\t", "\t9x4\t"),
        "user_id\titem_id\trating\ttimestamp", r", line 1: field 1 should be an integer"),
    "movielens ratings.dat": Format(
        "ml-1m", {"ratings.dat": _lines("{}::{}::{}::{}")}, ("ratings.dat", 5, "::40::", "::9x4::"),
        "UserID::MovieID::Rating::Timestamp", r", line 1: field 1 should be an integer"),
    "movielens ratings.csv": Format(
        "ml-20m", {"ratings.csv": _lines("{},{},{},{}", "userId,movieId,rating,timestamp")},
        ("ratings.csv", 6, ",40,", ",9x4,"), "userId,movieId,rating,timestamp",
        r": the file has a header but no interactions"),
    "recbole atomic .inter": Format(
        "ml-100k",
        {"ml-100k.inter": _lines("{}\t{}\t{}\t{}", "user_id:token\titem_id:token\trating:float\ttimestamp:float")},
        ("ml-100k.inter", 6, "\t201", "\t9x4"), "user_id:token\titem_id:token\trating:float\ttimestamp:float",
        r": the file has a header but no interactions"),
    "s3rec": Format(
        "lastfm", {"LastFM.txt": _s3rec()}, ("LastFM.txt", 2, " 40 ", " 9x4 "), "user items",
        r", line 1: field 1 should be an integer", blank_separated=True),
    "sasrec": Format(
        "video", {"Video.txt": _lines("{} {}")}, ("Video.txt", 5, " 40", " 9x4"), "user item",
        r", line 1: field 1 should be an integer", blank_separated=True),
    "generic csv": Format(
        "csv", {"events.csv": _lines("{},{},{},{}", "user,item,rating,timestamp")},
        ("events.csv", 6, ",201", ",9x4"), "user,item,rating,timestamp",
        r": the file has a header but no interactions"),
    "generic tsv": Format(
        "csv", {"events.tsv": _lines("{}\t{}\t{}\t{}", "user\titem\trating\ttimestamp")},
        ("events.tsv", 6, "\t201", "\t9x4"), "user\titem\trating\ttimestamp",
        r": the file has a header but no interactions"),
    "folder of csv shards": Format(
        "csv",
        {"shards/a/part-0.csv": _lines("{},{},{},{}", "user,item,rating,timestamp", ROWS[:5]),
         "shards/b/part-1.csv": _lines("{},{},{},{}", "user,item,rating,timestamp", ROWS[5:])},
        ("shards/b/part-1.csv", 3, ",30,4,50", ",30,4,9x4"), "user,item,rating,timestamp",
        r": the file has a header but no interactions", source="shards"),
}

BOM = codecs.BOM_UTF8
# variants of a clean file that mean the same interactions: (bytes -> bytes, only where blanks separate fields)
SAME: dict[str, tuple[Callable[[bytes], bytes], bool]] = {
    "bom": (lambda data: BOM + data, False),
    "crlf": (lambda data: data.replace(b"\n", b"\r\n"), False),
    "bom+crlf": (lambda data: BOM + data.replace(b"\n", b"\r\n"), False),
    "trailing blank lines": (lambda data: data + b"\n \n\n", False),
    "tabs": (lambda data: data.replace(b" ", b"\t"), True),
}
REFUSED = ("bad token", "empty", "header only")
CASES = [(fmt, variant) for fmt in FORMATS for variant, (_, blanks) in SAME.items()
         if FORMATS[fmt].blank_separated or not blanks] + [(fmt, variant) for fmt in FORMATS for variant in REFUSED]


def _write(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def _prepare(fmt: Format, folder: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SEQREC_DATA", str(cache))
    source = folder / (fmt.source or next(iter(fmt.files)))
    return prepare(fmt.recipe, source=source, max_len=4, progress=False, **fmt.options)


def _content(path: Path) -> tuple:
    """What a prepared directory holds, less where and when it was made."""
    meta = json.loads((path / "meta.json").read_text())
    counts = {key: meta[key] for key in ("content_hash", "num_users", "num_items", "num_interactions", "raw")}
    return counts, pq.read_table(path / "sequences.parquet"), pq.read_table(path / "items.parquet")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """Each format's clean source, prepared once."""
    prepared = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name, fmt in FORMATS.items():
            folder = tmp_path_factory.mktemp("clean")
            _write(folder, {path: text.encode() for path, text in fmt.files.items()})
            prepared[name] = _content(_prepare(fmt, folder, folder / "cache", monkeypatch))
    return prepared


def _spoilt(fmt: Format, variant: str) -> tuple[dict[str, bytes], str]:
    """The files of a refused variant and the error it must raise (a regex)."""
    if variant == "bad token":
        name, line, old, new = fmt.bad
        lines = fmt.files[name].split("\n")
        assert old in lines[line - 1], (name, line, lines[line - 1])
        lines[line - 1] = lines[line - 1].replace(old, new, 1)
        files = {**fmt.files, name: "\n".join(lines)}
        return {p: t.encode() for p, t in files.items()}, rf"{re.escape(name)}, line {line}: .*'9x4'"
    first = next(iter(fmt.files))
    if variant == "empty":
        return {path: b"" for path in fmt.files}, rf"{re.escape(first)}: the file is empty$"
    return {path: fmt.header_only.encode() + b"\n" for path in fmt.files}, re.escape(first) + fmt.header_error


@pytest.mark.parametrize(("name", "variant"), CASES, ids=[f"{f}: {v}" for f, v in CASES])
def test_reader_robustness(name: str, variant: str, clean: dict[str, tuple], tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    fmt, cache = FORMATS[name], tmp_path / "cache"
    if variant in SAME:
        change, _ = SAME[variant]
        _write(tmp_path, {path: change(text.encode()) for path, text in fmt.files.items()})
        counts, sequences, items = _content(_prepare(fmt, tmp_path, cache, monkeypatch))
        clean_counts, clean_sequences, clean_items = clean[name]
        assert counts == clean_counts  # the content_hash first: the same source, the same dataset
        assert sequences.equals(clean_sequences) and items.equals(clean_items)  # ids and raw ids included
        return
    files, message = _spoilt(fmt, variant)
    _write(tmp_path, files)
    with pytest.raises(UserError) as refused:
        _prepare(fmt, tmp_path, cache, monkeypatch)
    assert re.search(message, str(refused.value)), str(refused.value)
    assert "\n" not in str(refused.value) and type(refused.value) is UserError  # one line, not a pandas error
    left = [path for path in cache.rglob("*") if path.is_file() or path.name != "prepared"]
    assert left == []  # neither a prepared directory nor a kept copy of the source


NORMAL_FORMS = [  # (text as written, words, as every reader sees it)
    (b"1 2 3\n4 5\n", False, b"1 2 3\n4 5\n"),  # a clean file is its own normal form
    (b"1 2 3\n4 5\t", False, b"1 2 3\n4 5\t"),  # ... and so is one without a final line end
    (BOM + b"1 2 3\r\n4 5\r\n\r\n \r\n", False, b"1 2 3\n4 5\n"),
    (b"1\r2\r", False, b"1\n2\n"),
    (b"a,b\n1,\t\n\n", False, b"a,b\n1,\t\n"),  # blanks that may be values stay where blanks are no separators
    (BOM + b"  1\t\t2 3 \r\n\r\n4 5\t\r\n \t\n", True, b"1 2 3\n\n4 5\n"),  # the blank line 2 keeps line numbers
    (b"12 34\t\t56\r\n78  9", True, b"12 34 56\n78 9"),
    (b"", False, b""), (BOM, True, b""), (b"\n\n \n", False, b""),
]


@pytest.mark.parametrize("read_size", [1, 2, 3, 5, 1 << 20])
def test_normal_form_in_any_block_size(read_size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The normal form is read block by block: a CRLF, a byte order mark or a run of blanks cut by a block's end
    reads as a whole one, and the checksum is the sha256 of what the readers read."""
    import hashlib

    from study.data import files

    monkeypatch.setattr(files, "READ_SIZE", read_size)
    path = tmp_path / "f.txt"
    for written, words, normal in NORMAL_FORMS:
        path.write_bytes(written)
        with files.open_text(path, words=words) as fh:
            assert fh.read() == normal, (written, words)
        assert files.checksum(path, words=words) == hashlib.sha256(normal).hexdigest()
