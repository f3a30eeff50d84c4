"""Readers for the interaction file formats the recipes accept.

Every reader is a pure function of its input file and returns a :class:`pandas.DataFrame` with the columns
``user``, ``item`` (int64 or str) and ``timestamp`` (float64; all NaN when the format has no timestamps), one
row per interaction, in file order (the row order is the tie-breaker of the chronological sort later on).

Parsing is vectorised with ``pd.read_csv``. When the fast path fails, or leaves a hole that means a malformed
line, a slow line-by-line pass over the same file finds the first bad line, so that the error names the file
and the line number. That pass only runs on files that are already known to be broken.
"""

from __future__ import annotations

import csv
import io
import math
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd

from study.errors import UserError

COLUMNS = ["user", "item", "timestamp"]


@dataclass(frozen=True)
class ZipMember:
    """A file inside a zip archive, readable without extracting it to disk."""

    archive: Path
    member: str

    def __str__(self) -> str:
        return f"{self.archive}:{self.member}"

    @property
    def name(self) -> str:
        return self.member.rsplit("/", 1)[-1]


Source = str | Path | ZipMember


def source_name(src: Source) -> str:
    """The file name (basename) of a source, used to pick a reader."""
    return src.name if isinstance(src, ZipMember) else Path(src).name


@contextmanager
def open_binary(src: Source) -> Iterator[IO[bytes]]:
    """Open a plain file or a zip member for binary reading; missing or corrupt files become UserErrors."""
    try:
        if isinstance(src, ZipMember):
            with zipfile.ZipFile(src.archive) as zf, zf.open(src.member) as fh:
                yield fh
        else:
            with open(src, "rb") as fh:
                yield fh
    except FileNotFoundError as exc:
        raise UserError(f"file not found: {src}") from exc
    except IsADirectoryError as exc:
        raise UserError(f"expected a file but got a directory: {src}") from exc
    except zipfile.BadZipFile as exc:
        raise UserError(f"corrupt zip archive {getattr(src, 'archive', src)}: {exc}") from exc


# ----------------------------------------------------------------------------------------------------
# Diagnostics: find the first malformed line of a delimited file.


def _check_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


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
    src: Source, *, sep: str | None, kinds: Sequence[str], header_lines: int, what: str
) -> UserError:
    """Scan ``src`` line by line and return a UserError describing the first line that does not parse.

    ``sep=None`` splits on runs of whitespace; ``kinds`` gives the expected kind of each field ("int",
    "float", "token", "any"). Only runs after the vectorised parse failed.
    """
    try:
        with open_binary(src) as fh:
            text = io.TextIOWrapper(fh, encoding="utf-8", newline=None)
            for lineno, line in enumerate(text, start=1):
                if lineno <= header_lines:
                    continue
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                fields = line.split(sep) if sep is not None else line.split()
                if len(fields) != len(kinds):
                    return UserError(
                        f"{src}, line {lineno}: expected {len(kinds)} fields ({what}), found {len(fields)}: "
                        f"{line[:80]!r}"
                    )
                for pos, (value, kind) in enumerate(zip(fields, kinds, strict=True), start=1):
                    check, expected = _CHECKS[kind]
                    if not check(value.strip()):
                        return UserError(
                            f"{src}, line {lineno}: field {pos} should be {expected} ({what}), got {value!r}"
                        )
    except UnicodeDecodeError as exc:
        return UserError(f"{src}: not a UTF-8 text file ({exc.reason} at byte {exc.start})")
    return UserError(f"{src}: cannot parse as {what}")


def _read_fast(src: Source, **kwargs: object) -> pd.DataFrame | None:
    """``pd.read_csv`` on ``src``, or None when pandas rejects the file (the caller then diagnoses it)."""
    try:
        with open_binary(src) as fh:
            return pd.read_csv(fh, **kwargs)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError):
        # ParserError: wrong field count; ValueError: a value that does not convert to the column dtype.
        return None
    except pd.errors.EmptyDataError:
        raise UserError(f"{src}: the file is empty") from None


def _frame(user: np.ndarray, item: np.ndarray, timestamp: np.ndarray | pd.Series | None) -> pd.DataFrame:
    ts = np.full(len(user), np.nan) if timestamp is None else np.asarray(timestamp, dtype=np.float64)
    return pd.DataFrame({"user": user, "item": item, "timestamp": ts})


def _require_rows(df: pd.DataFrame, src: Source) -> pd.DataFrame:
    if len(df) == 0:
        raise UserError(f"{src}: the file contains no interactions")
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
        dtype={"user": "int64", "item": "int64", "rating": "float64", "timestamp": "float64"},
        quoting=csv.QUOTE_NONE,
    )
    if df is None or df[["rating", "timestamp"]].isna().to_numpy().any():
        raise _find_bad_line(src, sep="\t", kinds=["int", "int", "float", "float"], header_lines=0, what=what)
    return _require_rows(_frame(df["user"].to_numpy(), df["item"].to_numpy(), df["timestamp"]), src)


def read_movielens_dat(src: Source) -> pd.DataFrame:
    """MovieLens-1M/10M ``ratings.dat``: ``user::item::rating::timestamp``, no header.

    ``::`` is a multi-character separator that would force pandas' slow Python engine; splitting on ``:`` with
    the C engine gives seven fields whose odd positions are empty, which is the same thing at C speed.
    """
    what = "MovieLens ratings.dat: user::item::rating::timestamp"
    df = _read_fast(src, sep=":", header=None, names=list(range(7)), dtype="float64", quoting=csv.QUOTE_NONE)
    if (
        df is None
        or df[[0, 2, 4, 6]].isna().to_numpy().any()
        or df[[1, 3, 5]].notna().to_numpy().any()
        or not (np.mod(df[[0, 2]].to_numpy(), 1) == 0).all()
    ):
        raise _find_bad_line(src, sep="::", kinds=["int", "int", "float", "float"], header_lines=0, what=what)
    return _require_rows(_frame(df[0].to_numpy(np.int64), df[2].to_numpy(np.int64), df[6]), src)


def read_movielens_csv(src: Source) -> pd.DataFrame:
    """MovieLens-20M/25M/32M ``ratings.csv``: header ``userId,movieId,rating,timestamp``."""
    what = "MovieLens ratings.csv: userId,movieId,rating,timestamp"
    with open_binary(src) as fh:
        header = fh.readline().decode("utf-8", errors="replace").strip()
    if [h.strip() for h in header.split(",")] != ["userId", "movieId", "rating", "timestamp"]:
        raise UserError(
            f"{src}, line 1: expected the header 'userId,movieId,rating,timestamp', got {header!r}"
        )
    df = _read_fast(
        src,
        sep=",",
        header=0,
        names=["user", "item", "rating", "timestamp"],
        dtype={"user": "int64", "item": "int64", "rating": "float64", "timestamp": "float64"},
    )
    if df is None or df[["rating", "timestamp"]].isna().to_numpy().any():
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
    with open_binary(src) as fh:
        header = fh.readline().decode("utf-8", errors="replace").rstrip("\r\n")
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
# Files published with S3Rec and SASRec (already ordered and filtered by their authors; no timestamps)


def _as_ids(values: list[str]) -> np.ndarray:
    """Integer ids when every token is an integer (the usual case), else the tokens as strings."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (ValueError, OverflowError):
        return np.asarray(values, dtype=object)


def read_s3rec(src: Source) -> pd.DataFrame:
    """One user per line, ``user i1 i2 ... in`` separated by whitespace, chronological (S3Rec data files)."""
    users: list[str] = []
    lengths: list[int] = []
    items: list[str] = []
    with open_binary(src) as fh:
        try:
            lines = fh.read().decode("utf-8").splitlines()
        except UnicodeDecodeError as exc:
            raise UserError(f"{src}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
    for lineno, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 2:
            raise UserError(
                f"{src}, line {lineno}: expected 'user item1 item2 ...' "
                "(one user per line, whitespace-separated), "
                f"got {line[:80]!r}"
            )
        users.append(parts[0])
        lengths.append(len(parts) - 1)
        items.extend(parts[1:])
    if not users:
        raise UserError(f"{src}: the file contains no interactions")
    user_col = np.repeat(_as_ids(users), lengths)
    return _frame(user_col, _as_ids(items), None)


def read_sasrec(src: Source) -> pd.DataFrame:
    """One interaction per line, ``user item`` separated by whitespace, grouped by user and chronological
    (SASRec data files)."""
    what = "'user item' per line"
    df = _read_fast(src, sep=r"\s+", header=None, names=["user", "item"], dtype="str", quoting=csv.QUOTE_NONE)
    if df is None or df.isna().to_numpy().any():
        raise _find_bad_line(src, sep=None, kinds=["token", "token"], header_lines=0, what=what)
    return _require_rows(_frame(_as_ids(df["user"].tolist()), _as_ids(df["item"].tolist()), None), src)


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
    with open_binary(src) as fh:
        header = fh.readline().decode("utf-8", errors="replace").rstrip("\r\n")
    _missing_columns(src, wanted, next(csv.reader([header], delimiter=sep)) if header else [])
    try:
        with open_binary(src) as fh:
            df = pd.read_csv(
                fh, sep=sep, usecols=wanted, dtype=dict.fromkeys(id_cols, "str"), skip_blank_lines=False
            )
    except (ValueError, pd.errors.ParserError) as exc:
        raise UserError(f"{src}: cannot parse as CSV ({exc})".replace("\n", " ")) from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{src}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
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
    return _require_rows(_frame(df[user_col].to_numpy(), df[item_col].to_numpy(), ts), src)
