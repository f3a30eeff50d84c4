"""Shared fixtures: a private data cache per test, synthetic data for the machinery tests, and the real benchmark
files in ../shared/datasets for the few tests whose point is real data (they skip where it is absent)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# Without CUDA the Triton kernels are tested in Triton's interpreter (tests/kernels/conftest.py). triton.jit reads
# the switch when a module defining kernels is imported, and importing triton's own language module decorates its
# helpers too, so it is set here, before pytest imports any test module: a test folder collected before
# tests/kernels that imports triton (torch's FLOP counter does) would otherwise fix it to compiled mode and every
# interpreted kernel would fail. An explicit TRITON_INTERPRET in the environment wins.
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
# pytest-xdist runs two test processes at once (pyproject's addopts). Each keeps its Rays in a temp folder of its
# own: ray.init() without an address joins the cluster whose address a test's `Cluster` wrote to the temp folder,
# so with one shared folder a test in one process could land on the other's two-node cluster.
if "PYTEST_XDIST_WORKER" in os.environ and "RAY_TMPDIR" not in os.environ:
    os.environ["RAY_TMPDIR"] = os.path.join(tempfile.gettempdir(), f"ray-{os.environ['PYTEST_XDIST_WORKER']}")
    os.makedirs(os.environ["RAY_TMPDIR"], exist_ok=True)
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


def _prepare_in(cache: Path, name: str, source: Path | None, max_len: int, **options: int) -> Path:
    from study.data import prepare

    previous = os.environ.get("SEQREC_DATA")
    os.environ["SEQREC_DATA"] = str(cache)
    try:
        return prepare(name, source=source, max_len=max_len, progress=False, **options)
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


# The synthetic stand-in for LastFM (1,090 users, 3,646 items, mean length ~48): 1,000 users, 2,703 items drawn
# (of 3,000), mean length ~48. Machinery tests train on it so that they run where ../shared is absent.
SYNTHETIC_LASTFM = {"users": 1000, "items": 3000, "length": 50, "seed": 0}


@pytest.fixture(scope="session")
def synthetic_lastfm_prepared(prepared_cache: Path) -> Path:
    """``SYNTHETIC_LASTFM`` prepared with windows of 50 (+1) items; deterministic, needs no ``../shared``."""
    return _prepare_in(prepared_cache, "synthetic", None, 50, **SYNTHETIC_LASTFM)


@pytest.fixture(scope="session")
def synthetic_lastfm_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``SYNTHETIC_LASTFM`` as an S3Rec text file like LastFM.txt: ``user item item ...`` per line, users 1..n,
    items numbered by first appearance. For the file recipes (``lastfm``, ``beauty`` ...) and ``--source``."""
    import pandas as pd

    from study.data.synthetic import generate, resolve_params

    frame = generate(resolve_params(SYNTHETIC_LASTFM))
    frame["item"] = pd.factorize(frame["item"])[0] + 1
    path = tmp_path_factory.mktemp("synthetic-s3rec") / "LastFM.txt"
    path.write_text("".join(f"{user + 1} {' '.join(map(str, items))}\n"
                            for user, items in frame.groupby("user", sort=True)["item"]))
    return path


@pytest.fixture(scope="session")
def ml100k_shaped_udata(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GroupLens u.data (TSV, no header) with ML-100K's raw counts, so the recipe takes it for ML-100K.

    Every user and item appears once, the other rows are Zipf-like, so the 5-core drops a tail of both; coarse
    timestamps give ties that only the file order can break.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    rows = 100_000

    def skewed(count: int) -> np.ndarray:
        ids = np.arange(1, count + 1)
        weights = 1.0 / ids**1.2
        return rng.permutation(np.concatenate([ids, rng.choice(ids, rows - count, p=weights / weights.sum())]))

    users, items = skewed(943), skewed(1_682)
    ratings, timestamps = rng.integers(1, 6, rows), 874_724_710 + rng.integers(0, 50_000, rows)
    path = tmp_path_factory.mktemp("generated-ml-100k") / "u.data"
    path.write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in zip(users, items, ratings, timestamps)))
    return path


@pytest.fixture(scope="module")
def s3_server():
    """A real S3-compatible server (moto) on 127.0.0.1, and the AWS variables that point pyarrow at it.

    The variables are set in this process for the module's duration, so the Ray nodes and sweep subprocesses a
    test starts inherit them, as the nodes of a real cluster get theirs from the machine.
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_EC2_METADATA_DISABLED": "true"}
    previous = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: dict[str, str], request: pytest.FixtureRequest) -> str:
    """A new, empty bucket on the test server; its name as ``s3://name``."""
    import re

    import pyarrow.fs as pafs

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") or "bucket"
    pafs.S3FileSystem(endpoint_override=s3_server["AWS_ENDPOINT_URL"], allow_bucket_creation=True).create_dir(name)
    return f"s3://{name}"


@pytest.fixture(scope="session")
def write_tiny_sweep():
    """Writes a two-minute SASRec study on ``SYNTHETIC_LASTFM`` (one epoch per trial, tiny model, each user's newest
    window only: the studies that use it test machinery, not what the windows teach).

    ``max_concurrent=1`` runs the trials one after another in one reused actor: on a CPU-bound test machine that
    saves a fresh process's imports per trial, for tests whose trials need not overlap."""
    import textwrap

    options = ", ".join(f"{key}: {value}" for key, value in SYNTHETIC_LASTFM.items())

    def write(path: Path, *, name: str, storage: str | Path, samples: int, gpu: float = 0,
              max_concurrent: int | None = None) -> Path:
        concurrency = "" if max_concurrent is None else f", max_concurrent: {max_concurrent}"
        path.write_text(textwrap.dedent(f"""
            name: {name}
            model: sasrec
            dataset: {{name: synthetic, options: {{{options}}}}}
            fixed: {{max_len: 20, batch_size: 256, hidden_size: 16, num_layers: 1, num_heads: 1, inner_size: 32,
                    measure_efficiency: false, window_step: 0}}
            search:
              lr: {{loguniform: [1.0e-3, 1.0e-2]}}
            sampler: random
            budget: {{num_samples: {samples}, max_epochs: 1}}
            resources: {{cpu: 1, gpu: {gpu}{concurrency}}}
            storage: {storage}
            """).lstrip())
        return path

    return write


@pytest.fixture
def kill_session():
    """``kill(session)``: SIGKILL every process of a process session (a command started with start_new_session=True,
    and the Ray processes under it), as a crashed machine would end them."""
    import signal
    import subprocess

    def kill(session: int) -> None:
        listing = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True, check=True).stdout
        for pid, sid in (line.split() for line in listing.splitlines()):
            if int(sid) == session:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    return kill


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that hold a slow test run first, each module's tests in their own order.

    Under ``-n 2 --dist loadfile --no-loadscope-reorder`` each worker takes the next whole module when it is free, in
    this order. A long end-to-end module taken last would run alone while the other worker idles; taken first, the
    many short modules fill in around it.
    """
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)  # stable: False (slow) sorts first
