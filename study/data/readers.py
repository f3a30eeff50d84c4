"""Readers for the interaction file formats the recipes accept.

Every reader is a pure function of its input file and returns a :class:`pandas.DataFrame` with the columns
``user``, ``item`` (int64 or str) and ``timestamp`` (float64; all NaN when the format has no timestamps), one
row per interaction, in file order (the row order is the tie-breaker of the chronological sort later on).

Every reader reads text through :func:`study.data.files.open_text`, so a byte order mark, CRLF line ends, blank
lines at the end and (where blanks separate the fields) tabs or runs of spaces read as in the published file.

A value must be what its format says: ids are integers in the MovieLens, S3Rec and SASRec files (their authors'
code parses them with ``int``), so ``9x4`` or ``5.0`` is a malformed line, not a new item; RecBole ``token``
fields and the generic tables' id columns are text, and time columns are numbers (or dates, generic tables).
An empty file, or a header with no line under it, is a UserError too.

Parsing is vectorised with ``pd.read_csv``. When the fast path fails, or leaves a hole or a non-integer id that
means a malformed line, a slow line-by-line pass over the same text finds the first bad line, so that the error
names the file and the line number. That pass only runs on files that are already known to be broken.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from study.data.files import Source, decode, open_binary, open_text, source_name
from study.errors import UserError

COLUMNS = ["user", "item", "timestamp"]
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64 = np.iinfo(np.int64)
_HEADER_ONLY = "a header but no interactions"


# ----------------------------------------------------------------------------------------------------
# Diagnostics: find the first malformed line of a delimited file.


def _check_int(value: str) -> bool:
    """An integer id: ASCII digits with an optional sign, within int64 (``int`` alone would take ``1_0``)."""
    if _INTEGER.fullmatch(value) is None or len(value.lstrip("+-").lstrip("0")) > 19:  # 19: int64's digits
        return False
    return _INT64.min <= int(value) <= _INT64.max


def _check_float(value: str) -> bool:
    try:
        return not math.isnan(float(value))
    except ValueError:
        return False


# field kind -> (check, what the message says it should be)
_CHECKS: dict[str, tuple[Callable[[str], bool], str]] = {
    "int": (_check_int, "an integer"),
    "float": (_check_float, "a number"),
    "token": (lambda v: v != "", "a non-empty value"),
    "any": (lambda v: True, "anything"),
}


def _find_bad_line(
    src: Source,
    *,
    sep: str,
    kinds: Sequence[str],
    header_lines: int,
    what: str,
    words: bool = False,
    more: bool = False,
) -> UserError:
    """Scan ``src`` line by line and return a UserError describing the first line that does not parse.

    ``kinds`` gives the expected kind of each field ("int", "float", "token", "any"); with ``more`` a line may
    have more fields, of the last kind. ``words`` reads the text as the whitespace-separated readers do. Only runs
    after the vectorised parse failed.
    """
    lineno = 0
    with open_text(src, words=words) as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = decode(raw, src, first_line=lineno).rstrip("\n")
            if lineno <= header_lines or not line.strip():
                continue
            fields = line.split(sep)
            if len(fields) != len(kinds) and not (more and len(fields) > len(kinds)):
                return UserError(
                    f"{src}, line {lineno}: expected {len(kinds)}{' or more' if more else ''} fields ({what}), "
                    f"found {len(fields)}: {line[:80]!r}"
                )
            for pos, value in enumerate(fields, start=1):
                check, expected = _CHECKS[kinds[min(pos, len(kinds)) - 1]]
                if not check(value.strip()):
                    return UserError(f"{src}, line {lineno}: field {pos} should be {expected} ({what}), got {value!r}")
    # pandas reads an empty text, or a header alone, as no rows of no type when it is given the column names
    if lineno == 0:
        return UserError(f"{src}: the file is empty")
    if lineno <= header_lines:
        return UserError(f"{src}: the file has {_HEADER_ONLY}")
    return UserError(f"{src}: cannot parse as {what}")


def _read_fast(src: Source, *, words: bool = False, **kwargs: object) -> pd.DataFrame | None:
    """``pd.read_csv`` on the text of ``src``, or None when pandas rejects it (the caller then diagnoses it)."""
    try:
        with open_text(src, words=words) as fh:
            return pd.read_csv(fh, **kwargs)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError):
        # ParserError: wrong field count; ValueError: a value that does not convert to the column dtype.
        return None
    except pd.errors.EmptyDataError:
        raise UserError(f"{src}: the file is empty") from None


def _header(src: Source) -> str:
    """The first line of a format with a header row (an empty file is an error of its own, not a bad header)."""
    with open_text(src) as fh:
        line = fh.readline()
    if not line:
        raise UserError(f"{src}: the file is empty")
    return decode(line, src).rstrip("\n")


def _integer_ids(df: pd.DataFrame, columns: Sequence[object]) -> bool:
    """Whether pandas parsed these columns as int64: it falls back to float for ``5.0`` or ``1e3`` and to text
    for ``9x4``, none of which is an integer id (so a column without its own dtype tells the two apart)."""
    return all(df[column].dtype == np.int64 for column in columns)


def _frame(user: np.ndarray, item: np.ndarray, timestamp: np.ndarray | pd.Series | None) -> pd.DataFrame:
    ts = np.full(len(user), np.nan) if timestamp is None else np.asarray(timestamp, dtype=np.float64)
    return pd.DataFrame({"user": user, "item": item, "timestamp": ts})


def _require_rows(df: pd.DataFrame, src: Source, empty: str = _HEADER_ONLY) -> pd.DataFrame:
    if len(df) == 0:
        raise UserError(f"{src}: the file has {empty}")
    return df


# ----------------------------------------------------------------------------------------------------
# MovieLens


def read_movielens_udata(src: Source) -> pd.DataFrame:
    """MovieLens-100K ``u.data``: tab-separated ``user item rating timestamp``, no header."""
    what = "MovieLens u.data: user<TAB>item<TAB>rating<TAB>timestamp"
    df = _read_fast(
        src,
        sep="\t",
        header=None,
        names=["user", "item", "rating", "timestamp"],
        dtype={"rating": "float64", "timestamp": "float64"},
        quoting=csv.QUOTE_NONE,
    )
    if df is None or not _integer_ids(df, ["user", "item"]) or df[["rating", "timestamp"]].isna().to_numpy().any():
        raise _find_bad_line(src, sep="\t", kinds=["int", "int", "float", "float"], header_lines=0, what=what)
    return _frame(df["user"].to_numpy(), df["item"].to_numpy(), df["timestamp"])


def read_movielens_dat(src: Source) -> pd.DataFrame:
    """MovieLens-1M/10M ``ratings.dat``: ``user::item::rating::timestamp``, no header.

    ``::`` is a multi-character separator that would force pandas' slow Python engine; splitting on ``:`` with
    the C engine gives seven fields whose odd positions are empty, which is the same thing at C speed.
    """
    what = "MovieLens ratings.dat: user::item::rating::timestamp"
    df = _read_fast(src, sep=":", header=None, names=list(range(7)), dtype={4: "float64", 6: "float64"},
                    quoting=csv.QUOTE_NONE)
    if (
        df is None
        or not _integer_ids(df, [0, 2])
        or df[[4, 6]].isna().to_numpy().any()
        or df[[1, 3, 5]].notna().to_numpy().any()
    ):
        raise _find_bad_line(src, sep="::", kinds=["int", "int", "float", "float"], header_lines=0, what=what)
    return _frame(df[0].to_numpy(), df[2].to_numpy(), df[6])


def read_movielens_csv(src: Source) -> pd.DataFrame:
    """MovieLens-20M/25M/32M ``ratings.csv``: header ``userId,movieId,rating,timestamp``."""
    what = "MovieLens ratings.csv: userId,movieId,rating,timestamp"
    header = _header(src).strip()
    if [h.strip() for h in header.split(",")] != ["userId", "movieId", "rating", "timestamp"]:
        raise UserError(
            f"{src}, line 1: expected the header 'userId,movieId,rating,timestamp', got {header!r}"
        )
    df = _read_fast(
        src,
        sep=",",
        header=0,
        names=["user", "item", "rating", "timestamp"],
        dtype={"rating": "float64", "timestamp": "float64"},
    )
    if df is None or not _integer_ids(df, ["user", "item"]) or df[["rating", "timestamp"]].isna().to_numpy().any():
        raise _find_bad_line(src, sep=",", kinds=["int", "int", "float", "float"], header_lines=1, what=what)
    return _require_rows(_frame(df["user"].to_numpy(), df["item"].to_numpy(), df["timestamp"]), src)


MOVIELENS_FILES: dict[str, Callable[[Source], pd.DataFrame]] = {
    "u.data": read_movielens_udata,
    "ratings.dat": read_movielens_dat,
    "ratings.csv": read_movielens_csv,
}


def read_movielens(src: Source) -> pd.DataFrame:
    """Any MovieLens ratings file, recognised by its name: ``u.data``, ``ratings.dat``, ``ratings.csv``, or a
    RecBole atomic ``*.inter`` conversion of one of them."""
    name = source_name(src)
    if name in MOVIELENS_FILES:
        return MOVIELENS_FILES[name](src)
    if name.endswith(".inter"):
        return read_atomic(src)
    if name.endswith(".dat"):
        return read_movielens_dat(src)
    raise UserError(
        f"{src}: not a MovieLens ratings file "
        "(expected u.data, ratings.dat, ratings.csv or a RecBole .inter file)"
    )


# ----------------------------------------------------------------------------------------------------
# RecBole atomic files


def read_atomic(src: Source) -> pd.DataFrame:
    """RecBole atomic ``.inter`` file: tab-separated with a typed header such as
    ``user_id:token<TAB>item_id:token<TAB>rating:float<TAB>timestamp:float`` in any column order.

    ``user_id`` and ``item_id`` are required; ``timestamp`` is optional (file order is kept without it).
    """
    header = _header(src)
    names = [field.split(":", 1)[0].strip() for field in header.split("\t")]
    for required in ("user_id", "item_id"):
        if required not in names:
            raise UserError(
                f"{src}, line 1: RecBole atomic header has no '{required}' column "
                f"(expected e.g. 'user_id:token<TAB>item_id:token<TAB>timestamp:float', got {header[:80]!r})"
            )
    has_time = "timestamp" in names
    # Only the three used columns must parse; everything else (ratings, token_seq, ...) is read as text.
    dtype = {name: "float64" if name == "timestamp" else "str" for name in names}
    what = "RecBole atomic file with header " + repr(header[:80])
    df = _read_fast(
        src,
        sep="\t",
        header=0,
        names=names,
        dtype=dtype,
        quoting=csv.QUOTE_NONE,
        keep_default_na=False,
        na_values=dict.fromkeys(names, [""]),
    )
    needed = ["user_id", "item_id"] + (["timestamp"] if has_time else [])
    if df is None or df[needed].isna().to_numpy().any():
        kinds = [
            "token" if n in ("user_id", "item_id") else "float" if n == "timestamp" else "any" for n in names
        ]
        raise _find_bad_line(src, sep="\t", kinds=kinds, header_lines=1, what=what)
    ts = df["timestamp"] if has_time else None
    return _require_rows(_frame(df["user_id"].to_numpy(), df["item_id"].to_numpy(), ts), src)


# ----------------------------------------------------------------------------------------------------
# Files published with S3Rec and SASRec (already ordered and filtered by their authors; no timestamps).
# Blanks separate the fields: the text is read with ``words``, so each line is its ids joined by single spaces.

_S3REC = "S3Rec: 'user item1 item2 ...' per line, integer ids"
_SASREC = "SASRec: 'user item' per line, integer ids"


def read_s3rec(src: Source) -> pd.DataFrame:
    """One user per line, ``user i1 i2 ... in`` separated by blanks, chronological (S3Rec data files)."""
    with open_text(src, words=True) as fh:
        text = decode(fh.read(), src)
    users: list[str] = []
    lengths: list[int] = []
    items: list[str] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line:
            continue
        ids = line.split(" ")
        if len(ids) < 2:
            raise UserError(f"{src}, line {lineno}: expected 'user item1 item2 ...' (one user per line, "
                            f"separated by blanks), got {line[:80]!r}")
        users.append(ids[0])
        lengths.append(len(ids) - 1)
        items.extend(ids[1:])
    if not users:
        raise UserError(f"{src}: the file is empty")
    try:
        # numpy takes what Python's int takes (1_0, non-ASCII digits): the text must hold ASCII ids only
        if re.search(r"[^0-9+\- \n]", text):
            raise ValueError
        user_ids, item_ids = np.asarray(users, dtype=np.int64), np.asarray(items, dtype=np.int64)
    except (ValueError, OverflowError):
        raise _find_bad_line(src, sep=" ", kinds=["int", "int"], header_lines=0, what=_S3REC, words=True,
                             more=True) from None
    return _frame(np.repeat(user_ids, lengths), item_ids, None)


def read_sasrec(src: Source) -> pd.DataFrame:
    """One interaction per line, ``user item`` separated by blanks, grouped by user and chronological
    (SASRec data files)."""
    df = _read_fast(src, words=True, sep=" ", header=None, names=["user", "item"], quoting=csv.QUOTE_NONE)
    if df is None or not _integer_ids(df, ["user", "item"]):
        raise _find_bad_line(src, sep=" ", kinds=["int", "int"], header_lines=0, what=_SASREC, words=True)
    return _frame(df["user"].to_numpy(), df["item"].to_numpy(), None)


# ----------------------------------------------------------------------------------------------------
# Generic tables


def _to_seconds(values: pd.Series, src: Source, column: str, numbers: np.ndarray, unit: str) -> np.ndarray:
    """Numeric timestamps as they are; otherwise parse dates/times and convert to seconds since the epoch.

    ``numbers`` holds the line (or row) number of each value, for the error message.
    """
    if pd.api.types.is_datetime64_any_dtype(values):
        parsed = pd.to_datetime(values, utc=True)
        return (parsed - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(np.float64)
    numeric = pd.to_numeric(values, errors="coerce")
    if not numeric.isna().any():
        return numeric.to_numpy(np.float64)
    if numeric.notna().any():
        bad = int(np.flatnonzero(numeric.isna().to_numpy())[0])
    else:
        parsed = pd.to_datetime(values, errors="coerce", utc=True)
        if not parsed.isna().any():
            return (parsed - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(np.float64)
        bad = int(np.flatnonzero(parsed.isna().to_numpy())[0])
    raise UserError(
        f"{src}, {unit} {numbers[bad]}: column '{column}' should be a number or a date/time, "
        f"got {values.iloc[bad]!r}"
    )


def _missing_columns(src: Source, wanted: list[str], available: list[str]) -> None:
    missing = [c for c in wanted if c not in available]
    if missing:
        raise UserError(
            f"{src}: missing column(s) {', '.join(repr(m) for m in missing)} "
            f"(columns: {', '.join(available)}); "
            "name them with --user-col/--item-col/--time-col (--time-col none keeps file order)"
        )


def _read_parquet_columns(src: Source, wanted: list[str]) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_binary(src) as fh:
        try:
            table = pq.read_table(fh)
        except (pa.ArrowException, OSError, ValueError) as exc:  # the types pyarrow raises for a damaged file
            raise UserError(f"{src}: cannot read as Parquet ({exc})") from None
    _missing_columns(src, wanted, table.column_names)
    return table.select(wanted).to_pandas()


def _read_csv_columns(src: Source, wanted: list[str], sep: str, id_cols: list[str]) -> pd.DataFrame:
    header = _header(src)
    _missing_columns(src, wanted, next(csv.reader([header], delimiter=sep)) if header else [])
    try:
        with open_text(src) as fh:
            df = pd.read_csv(
                fh, sep=sep, usecols=wanted, dtype=dict.fromkeys(id_cols, "str"), skip_blank_lines=False
            )
    except (ValueError, pd.errors.ParserError) as exc:
        raise UserError(f"{src}: cannot parse as CSV ({exc})".replace("\n", " ")) from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{src}: not a UTF-8 text file ({exc.reason})") from None
    # Blank lines become all-NaN rows; dropping them keeps every other row's index equal to its position.
    return df[~df.isna().all(axis=1).to_numpy()]


def read_table(
    src: Source,
    *,
    user_col: str = "user",
    item_col: str = "item",
    time_col: str | None = "timestamp",
    fmt: str | None = None,
) -> pd.DataFrame:
    """A CSV/TSV (with a header row) or Parquet file; the user, item and time columns are named by the caller.

    ``time_col=None`` keeps the file order instead of sorting by time. Time values may be numbers or dates.
    ``fmt`` ("csv", "tsv" or "parquet") overrides the guess from the file extension.
    """
    wanted = [user_col, item_col] + ([time_col] if time_col else [])
    name = source_name(src).lower()
    if fmt is None:
        fmt = (
            "parquet"
            if name.endswith((".parquet", ".pq"))
            else "tsv"
            if name.endswith((".tsv", ".tab"))
            else "csv"
        )
    if fmt == "parquet":
        df = _read_parquet_columns(src, wanted)
        unit, numbers = "row", df.index.to_numpy() + 1
    else:
        sep = "\t" if fmt == "tsv" else ","
        df = _read_csv_columns(src, wanted, sep, [user_col, item_col])
        unit, numbers = "line", df.index.to_numpy() + 2  # line 1 is the header
    for col in wanted:
        holes = df[col].isna().to_numpy()
        if holes.any():
            raise UserError(f"{src}, {unit} {numbers[np.flatnonzero(holes)[0]]}: column '{col}' is empty")
    ts = _to_seconds(df[time_col], src, time_col, numbers, unit) if time_col else None
    frame = _frame(df[user_col].to_numpy(), df[item_col].to_numpy(), ts)
    return _require_rows(frame, src, "no rows" if fmt == "parquet" else _HEADER_ONLY)
