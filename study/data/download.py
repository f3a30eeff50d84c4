"""Downloading the MovieLens archives from GroupLens into the cache, safely.

The archive is streamed to a temporary name next to its final place and renamed once complete and checked to
be a zip, so an interrupted download never leaves a file that looks finished. The base URL can be overridden
with ``SEQREC_MOVIELENS_URL`` (a mirror, or a local server in tests).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from tqdm import tqdm

from study.errors import UserError

DEFAULT_MOVIELENS_URL = "https://files.grouplens.org/datasets/movielens"
URL_ENV = "SEQREC_MOVIELENS_URL"
TIMEOUT_S = 60


def movielens_url(archive: str) -> str:
    """Full URL of a GroupLens archive such as ``ml-1m.zip``, honouring ``$SEQREC_MOVIELENS_URL``."""
    base = os.environ.get(URL_ENV) or DEFAULT_MOVIELENS_URL
    return f"{base.rstrip('/')}/{archive}"


def download(url: str, dest: Path, *, progress: bool = True, hint: str = "") -> Path:
    """Download ``url`` to ``dest`` unless it is already there; returns ``dest``.

    Any failure is a UserError that names the URL and the reason, followed by ``hint`` (how to do without).
    """
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    suffix = f". {hint}" if hint else ""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(part, "wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            with tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"download {dest.name}",
                disable=None if progress else True,
                leave=False,  # None: only on a terminal
            ) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
        if total is not None and part.stat().st_size != total:
            raise UserError(
                f"download of {url} failed: got {part.stat().st_size} of {total} bytes "
                f"(connection cut){suffix}"
            )
        if not zipfile.is_zipfile(part):
            raise UserError(f"download of {url} failed: the server did not send a zip archive{suffix}")
        os.replace(part, dest)
    except urllib.error.HTTPError as exc:
        raise UserError(f"download of {url} failed: HTTP {exc.code} {exc.reason}{suffix}") from None
    except urllib.error.URLError as exc:
        raise UserError(f"download of {url} failed: {exc.reason}{suffix}") from None
    except TimeoutError as exc:
        raise UserError(f"download of {url} failed: timed out ({exc}){suffix}") from None
    except OSError as exc:  # connection reset mid-stream, or the cache is not writable / full
        raise UserError(f"download of {url} failed: {exc}{suffix}") from None
    finally:
        part.unlink(missing_ok=True)
    return dest
