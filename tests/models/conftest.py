"""Shared preambles of the model tests: a small synthetic dataset for the contract checks.

Contract checks (causality, equivalence with naive forms, gradients, config errors, objective refusal) run
on the ``synthetic`` recipe, so they never skip where ``../shared`` is absent; only the tests about learning
on real data use the shared MovieLens-100K file (``ml100k_prepared`` in ``tests/conftest.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from study.train.trainer import TrialData

SYNTHETIC_MAX_LEN = 50  # the longest window a model test reads (ELASTIC, LISA)


@pytest.fixture(scope="session")
def synthetic_prepared(prepared_cache: Path) -> Path:
    """300 synthetic users over ~200 items, lengths from 4 to well past 50: windows both left-padded and full."""
    import os

    from study.data import prepare

    previous = os.environ.get("SEQREC_DATA")
    os.environ["SEQREC_DATA"] = str(prepared_cache)
    try:
        return prepare("synthetic", users=300, items=200, length=20, seed=0, max_len=SYNTHETIC_MAX_LEN,
                       progress=False)
    finally:
        if previous is None:
            del os.environ["SEQREC_DATA"]
        else:
            os.environ["SEQREC_DATA"] = previous


@pytest.fixture(scope="module")
def synthetic(synthetic_prepared: Path) -> TrialData:
    """The synthetic dataset as the trainer reads it, windows of ``SYNTHETIC_MAX_LEN`` (+1) items."""
    return TrialData.from_prepared(synthetic_prepared, max_len=SYNTHETIC_MAX_LEN)


@pytest.fixture
def left_padded():
    """``left_padded(num_items, length, lengths, seed)``: random windows with the given numbers of real items."""

    def make(num_items: int, length: int, lengths: list[int], seed: int = 0) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        items = torch.randint(1, num_items + 1, (len(lengths), length), generator=generator)
        for row, real in enumerate(lengths):
            items[row, :length - real] = 0
        return items

    return make


@pytest.fixture
def assert_differ():
    """``assert_differ(a, b, atol)``: a "does differ" check that cannot pass on NaN (NaN is never close)."""

    def check(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-8) -> None:
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        assert not torch.allclose(a, b, atol=atol)

    return check
