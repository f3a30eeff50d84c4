"""No compute on padding: drop the leading columns of a batch that are padding in every row.

Windows are left-padded with item 0 to ``max_len`` (+1 for the target), whatever the data; on short-sequence
datasets most positions are padding (LastFM at max_len 200: ~72%). A batch only needs the columns from its longest
real window on. Models count positions from the newest item (``models.blocks.right_aligned_positions``), so their
outputs at real items are the same on the trimmed batch (``tests/models/test_padding_invariance.py``).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

Batch = TypeVar("Batch", np.ndarray, torch.Tensor)


def padding_columns(items: np.ndarray | torch.Tensor, keep: int = 1) -> int:
    """How many leading columns of ``items`` (B, L) are 0 in every row, leaving at least ``keep`` columns.

    On a CUDA tensor this reads one number back from the device (a synchronisation).
    """
    width = items.shape[1]
    used = (items != 0).any(0)
    # one expression for numpy and torch, read back once: argmax finds the first used column, an unused batch
    # gets the whole width
    first = int((used * 1).argmax() + width * ~used.any())
    return min(first, max(width - keep, 0))


def trim_padding(items: Batch, keep: int = 1) -> Batch:
    """``items`` (B, L) without its all-padding leading columns (at least ``keep`` columns stay); a view."""
    return items[:, padding_columns(items, keep):]
