"""Opening a source file (a plain file or a zip member), and the one normal form every reader parses text in.

Files written by other systems differ from the published ones in ways that mean nothing: a UTF-8 byte order mark
(Excel, Notepad, PowerShell), CRLF or CR line ends (Windows, old Macs), blank lines at the end, and in the formats
whose fields are separated by blanks (S3Rec, SASRec) tabs or runs of spaces for one space, or blanks at the ends of
a line. :func:`open_text` removes all of that while reading, so every reader parses the same text
for such variants, and :func:`checksum` hashes that same text, so they are the same source, the same
``content_hash`` and the same prepared directory. A clean file (UTF-8 without the mark, LF, no blank line at the
end, single spaces) is its own normal form: its checksum is the sha256 of its bytes, as before the normal form
existed, so datasets prepared from it keep their identity. (For the same reason a file that does not end with a line
end is left so: it stays a source of its own, as it was.)

Line numbers survive the normal form: it joins or splits no line in the middle of a file (only blank lines after
the last line go), so a reader's error names the line an editor shows.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from study.errors import UserError

READ_SIZE = 1 << 20
PARQUET_MAGIC = b"PAR1"
_BLANKS = b" \t"
_BLANKS_AROUND_LINE_END = re.compile(rb"[ \t]*\n[ \t]*")
_BLANK_RUN = re.compile(rb"[ \t]+")


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


class NormalText(io.RawIOBase):
    """A binary text stream in normal form, read from another one block by block (constant memory).

    Each block has its line ends made LF; a trailing CR waits for the next block (it may be half of a CRLF),
    and so does the trailing run of blanks and line ends: blank lines only go when nothing follows them, and
    with ``words`` a run of blanks must be whole before it becomes one space.
    """

    def __init__(self, raw: IO[bytes], *, words: bool) -> None:
        super().__init__()
        self._raw, self._words = raw, words
        self._pending = b""  # read but not yet given out: a trailing run of blanks and LFs, maybe a CR
        self._out, self._pos = b"", 0
        self._started = self._emitted = self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:
        while self._pos == len(self._out) and not self._done:
            self._out, self._pos = self._next_block(), 0
        size = min(len(buffer), len(self._out) - self._pos)
        buffer[:size] = self._out[self._pos: self._pos + size]
        self._pos += size
        return size

    def _read(self) -> bytes:
        """The next block of the raw stream, without the byte order mark that may start the first one."""
        block = self._raw.read(READ_SIZE)
        if not self._started:
            self._started = True
            while block and len(block) < len(codecs.BOM_UTF8) and (more := self._raw.read(READ_SIZE)):
                block += more  # a zip member may give a short first read; the mark must be seen whole
            if block.startswith(codecs.BOM_UTF8):
                return block[len(codecs.BOM_UTF8):] or self._raw.read(READ_SIZE)
        return block

    def _next_block(self) -> bytes:
        block = self._read()
        if not block:
            self._done = True
            # after the last line: its own trailing blanks (unless the format ignores blanks) and its line end,
            # if it has one (a file without a final line end keeps its checksum: it is not changed to have one)
            if not self._emitted:
                return b""
            blanks, line_end, _ = self._pending.replace(b"\r", b"\n").partition(b"\n")
            return line_end if self._words else blanks + line_end
        data = self._pending + block
        carried_cr = data.endswith(b"\r")
        if carried_cr:
            data = data[:-1]
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        body = data.rstrip(_BLANKS + b"\n")
        self._pending = data[len(body):] + (b"\r" if carried_cr else b"")
        if self._words and body:
            body = self._collapse(body)
        self._emitted = self._emitted or bool(body)
        return body

    def _collapse(self, body: bytes) -> bytes:
        """Blanks around line ends go, other runs of blanks become one space. ``body`` ends in a token, and a
        blank at its start separates it from the token the previous block ended with, unless nothing was given
        out yet: then it leads the first line and goes."""
        if not self._emitted:
            body = body.lstrip(_BLANKS)
        if b"\t" in body or b"  " in body or b" \n" in body or b"\n " in body:
            body = _BLANK_RUN.sub(b" ", _BLANKS_AROUND_LINE_END.sub(b"\n", body))
        return body


@contextmanager
def open_text(src: Source, *, words: bool = False) -> Iterator[IO[bytes]]:
    """Read a text source in normal form (still bytes, UTF-8 undecoded): no byte order mark, LF line ends, no
    blank lines after the last line. ``words`` (formats whose fields are separated by blanks) also strips each line
    and makes each run of spaces and tabs one space."""
    with open_binary(src) as fh:
        yield io.BufferedReader(NormalText(fh, words=words), READ_SIZE)


def decode(data: bytes, src: Source, first_line: int = 1) -> str:
    """UTF-8 text; anything else is a UserError naming the line of the first byte that is not UTF-8 (``data``
    starts at line ``first_line`` of ``src``)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + first_line
        raise UserError(f"{src}, line {line}: not UTF-8 text ({exc.reason})") from None


def checksum(src: Source, *, words: bool = False) -> str:
    """sha256 (hex) of a source as its reader sees it: the normal form of a text file (see :func:`open_text`),
    the bytes of a Parquet file (binary: recognised by its magic number, never normalised)."""
    digest = hashlib.sha256()
    with open_binary(src) as fh:
        binary = fh.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    with open_binary(src) if binary else open_text(src, words=words) as fh:
        while block := fh.read(READ_SIZE):
            digest.update(block)
    return digest.hexdigest()
