"""Shared fixtures: the real benchmark files in ../shared/datasets and a private data cache per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """``../shared/datasets`` (read-only, never copied into the repo); skips where it is absent."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"{SHARED_DATASETS} is not available")
    return SHARED_DATASETS


@pytest.fixture
def data_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ``$SEQREC_DATA`` at a fresh folder so that a test never touches the user's cache."""
    cache = tmp_path / "seqrec-cache"
    monkeypatch.setenv("SEQREC_DATA", str(cache))
    monkeypatch.delenv("SEQREC_MOVIELENS_URL", raising=False)
    return cache


@pytest.fixture(scope="session")
def prepared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data cache shared by the session's prepared real datasets (preparing them once keeps CI fast)."""
    return tmp_path_factory.mktemp("prepared-cache")


def _prepare_in(cache: Path, name: str, source: Path, max_len: int) -> Path:
    from study.data import prepare

    previous = os.environ.get("SEQREC_DATA")
    os.environ["SEQREC_DATA"] = str(cache)
    try:
        return prepare(name, source=source, max_len=max_len, progress=False)
    finally:
        if previous is None:
            del os.environ["SEQREC_DATA"]
        else:
            os.environ["SEQREC_DATA"] = previous


@pytest.fixture(scope="session")
def ml100k_prepared(shared_datasets: Path, prepared_cache: Path) -> Path:
    """The shared MovieLens-100K file, 5-core, leave-one-out, windows of 200 (+1) items."""
    return _prepare_in(prepared_cache, "ml-100k", shared_datasets / "ml-100k" / "ml-100k.inter", 200)


@pytest.fixture(scope="session")
def lastfm_prepared(shared_datasets: Path, prepared_cache: Path) -> Path:
    """The shared S3Rec LastFM file (1,090 users), windows of 50 (+1) items: the small real test dataset."""
    return _prepare_in(prepared_cache, "lastfm", shared_datasets / "s3rec" / "LastFM.txt", 50)
