"""Turning a recipe into a prepared dataset directory: read, sort, filter, re-index, split, write atomically.

Processing, in order:

1. every rating is implicit feedback (ratings values are ignored, repeats are kept);
2. a stable chronological sort per user: by timestamp, then file order (formats without timestamps keep file
   order, which their authors made chronological);
3. an iterative k-core filter on users and items (repeated until no user and no item has fewer than k
   interactions; k from the recipe or ``kcore=``; 0 or 1 = no filter);
4. users with fewer than 3 interactions are dropped: leave-one-out needs a training, a validation and a test
   item (only possible when k < 3; the count is recorded in meta.json);
5. ids: users get 0..U-1 in the natural order of their raw ids (numeric when every raw id is a number); items
   get 1..N in order of first appearance in the (user, time)-sorted stream, 0 being the padding id. First
   appearance needs no ordering of raw item ids (which may be strings), and it reproduces the ids of files
   already numbered that way (the S3Rec files);
6. leave-one-out: the last item of each user is the test target, the one before the validation target, the
   rest is training.

The result goes to ``<cache>/prepared/<name>-<hash12>/`` where ``hash12`` starts the sha256 of the source
checksum(s), the recipe name, the filter and split options and :data:`FORMAT_VERSION`: the dataset's identity,
recorded as ``content_hash`` in meta.json and as ``dataset_hash`` in every result row. The window length is not
part of it: it is a model setting. The stored windows hold ``max_len + 1`` items for the longest ``max_len`` asked
so far; a longer request widens them in place from the stored sequences, without the source.
A new directory is written to a temporary directory beside it and renamed into place, so a directory under its
final name is always complete (and concurrent trials that prepare the same dataset cannot corrupt each other). A
preparation that fails or is refused, with either engine, leaves the cache as it found it: the temporary directory
goes, a source is kept (below) only once its directory is complete, and an archive the call downloaded is removed,
so that a retry downloads it again rather than reusing a file that may be why it failed.

A prepared dataset is addressable by name: ``prepare(name)`` without a source reuses the prepared copy of that
recipe (or re-reads its recorded source for another k-core), read with the options it was prepared with unless the
call names others (a table's column names), so an offline user gives ``--source`` and the columns once. A source
given for a downloadable recipe is kept in the cache (``<cache>/sources/``) like a download.

Steps 1-6 run in one process with pandas (:mod:`study.data.sequences`), or with Ray Data for sources larger than
one process should hold (:mod:`study.data.ray_engine`); both write the same dataset, so the engine is not part of
its identity.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from study.data import synthetic
from study.data.cache import (
    FORMAT_VERSION,
    PreparedCopy,
    copies_named,
    discard_kept,
    keep_source,
    kept_path,
    known_source,
    prepared_root,
    remembered_options,
)
from study.data.files import Source
from study.data.ray_engine import build_on_ray, choose_engine, estimate_rows, widen_parts
from study.data.recipes import Counts, Recipe, get_recipe
from study.data.sequences import (
    MIN_INTERACTIONS,
    Sequences,
    Summary,
    build_sequences,
    items_table,
    length_stats,
    sequences_table,
)
from study.data.sources import Shards, resolve_source, source_files
from study.errors import UserError

ITEMS_FILE = "items.parquet"  # added without a format bump: directories prepared before it lack it (see raw_items)
SPLIT = "leave-one-out"


def _say(progress: bool, message: str) -> None:
    """A progress note for a person watching a terminal; kept out of logs and pipes, where stderr must hold
    nothing but warnings and the one-line error."""
    if progress and sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)



def content_hash(name: str, options: dict[str, Any], checksums: list[str]) -> str:
    """sha256 (hex) identifying a prepared dataset: same inputs and options give the same directory."""
    payload = {"format_version": FORMAT_VERSION, "recipe": name, "options": options, "sources": checksums}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _directory(name: str, digest: str) -> Path:
    """The prepared directory of dataset ``name`` with content hash ``digest``."""
    return prepared_root() / f"{name}-{digest[:12]}"


def _publish(tmp: Path, final: Path, force: bool) -> None:
    """Move a complete temporary directory into place, replacing an older copy only under ``force``."""
    if force and final.exists():
        old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old-"))
        os.replace(final, old / final.name)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / "meta.json").is_file():
            raise
        # Another process finished the same content first; its copy is identical, keep it.
        shutil.rmtree(tmp, ignore_errors=True)


def _check_counts(recipe: Recipe, raw: Counts, info: dict, downloaded: bool) -> dict | None:
    """Compare raw counts with the recipe's known ones: fatal for a download, a warning for a user's file."""
    if recipe.expected is None:
        return None
    matched = raw == recipe.expected
    if not matched:
        got = ", ".join(f"{v:,} {k}" for k, v in raw.as_dict().items())
        want = ", ".join(f"{v:,} {k}" for k, v in recipe.expected.as_dict().items())
        if downloaded:
            Path(info["path"]).unlink(missing_ok=True)
            raise UserError(
                f"download of {info['url']} is not the expected {recipe.name}: it has {got}, expected "
                f"{want}; the file was removed from the cache, retry or pass a known-good copy with --source"
            )
        print(f"warning: {info['file']} has {got}; the published {recipe.name} has {want}", file=sys.stderr)
    return {"expected": recipe.expected.as_dict(), "matched": matched}


def _reuse(path: Path, max_len: int, *, progress: bool) -> Path:
    """Reuse a prepared directory, widening its stored windows first when ``max_len`` asks for more."""
    meta = json.loads((path / "meta.json").read_text())
    if int(meta["max_len"]) >= max_len:
        _say(progress, f"reusing {path}")
        return path
    _say(progress, f"widening the windows of {path} to {max_len} + 1 items")
    if (path / "sequences.parquet").is_dir():  # the Ray engine's layout: widened part by part
        widen_parts(path / "sequences.parquet", max_len)
        return _record_max_len(path, meta, max_len)
    table = pq.read_table(path / "sequences.parquet", columns=["user", "raw_user", "items"])
    items = table.column("items").combine_chunks()
    seqs = Sequences(raw_users=np.asarray(table.column("raw_user").to_pylist(), dtype=str),
                     indptr=np.asarray(items.offsets, dtype=np.int64),
                     items=np.asarray(items.values, dtype=np.int32), num_items=int(meta["num_items"]),
                     raw=Counts(**meta["raw"]), dropped_short_users=int(meta.get("dropped_short_users", 0)))
    partial = path / f".sequences.parquet.tmp-{os.getpid()}"
    try:
        pq.write_table(sequences_table(seqs, max_len), partial, compression="zstd")
        os.replace(partial, path / "sequences.parquet")  # readers that opened the old file keep reading it
    except BaseException:
        partial.unlink(missing_ok=True)  # a failed widening leaves the directory as it was
        raise
    return _record_max_len(path, meta, max_len)


def _record_max_len(path: Path, meta: dict, max_len: int) -> Path:
    meta["max_len"] = max_len
    partial_meta = path / f".meta.json.tmp-{os.getpid()}"
    try:
        partial_meta.write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(partial_meta, path / "meta.json")
    except BaseException:
        partial_meta.unlink(missing_ok=True)
        raise
    return path


def _build(recipe: Recipe, files: list[Source] | None, resolved: dict[str, Any], info: dict, k: int, engine: str,
           out: Path, max_len: int, progress: bool) -> Summary:
    """Read, filter and split with the chosen engine; writes ``out/sequences.parquet`` (a file, or a folder of
    parts for the Ray engine) and returns the statistics."""
    _say(progress, f"reading {info.get('file', 'synthetic generator')}")
    reader_options = {key: resolved[key] for key in recipe.options}
    frame = None
    if recipe.synthetic:
        frame = synthetic.generate(resolved)
        info["sha256"] = synthetic.fingerprint(frame)
    if engine == "ray":
        _say(progress, f"filtering ({k}-core) and splitting with Ray Data")
        return build_on_ray(frame if frame is not None else files, recipe.reader, reader_options, k,
                            label=recipe.name, out=out, max_len=max_len)
    if frame is None:
        frames = [recipe.reader(src, **reader_options) for src in files or []]
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)  # shards in file order
    _say(progress, f"filtering ({k}-core) and splitting {len(frame):,} interactions")
    seqs = build_sequences(frame, k, label=recipe.name)
    del frame
    pq.write_table(sequences_table(seqs, max_len), out / "sequences.parquet", compression="zstd")
    return Summary.of(seqs)


def _meta(name: str, recipe: Recipe, settings: dict, summary: Summary, verified: dict | None, info: dict, k: int,
          max_len: int, digest: str) -> dict:
    notes = [
        f"item ids are 1..{summary.num_items} in order of first appearance after sorting by (user, time); "
        "0 is padding",
        "user ids are 0..num_users-1 in the natural order of the raw user ids",
    ]
    if summary.dropped_short_users:
        notes.append(
            f"{summary.dropped_short_users} users with fewer than {MIN_INTERACTIONS} interactions were dropped: "
            "leave-one-out cannot split them"
        )
    return {
        "name": name,
        "recipe": {"name": name, **settings},
        "synthetic": recipe.synthetic,
        "num_users": summary.num_users,
        "num_items": summary.num_items,
        "num_interactions": summary.num_interactions,
        "length": length_stats(summary.lengths),
        "raw": summary.raw.as_dict(),
        "verified": verified,
        "source": info,
        "kcore": k,
        "max_len": max_len,  # the stored windows' length - 1 (widened in place when a model asks for more)
        "split": SPLIT,
        "dropped_short_users": summary.dropped_short_users,
        "notes": notes,
        "format_version": FORMAT_VERSION,
        "content_hash": digest,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def prepare(
    name: str,
    *,
    source: str | os.PathLike[str] | None = None,
    max_len: int = 200,
    kcore: int | None = None,
    force: bool = False,
    progress: bool = True,
    engine: str = "auto",
    **options: Any,
) -> Path:
    """Prepare dataset ``name`` (a recipe) and return its directory; reuse it when it already exists.

    ``source`` is a local zip, folder or file (required by the non-MovieLens recipes); ``max_len`` is the
    longest model input (the stored windows hold ``max_len + 1`` items); ``kcore`` overrides the recipe's
    k-core; ``options`` are recipe options (``user_col``/``item_col``/``time_col`` for csv/parquet, generator
    parameters for synthetic). ``force`` rebuilds an existing directory. ``engine`` is ``pandas`` (one process),
    ``ray`` (Ray Data, :mod:`study.data.ray_engine`) or ``auto``: Ray above ``$SEQREC_RAY_ENGINE_ROWS`` source
    interactions (default 20M). Both give the same dataset, so the engine is not part of its identity.
    """
    recipe = get_recipe(name)
    by_name = source is None and not recipe.synthetic
    copies = copies_named(name) if by_name else []
    if by_name:  # read the source as it was read before
        options = {**remembered_options(copies, recipe.options), **options}
    k, resolved, settings = _settings(recipe, max_len, kcore, engine, options)
    downloaded = None
    if recipe.synthetic:
        if source is not None:
            raise UserError(f"dataset '{name}' is generated and takes no --source")
        settings["generator_version"] = synthetic.GENERATOR_VERSION
        located, info, checksums = None, {"generator": "study.data.synthetic"}, []
    else:
        if by_name:
            known = known_source(name, copies, settings)
            if isinstance(known, PreparedCopy) and not force:
                return _reuse(known.path, max_len, progress=progress)
            source = known.source if isinstance(known, PreparedCopy) else known
        located, info, downloaded = resolve_source(recipe, source, progress)
        checksums = [info["sha256"]]
    digest = content_hash(name, settings, checksums)
    final = _directory(name, digest)
    if not force and (final / "meta.json").is_file():
        return _reuse(final, max_len, progress=progress)
    try:
        _write(recipe, located, info, settings, resolved, digest, engine=engine, max_len=max_len, force=force,
               progress=progress)
    except BaseException:
        if downloaded is not None:  # a failed preparation leaves the cache as it found it; a retry downloads again
            downloaded.unlink(missing_ok=True)
        raise
    _say(progress, f"wrote {final}")
    return final


def _settings(recipe: Recipe, max_len: int, kcore: int | None, engine: str,
              options: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """Check the arguments before any work (a download included): the k-core, the resolved recipe options and the
    settings that, with the source, are the dataset's identity (data, filter and split, never the window length)."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise UserError(f"max_len must be an integer of at least 2, got {max_len!r}")
    k = recipe.default_kcore if kcore is None else kcore
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise UserError(f"kcore must be a non-negative integer, got {k!r}")
    choose_engine(engine, 0)  # only checks the name here; the size decides later
    resolved = recipe.resolve_options(options)
    return k, resolved, {"kcore": k, **resolved}


def _write(recipe: Recipe, located: Source | Shards | None, info: dict, settings: dict, resolved: dict[str, Any],
           digest: str, *, engine: str, max_len: int, force: bool, progress: bool) -> None:
    """Build the prepared directory in a temporary folder beside its final place and move it there, then keep the
    source of a downloadable recipe given with --source. Whatever fails, with either engine, nothing of it stays in
    the cache: the temporary folder goes, and so does a kept copy of the source that this call made."""
    final = _directory(recipe.name, digest)
    kept = None
    if not recipe.synthetic and recipe.download is not None and "url" not in info:
        kept = kept_path(recipe.name, located, info)
        info["kept"] = str(kept)
    files = None if located is None else source_files(located)
    chosen = choose_engine(engine, estimate_rows(files, resolved if recipe.synthetic else None))
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    made_kept = False
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be readable like any other folder
        k = settings["kcore"]
        summary = _build(recipe, files, resolved, info, k, chosen, tmp, max_len, progress)
        verified = _check_counts(recipe, summary.raw, info, downloaded="url" in info)
        pq.write_table(items_table(summary.raw_items), tmp / ITEMS_FILE, compression="zstd")
        meta = _meta(recipe.name, recipe, settings, summary, verified, info, k, max_len, digest)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        made_kept = kept is not None and keep_source(kept, located)
        _publish(tmp, final, force)
    except BaseException:
        if made_kept:
            discard_kept(kept)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename


def prepared_copy(identity: dict[str, Any], max_len: int, *, source: str | os.PathLike[str] | None = None,
                  kcore: int | None = None, progress: bool = False, **options: Any) -> Path:
    """The prepared dataset a trial trained on, found by the identity its training state or exported model
    records (``name`` and ``content_hash``): the cached copy, widened to ``max_len`` if needed, or else the dataset
    prepared again from ``source``, ``kcore`` and ``options``, which must give the same content hash."""
    name, digest = identity.get("name"), identity.get("content_hash")
    if not name or not digest:
        raise UserError("the trial records no dataset identity (name, content_hash)")
    cached = _directory(name, digest)
    if (cached / "meta.json").is_file():
        return _reuse(cached, max_len, progress=progress)
    path = prepare(name, source=source, max_len=max_len, kcore=kcore, progress=progress, **options)
    found = json.loads((path / "meta.json").read_text()).get("content_hash")
    if found != digest:
        raise UserError(f"{path} holds {name} with content hash {found}, but the trial trained on {digest}: its "
                        "source changed since, or --source names another file")
    return path
