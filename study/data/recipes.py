"""The dataset recipes: a small registry from a name to how that dataset is obtained and filtered.

A recipe says where the raw interactions come from (a GroupLens download, a file the user passes with
``--source``, or the synthetic generator), which reader parses them, the default k-core, and the counts a
correct copy has, which are checked after reading.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from study.data import readers, synthetic
from study.errors import UserError


@dataclass(frozen=True)
class Counts:
    """Raw counts of a dataset before any filtering."""

    interactions: int
    users: int
    items: int

    def as_dict(self) -> dict[str, int]:
        return {"interactions": self.interactions, "users": self.users, "items": self.items}


@dataclass(frozen=True)
class Recipe:
    """How to obtain and filter one dataset.

    ``reader`` parses a located source file (None for the synthetic generator). ``filenames`` are the glob
    patterns looked for, in order of preference, when ``--source`` (or a download) is a folder or a zip.
    ``download`` is the zip's file name under the MovieLens base URL (None: ``--source`` is required).
    ``options`` are the extra keyword options the recipe accepts, with their defaults. ``words``: blanks separate
    the fields (any run of spaces and tabs), so the source's normal form, which its checksum hashes, joins them
    with one space as its reader does (:func:`study.data.files.open_text`).
    """

    name: str
    description: str
    reader: Callable[..., pd.DataFrame] | None
    default_kcore: int
    source_format: str
    filenames: tuple[str, ...] = ()
    download: str | None = None
    expected: Counts | None = None
    options: dict[str, Any] = field(default_factory=dict)
    words: bool = False

    @property
    def synthetic(self) -> bool:
        return self.reader is None

    def resolve_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """Validate ``options`` against what this recipe accepts and fill in the defaults."""
        if self.synthetic:
            return synthetic.resolve_params(options)
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            accepted = (
                f"it accepts {', '.join(self.options)}" if self.options else "it takes no extra options"
            )
            raise UserError(f"dataset '{self.name}' does not take option(s) {', '.join(unknown)}; {accepted}")
        resolved = {**self.options, **options}
        if "time_col" in resolved and str(resolved["time_col"]).lower() in ("", "none"):
            resolved["time_col"] = None  # keep file order
        return resolved


_S3REC = (
    "one user per line, 'user item1 item2 ...' separated by spaces or tabs, integer ids, chronological "
    "(the data/*.txt files of aHuiWang/CIKM2020-S3Rec)"
)
_SASREC = (
    "one interaction per line, 'user item' separated by a space or tab, integer ids, grouped by user and "
    "chronological "
    "(the data/*.txt files of kang205/SASRec)"
)
_MOVIELENS = (
    "the GroupLens zip, its unpacked folder, or the ratings file itself "
    "(u.data, ratings.dat, ratings.csv, or a RecBole atomic .inter file)"
)
_MOVIELENS_FILES = ("u.data", "ratings.dat", "ratings.csv", "*.inter")
_PREFILTERED = (
    "Already filtered and ordered by the file's authors, so no k-core filter is applied by default (kcore=0)."
)
_MOVIELENS_NOTE = (
    "Downloaded from GroupLens on first use (or --source). All ratings count as implicit feedback; "
    "default 5-core, iterated on users and items until stable (as ELASTIC/RecGRELA)."
)


def _movielens(name: str, title: str, expected: Counts) -> Recipe:
    return Recipe(
        name=name,
        description=f"{title}. {_MOVIELENS_NOTE}",
        reader=readers.read_movielens,
        default_kcore=5,
        source_format=_MOVIELENS,
        filenames=_MOVIELENS_FILES,
        download=f"{name}.zip",
        expected=expected,
    )


def _s3rec(name: str, title: str, filename: str, expected: Counts | None) -> Recipe:
    return Recipe(
        name=name,
        description=f"{title}, S3Rec preprocessing ({filename}). {_PREFILTERED}",
        reader=readers.read_s3rec,
        default_kcore=0,
        source_format=_S3REC,
        filenames=(filename,),
        expected=expected,
        words=True,
    )


_TABLE_OPTIONS = {"user_col": "user", "item_col": "item", "time_col": "timestamp"}

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        _movielens("ml-100k", "MovieLens 100K", Counts(100_000, 943, 1_682)),
        _movielens("ml-1m", "MovieLens 1M", Counts(1_000_209, 6_040, 3_706)),
        _movielens("ml-20m", "MovieLens 20M", Counts(20_000_263, 138_493, 26_744)),
        _s3rec("beauty", "Amazon Beauty (2014, 5-core)", "Beauty.txt", Counts(198_502, 22_363, 12_101)),
        _s3rec("sports", "Amazon Sports and Outdoors (2014, 5-core)", "Sports_and_Outdoors.txt", None),
        _s3rec("toys", "Amazon Toys and Games (2014, 5-core)", "Toys_and_Games.txt", None),
        _s3rec("yelp", "Yelp", "Yelp.txt", None),
        _s3rec("lastfm", "LastFM", "LastFM.txt", Counts(52_551, 1_090, 3_646)),
        Recipe(
            name="video",
            description=f"Amazon Video Games, SASRec preprocessing (Video.txt). {_PREFILTERED}",
            reader=readers.read_sasrec,
            default_kcore=0,
            source_format=_SASREC,
            filenames=("Video.txt",),
            expected=Counts(287_107, 31_013, 23_715),
            words=True,
        ),
        Recipe(
            name="synthetic",
            description=(
                "Seeded synthetic sequences: Zipf popularity, user interest clusters, Markov transitions; "
                "set users/items/length/seed/... with --users --items --length --seed or --param key=value. "
                "No k-core filter by default."
            ),
            reader=None,
            default_kcore=0,
            source_format="generated; takes no --source",
        ),
        Recipe(
            name="csv",
            description=(
                "Any CSV/TSV with a header row; name the columns with --user-col --item-col --time-col "
                "(--time-col none keeps file order). No k-core filter unless --kcore is given."
            ),
            reader=readers.read_table,
            default_kcore=0,
            source_format="a CSV (or .tsv) file with a header row naming the user, item and time columns",
            options=_TABLE_OPTIONS,
        ),
        Recipe(
            name="parquet",
            description=(
                "Any Parquet file; name the columns with --user-col --item-col --time-col "
                "(--time-col none keeps file order). No k-core filter unless --kcore is given."
            ),
            reader=functools.partial(readers.read_table, fmt="parquet"),
            default_kcore=0,
            source_format="a Parquet file with user, item and time columns",
            options=_TABLE_OPTIONS,
        ),
    ]
}

DEFAULT_RECIPE = "ml-100k"


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; an unknown name is a UserError that lists the known ones."""
    try:
        return RECIPES[name]
    except KeyError:
        raise UserError(f"unknown dataset '{name}'; known datasets: {', '.join(RECIPES)}") from None
