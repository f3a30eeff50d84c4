"""What one trial reads: a prepared dataset's windows and evaluation splits as numpy arrays, cut to the model's
``max_len``. Its own module so that :mod:`study.train.trainer` holds the training run alone; the trainer re-exports
:class:`TrialData`, the name the sweep and the tests import it by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from study.errors import UserError
from study.train.metrics import EvalSplit


@dataclass
class TrialData:
    """Everything a trial reads, as numpy arrays already cropped to one ``max_len``."""

    meta: dict
    train: np.ndarray  # (U, max_len + 1) left-padded windows of training items
    valid: EvalSplit
    test: EvalSplit
    item_popularity: np.ndarray  # (num_items + 1,) training counts

    @property
    def num_items(self) -> int:
        return int(self.meta["num_items"])

    @classmethod
    def from_prepared(cls, path: str | Path, max_len: int, train_rows: int | None = None) -> TrialData:
        """``train_rows=n`` keeps only the first n users' training windows (a streaming trial's probe sample)."""
        from study.data import load_prepared

        dataset = load_prepared(path, train_rows)
        stored = dataset.train.shape[1] - 1
        if max_len > stored:
            raise UserError(f"max_len={max_len} exceeds the {stored} items per window stored in {path}; "
                            f"prepare the dataset with --max-len {max_len} or more")
        indptr = np.asarray(dataset.history_indptr, dtype=np.int64)
        indices = np.asarray(dataset.history_indices, dtype=np.int64)
        lengths = np.diff(indptr)

        def split(windows: np.ndarray, held_out: int) -> EvalSplit:
            cropped = np.ascontiguousarray(windows[:, -(max_len + 1):])
            return EvalSplit(inputs=cropped[:, :-1], targets=cropped[:, -1].astype(np.int64),
                             history_items=indices, history_starts=indptr[:-1], history_lengths=lengths - held_out)

        return cls(meta=dataset.meta, train=np.ascontiguousarray(dataset.train[:, -(max_len + 1):]),
                   valid=split(dataset.valid, 2), test=split(dataset.test, 1),
                   item_popularity=dataset.item_popularity("train"))

    @property
    def width(self) -> int:
        """Items per input window (the ``max_len`` these arrays were cut for)."""
        return self.train.shape[1] - 1

    def cropped(self, max_len: int) -> TrialData:
        """The same data cut to a shorter ``max_len`` (the newest items kept); copies, so the arrays are writable."""
        if max_len > self.width:
            raise UserError(f"max_len={max_len} exceeds the {self.width} items per window of this data")

        def crop(split: EvalSplit) -> EvalSplit:
            return EvalSplit(inputs=np.array(split.inputs[:, -max_len:]), targets=split.targets,
                             history_items=split.history_items, history_starts=split.history_starts,
                             history_lengths=split.history_lengths)

        return TrialData(meta=self.meta, train=np.array(self.train[:, -(max_len + 1):]), valid=crop(self.valid),
                         test=crop(self.test), item_popularity=self.item_popularity)
