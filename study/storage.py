"""Where a study's results live: a folder, or a cloud URI mirrored from a local working copy.

``storage:`` in a study file is either

* a folder (default ``results/<name>/``): every writer uses it directly; on a multi-node cluster it only needs to
  be on the driver's machine, because trials hand their results back to the driver through Ray;
* a URI that pyarrow opens (``s3://bucket/prefix``, ``gs://bucket/prefix``, ``hdfs://…``, ``abfs://…`` or
  ``file:///mounted/share``): the study still runs in a local working copy, ``results/<name>/``, because SQLite
  (Optuna's study), atomic renames and Ray Tune's experiment state need a real file system; a :class:`Mirror`
  uploads what changed after every finished trial (at most every :data:`PUSH_INTERVAL_S` seconds) and
  everything at the end. ``--resume`` on a machine without the working copy downloads it first, so a driver that
  dies with its disk (a Kubernetes pod, a spot instance) loses at most the trials since the last upload.

Credentials come from the environment, as for any pyarrow/AWS/GCP client: ``AWS_ACCESS_KEY_ID``/instance roles,
``AWS_ENDPOINT_URL`` for S3-compatible stores (MinIO, Ceph), ``GOOGLE_APPLICATION_CREDENTIALS``, …

``python -m study.storage pull URI FOLDER`` and ``push FOLDER URI`` copy a study by hand (e.g. to report on a
laptop a study that ran on a cluster).
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from study.errors import UserError, print_error

URI_PATTERN = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# What pyarrow.fs.FileSystem.from_uri opens (gs and gcs name the same store).
SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "file")
# Uploads after finished trials are throttled: a study of many short trials must not spend its time uploading.
PUSH_INTERVAL_S = 15.0
_FOLDED_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/[^/]")  # what Path("s3://b/x") makes of a URI: "s3:/b/x"


def is_uri(text: str | Path) -> bool:
    return bool(URI_PATTERN.match(str(text)))


def check_uri(uri: str) -> str:
    """``uri`` without a trailing slash if pyarrow opens its scheme, else a UserError naming those it does."""
    match = URI_PATTERN.match(uri)
    if not match or match.group(1).lower() not in SCHEMES:
        raise UserError(f"{uri}: expected a folder or a URI with one of the schemes {', '.join(SCHEMES)} "
                        "(e.g. s3://bucket/studies/my-study)")
    if not uri[match.end():].strip("/"):
        raise UserError(f"{uri}: name a bucket and a prefix (e.g. {match.group(1)}://bucket/studies/my-study)")
    return uri.rstrip("/")


def resolve_storage(raw: Any, name: str) -> tuple[Path, str | None]:
    """A study file's ``storage:`` as (the local folder every writer uses, the URI it is mirrored to or None).

    A folder is used as it is; a URI gets the local working copy ``results/<name>/``.
    """
    if raw is None:
        return Path("results", name).resolve(), None
    if not isinstance(raw, str) or not raw.strip():
        raise UserError(f"expected a folder or a URI, got {raw!r}")
    raw = raw.strip()
    if is_uri(raw):
        return Path("results", name).resolve(), check_uri(raw)
    if _FOLDED_URI.match(raw):  # s3:/bucket/x: a URI that lost a slash, or went through Path() somewhere
        raise UserError(f"{raw}: looks like a URI with one slash; write {raw.replace(':/', '://', 1)}")
    return Path(raw).expanduser().resolve(), None


def local_copy(path_or_uri: str | Path) -> Path:
    """A study's folder: ``path_or_uri`` itself, or for a URI ``results/<last part>/`` refreshed from it."""
    if not is_uri(path_or_uri):
        return Path(path_or_uri)
    uri = check_uri(str(path_or_uri))
    local = Path("results", uri.rsplit("/", 1)[-1]).resolve()
    mirror = Mirror(local, uri)
    fetched = mirror.pull(overwrite=True)
    if not fetched and not mirror.remote_files():
        raise UserError(f"nothing under {uri}")
    print(f"{uri}: {fetched} file(s) fetched into {os.path.relpath(local)}")
    return local


def open_uri(uri: str) -> tuple[Any, str]:
    """(pyarrow filesystem, path inside it) of ``uri``; a UserError when the store cannot be reached."""
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError, TypeError) as error:
        raise UserError(f"cannot open {uri}: {error} (credentials and endpoints come from the environment, e.g. "
                        "AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS)") from None


def _is_scratch(relative: str) -> bool:
    """Temporary files of the atomic writers and SQLite's journals: never uploaded."""
    name = relative.rsplit("/", 1)[-1]
    return name.endswith((".tmp", "-journal", "-wal", "-shm")) or name == ".DS_Store"


def _sqlite_snapshot(path: Path, into: Path) -> None:
    """A consistent copy of a SQLite database even while another connection may hold it (the backup API)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as source, \
            closing(sqlite3.connect(into)) as target:
        source.backup(target)


class Mirror:
    """A local folder and, optionally, the URI it is mirrored to (``uri=None``: every call does nothing).

    Uploads are incremental (a file is sent again only when its size or modification time changed) and one-way
    while the study runs; :meth:`pull` is for a machine that lacks the working copy. Picklable, so a Ray Tune
    callback holding it survives ``Tuner.restore``; the pyarrow filesystem is reopened after unpickling.
    """

    def __init__(self, local: str | Path, uri: str | None = None, *, interval_s: float = PUSH_INTERVAL_S):
        self.local, self.uri, self.interval_s = Path(local), uri and check_uri(uri), interval_s
        self._sent: dict[str, tuple[int, int]] = {}
        self._last_push: float | None = None  # None: never pushed (monotonic time starts near 0 at boot)
        self._fs: Any = None
        self._root = ""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}

    def __repr__(self) -> str:
        return f"Mirror({str(self.local)!r} → {self.uri!r})"

    def _open(self) -> tuple[Any, str]:
        if self._fs is None:
            self._fs, self._root = open_uri(self.uri)
        return self._fs, self._root

    def remote_files(self) -> dict[str, int]:
        """{path relative to the URI: size} of every file under it (empty when nothing is there yet)."""
        if not self.uri:
            return {}
        import pyarrow.fs as pafs

        fs, root = self._open()
        try:
            infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        except OSError as error:
            raise UserError(f"cannot list {self.uri}: {error}") from None
        prefix = root.rstrip("/") + "/"
        return {info.path[len(prefix):]: info.size for info in infos
                if info.type == pafs.FileType.File and info.path.startswith(prefix)}

    def holds(self, relative: str) -> bool:
        """Whether the remote copy has this file (e.g. ``study.yaml``: a study was started there)."""
        return relative in self.remote_files()

    def push(self, *, force: bool = False) -> int:
        """Upload what changed since the last push; returns the number of files sent.

        Without ``force``, returns 0 at once when the last push was less than ``interval_s`` ago.
        """
        if not self.uri or not self.local.is_dir():
            return 0
        now = time.monotonic()
        if not force and self._last_push is not None and now - self._last_push < self.interval_s:
            return 0
        fs, root = self._open()
        sent = 0
        for path in sorted(p for p in self.local.rglob("*") if p.is_file()):
            relative = path.relative_to(self.local).as_posix()
            if _is_scratch(relative):
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:  # replaced between the listing and now: the next push sends the new one
                continue
            signature = (stat.st_size, stat.st_mtime_ns)
            if self._sent.get(relative) == signature:
                continue
            self._upload(fs, path, f"{root}/{relative}")
            self._sent[relative] = signature
            sent += 1
        self._last_push = time.monotonic()
        return sent

    def _upload(self, fs: Any, path: Path, destination: str) -> None:
        try:
            if path.suffix == ".db":  # Optuna's SQLite: copy a consistent snapshot, not pages mid-transaction
                with tempfile.TemporaryDirectory() as scratch:
                    snapshot = Path(scratch) / path.name
                    _sqlite_snapshot(path, snapshot)
                    self._copy(fs, snapshot, destination)
            else:
                self._copy(fs, path, destination)
        except OSError as error:
            raise UserError(f"cannot upload {path} to {self.uri}: {error}") from None

    @staticmethod
    def _copy(fs: Any, path: Path, destination: str) -> None:
        if fs.type_name == "local":  # file:// (a mounted share) has real folders; object stores have none
            fs.create_dir(destination.rsplit("/", 1)[0], recursive=True)
        with open(path, "rb") as source, fs.open_output_stream(destination) as out:
            while chunk := source.read(1 << 22):
                out.write(chunk)

    def pull(self, *, overwrite: bool = False) -> int:
        """Download the remote files the local copy lacks; returns the number fetched.

        Without ``overwrite`` local files are kept, because a working copy is never older than what it uploaded
        (resuming on the machine that ran the study); with it, every file that differs in size is replaced
        (the remote copy is the newer one: a study that ran on another machine).
        """
        if not self.uri:
            return 0
        fs, root = self._open()
        fetched = 0
        for relative, size in self.remote_files().items():
            path = self.local / relative
            if path.is_file() and (not overwrite or path.stat().st_size == size):
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.pull.tmp")
            try:
                with fs.open_input_stream(f"{root}/{relative}") as source, open(tmp, "wb") as out:
                    while chunk := source.read(1 << 22):
                        out.write(chunk)
                os.replace(tmp, path)
            except OSError as error:
                tmp.unlink(missing_ok=True)
                raise UserError(f"cannot download {self.uri}/{relative}: {error}") from None
            stat = path.stat()
            self._sent[relative] = (stat.st_size, stat.st_mtime_ns)  # the same bytes are there already
            fetched += 1
        return fetched


# ---------------------------------------------------------------------------------------------------------------
# Command line: copy a study between a folder and a URI by hand


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m study.storage",
        description="Copy a study's results between a local folder and a cloud URI (s3://, gs://, …). A pull "
                    "fetches the files that are missing or differ in size; a push sends every file.")
    commands = parser.add_subparsers(dest="command", required=True)
    pull = commands.add_parser("pull", help="download URI into FOLDER (e.g. to run study.report on a laptop)")
    pull.add_argument("uri")
    pull.add_argument("folder", type=Path)
    push = commands.add_parser("push", help="upload FOLDER to URI")
    push.add_argument("folder", type=Path)
    push.add_argument("uri")
    args = parser.parse_args(argv)
    try:
        mirror = Mirror(args.folder, args.uri)
        if args.command == "pull":
            count = mirror.pull(overwrite=True)
            if not count and not mirror.remote_files():
                raise UserError(f"nothing under {mirror.uri}")
            print(f"{count} file(s) from {mirror.uri} into {args.folder}")
        else:
            if not args.folder.is_dir():
                raise UserError(f"{args.folder}: no such folder")
            print(f"{mirror.push(force=True)} file(s) from {args.folder} to {mirror.uri}")
    except UserError as error:
        return print_error(error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
