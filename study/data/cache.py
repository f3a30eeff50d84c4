"""The data cache: where prepared datasets and kept sources live, and which prepared copy a name refers to.

    <cache>/prepared/<name>-<hash12>/   sequences.parquet + meta.json (see :mod:`study.data`)
    <cache>/downloads/                  archives downloaded from GroupLens
    <cache>/sources/<name>/<sha12>/     sources given with --source for downloadable recipes, kept like a download
                                        (once prepared: a source that fails to prepare is not kept)

``<cache>`` is ``$SEQREC_DATA``, else ``~/.cache/seqrec-study``. A request by name without a source
(:func:`known_source`) reuses the prepared copy of that name and settings, or the one source that name was
prepared from; two different sources under one name are ambiguous and a clear error. Such a request reads the
source as it was read before (:func:`remembered_options`: a table's column names), unless it names other options.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from study.data.files import Source, ZipMember
from study.errors import UserError

# Bump whenever the processing or the file layout changes: old prepared directories are then not reused.
FORMAT_VERSION = 2  # 2: the identity hash leaves out max_len; sources of downloadable recipes are kept
CACHE_ENV = "SEQREC_DATA"


def cache_dir() -> Path:
    """The data cache: ``$SEQREC_DATA`` if set, else ``~/.cache/seqrec-study``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "seqrec-study").expanduser()


def prepared_root() -> Path:
    return cache_dir() / "prepared"


def kept_sources_root() -> Path:
    return cache_dir() / "sources"


def list_prepared() -> list[tuple[Path, dict]]:
    """Every complete prepared directory in the cache with its meta.json, sorted by name."""
    found = []
    root = prepared_root()
    if root.is_dir():
        for path in sorted(root.iterdir()):
            meta_file = path / "meta.json"
            if path.name.startswith(".") or not meta_file.is_file():
                continue
            try:
                found.append((path, json.loads(meta_file.read_text())))
            except (OSError, json.JSONDecodeError):
                continue
    return found


@dataclass
class PreparedCopy:
    """A prepared directory that matches a request made by name, and a readable copy of its source (or None)."""

    path: Path
    source: Path | None


def _identity(meta: dict) -> dict:
    """The identity settings recorded in a prepared copy's meta.json (everything but the name and window length)."""
    return {key: value for key, value in meta.get("recipe", {}).items() if key not in ("name", "max_len")}


def copy_options(meta: dict) -> dict[str, Any]:
    """The recipe options a prepared copy was read or generated with (a table's column names, a generator's sizes):
    its identity without the k-core and the generator's version, spelled as a study file's ``dataset.options``."""
    return {key: value for key, value in _identity(meta).items() if key not in ("kcore", "generator_version")}


def _readable_source(meta: dict) -> Path | None:
    """A copy of the source a prepared directory was made from that still exists: the kept one, else the original."""
    source = meta.get("source", {})
    for key in ("kept", "path"):
        if source.get(key) and Path(source[key]).exists():
            return Path(source[key])
    return None


def copies_named(name: str) -> list[tuple[Path, dict]]:
    """The prepared copies a request for ``name`` without a source may use (this format's only), with their meta."""
    return [(path, meta) for path, meta in list_prepared()
            if meta.get("name") == name and meta.get("format_version") == FORMAT_VERSION]


def known_source(name: str, copies: list[tuple[Path, dict]], settings: dict[str, Any]) -> PreparedCopy | Path | None:
    """What ``prepare(name)`` without a source should use, among ``copies`` (:func:`copies_named`): a prepared copy
    with these settings, else the one source this name was prepared from (to re-read it with other settings), else
    None (download, or ask for --source).

    Two different sources prepared under one name are ambiguous: a clear error lists them.
    """
    by_source: dict[str, list[tuple[Path, dict]]] = {}
    for path, meta in copies:
        by_source.setdefault(str(meta.get("source", {}).get("sha256")), []).append((path, meta))
    if len(by_source) > 1:
        described = "; ".join(f"{_describe_source(group[0][1])} (prepared {group[0][1].get('created', '?')})"
                              for group in by_source.values())
        raise UserError(f"dataset '{name}' is prepared from {len(by_source)} different sources: {described}. "
                        f"Choose one with --source PATH (dataset.source in a study file), or remove the copies "
                        f"you do not want from {prepared_root()} (python -m study.data list shows them)")
    if not by_source:
        return None
    (group,) = by_source.values()
    for path, meta in group:
        if _identity(meta) == settings:
            return PreparedCopy(path, _readable_source(meta))
    readable = [source for _, meta in group if (source := _readable_source(meta)) is not None]
    return readable[0] if readable else None


def remembered_options(copies: list[tuple[Path, dict]], option_names: Iterable[str]) -> dict[str, Any]:
    """The recipe options that all ``copies`` of a name (:func:`copies_named`) were read with, for a request by name
    that leaves them out: ``prepare csv --source FILE --time-col when`` once, then ``--dataset csv`` reads FILE's
    ``when`` column again rather than the default's, which FILE may not have. An option the copies disagree on is
    left out (the request then takes the recipe's default, or names the option)."""
    distinct: dict[str, set[str]] = {}  # option -> its values, JSON-encoded so that any value can be a set member
    for _, meta in copies:
        options = copy_options(meta)
        for option in option_names:
            if option in options:
                distinct.setdefault(option, set()).add(json.dumps(options[option], sort_keys=True))
    return {option: json.loads(next(iter(values))) for option, values in distinct.items() if len(values) == 1}


def _describe_source(meta: dict) -> str:
    source = meta.get("source", {})
    return source.get("url") or source.get("path") or source.get("generator") or "unknown source"


def kept_path(name: str, located: Source, info: dict) -> Path:
    """Where the cache keeps the source of a downloadable recipe given with --source (see :func:`keep_source`)."""
    original = Path(located.archive if isinstance(located, ZipMember) else located)
    return kept_sources_root() / name / info["sha256"][:12] / original.name


def keep_source(kept: Path, located: Source) -> bool:
    """Copy the source of a downloadable recipe to ``kept`` (:func:`kept_path`), so later runs need neither it nor
    the network; returns whether this call made the copy (False: it was there), which a preparation that fails
    afterwards then removes with :func:`discard_kept`."""
    if kept.is_file():
        return False
    original = Path(located.archive if isinstance(located, ZipMember) else located)
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_name(f".{kept.name}.{os.getpid()}.partial")  # per process: two copies never mix
    try:
        shutil.copyfile(original, partial)
        os.replace(partial, kept)
    except BaseException:
        partial.unlink(missing_ok=True)
        _remove_empty_folders(kept.parent)
        raise
    return True


def discard_kept(kept: Path) -> None:
    """Remove a kept source that a failed preparation copied, and the folders that held only it."""
    kept.unlink(missing_ok=True)
    _remove_empty_folders(kept.parent)


def _remove_empty_folders(folder: Path) -> None:
    """``folder`` and its parents up to the cache itself, as long as they are empty."""
    root = cache_dir()
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:  # not empty (or already gone): what is left belongs to someone else
            return
        folder = folder.parent
