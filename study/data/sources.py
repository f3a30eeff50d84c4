"""Finding the file(s) a recipe reads: a download, a file, a member of a zip, or a folder of shards.

A folder given to the ``csv`` or ``parquet`` recipe is a sharded source: every file in it (and below it) with
that format's extension, in the order of their relative paths. That order is the file order of the whole source
(the tie-breaker of the chronological sort), and the shards' checksums together are its checksum, so adding,
removing or renaming a shard gives another prepared dataset.

A text file's checksum is that of its normal form (:func:`study.data.files.checksum`): a copy with a byte order
mark, CRLF line ends or blank lines at the end, or tabs for spaces where blanks separate the fields, is the same
source as the clean file, and prepares to the same dataset. A zip archive's checksum is that of its bytes (the
GroupLens downloads are identified by them).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from study.data.cache import cache_dir
from study.data.download import download, movielens_url
from study.data.files import Source, ZipMember, checksum
from study.data.recipes import Recipe
from study.errors import UserError

# Recipes whose folder sources are shards of one table, and the shard file names they read.
SHARD_PATTERNS: dict[str, tuple[str, ...]] = {
    "csv": ("*.csv", "*.tsv", "*.tab"),
    "parquet": ("*.parquet", "*.pq"),
}


@dataclass(frozen=True)
class Shards:
    """A folder whose files, in this order, are one source table."""

    folder: Path
    files: tuple[Path, ...]

    def __str__(self) -> str:
        return f"{self.folder} ({len(self.files)} shards)"


def source_files(located: Source | Shards) -> list[Source]:
    """The files of a located source, in file order (one file unless it is a folder of shards)."""
    return list(located.files) if isinstance(located, Shards) else [located]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _shards(recipe: Recipe, path: Path) -> Shards:
    patterns = SHARD_PATTERNS[recipe.name]
    files = sorted(
        (p for p in path.rglob("*") if p.is_file() and any(fnmatch.fnmatch(p.name.lower(), pat) for pat in patterns)
         and not any(part.startswith(".") for part in p.relative_to(path).parts)),
        key=lambda p: p.relative_to(path).parts,
    )
    if not files:
        raise UserError(f"{path}: no {' / '.join(patterns)} files in this folder; dataset '{recipe.name}' reads "
                        f"{recipe.source_format} (or a folder of such shards)")
    return Shards(path, tuple(files))


def locate(recipe: Recipe, path: Path) -> Source | Shards:
    """The file(s) to read inside ``path``: ``path`` itself, a matching file under a folder, a zip member, or
    every shard of a folder for the csv/parquet recipes."""
    if path.is_dir():
        if recipe.name in SHARD_PATTERNS:
            return _shards(recipe, path)
        if not recipe.filenames:
            raise UserError(
                f"{path} is a folder; dataset '{recipe.name}' needs a file: {recipe.source_format}"
            )
        for pattern in recipe.filenames:
            found = sorted(path.rglob(pattern), key=lambda p: (len(p.parts), str(p)))
            found = [p for p in found if p.is_file()]
            if found:
                return found[0]
        raise UserError(
            f"{path}: no {' / '.join(recipe.filenames)} in this folder; dataset '{recipe.name}' needs "
            f"{recipe.source_format}"
        )
    if path.suffix.lower() == ".zip" or (recipe.filenames and zipfile.is_zipfile(path)):
        try:
            with zipfile.ZipFile(path) as zf:
                names = [n for n in zf.namelist() if not n.endswith("/")]
        except (zipfile.BadZipFile, OSError) as exc:
            raise UserError(f"{path}: not a valid zip archive ({exc})") from None
        for pattern in recipe.filenames:
            found = sorted((n for n in names if fnmatch.fnmatch(n.rsplit("/", 1)[-1], pattern)), key=len)
            if found:
                return ZipMember(path, found[0])
        raise UserError(
            f"{path}: no {' / '.join(recipe.filenames) or 'usable file'} inside this zip; dataset "
            f"'{recipe.name}' needs {recipe.source_format}"
        )
    return path


def _checksum(recipe: Recipe, path: Path, located: Source | Shards) -> str:
    """sha256 of the source file's normal form, of a zip archive's bytes, or of the shards' relative names and
    checksums for a folder of shards."""
    try:
        if isinstance(located, ZipMember):
            return sha256_file(path)
        if not isinstance(located, Shards):
            return checksum(located, words=recipe.words)
        digest = hashlib.sha256()
        for shard in located.files:
            digest.update(f"{shard.relative_to(located.folder).as_posix()}\0{checksum(shard)}\n".encode())
        return digest.hexdigest()
    except OSError as exc:
        raise UserError(f"cannot read {exc.filename or path}: {exc.strerror or exc}") from None


def resolve_source(
    recipe: Recipe, source: str | os.PathLike[str] | None, progress: bool
) -> tuple[Source | Shards, dict, Path | None]:
    """Download or check the source and locate the file(s) to read; returns them, their meta.json description and
    the archive this call downloaded (None when it downloaded nothing), which a failed preparation removes."""
    info: dict[str, Any] = {}
    downloaded = None
    if source is None:
        if recipe.download is None:
            raise UserError(f"dataset '{recipe.name}' needs --source PATH: {recipe.source_format}")
        url = movielens_url(recipe.download)
        archive = cache_dir() / "downloads" / recipe.download
        hint = (
            f"Without internet access, download {recipe.download} on another machine and run: "
            f"python -m study.data prepare {recipe.name} --source PATH ({recipe.source_format})"
        )
        if not archive.is_file():
            downloaded = archive
        download(url, archive, progress=progress, hint=hint)
        path = archive
        info["url"] = url
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise UserError(f"source not found: {path}")
    try:
        located = locate(recipe, path)
        info["sha256"] = _checksum(recipe, path, located)
    except BaseException:
        if downloaded is not None:  # a zip without a ratings file: the next try downloads again
            downloaded.unlink(missing_ok=True)
        raise
    info["path"] = str(path.resolve())
    info["file"] = str(located)
    if isinstance(located, Shards):
        info["shards"] = len(located.files)
    return located, info, downloaded
