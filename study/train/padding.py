"""No compute on padding: drop the leading columns of a batch that are padding in every row, and run a batch of
mixed lengths in groups of similar length.

Windows are left-padded with item 0 to ``max_len`` (+1 for the target), whatever the data; on short-sequence
datasets most positions are padding (LastFM at max_len 200: ~72%). A batch only needs the columns from its longest
real window on, and a group of its rows only those from the group's longest. Models count positions from the
newest item (``models.blocks.right_aligned_positions``) and never mix rows, so their outputs at real items are the
same on the trimmed batch and on its groups (``tests/models/test_padding_invariance.py``). A model whose training
forward does mix rows (batch statistics: ``SeqRecModel.mixes_rows_in_training``) gets its training batches trimmed
but whole, since a group's statistics would not be the batch's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from models import SeqRecModel

Batch = TypeVar("Batch", np.ndarray, torch.Tensor)


def trims_padding(setting: bool | None, device: torch.device | str, compiled: bool = False) -> bool:
    """``TrainConfig.trim_padding`` resolved for ``device``: the setting where given, else trim on a CPU only, and
    never in a ``compiled`` step.

    On CUDA the zoo's steps are bound by kernel launches, the GPU idle for most of a step
    (`python -m benchmarks.step_profile MODEL --device cuda` shows where a step's time goes), so the FLOPs trimming
    saves buy little time there, while the length groups multiply the launches and each group reads its width back
    from the device. A compiled step wants one shape: every width trimming makes and every length group is a graph
    to compile anew, where full windows compile one.
    """
    if setting is not None:
        return setting
    return torch.device(device).type != "cuda" and not compiled


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


# One long history makes a shuffled batch wide. Beauty at max_len 50 (`python -m benchmarks.padding`): 89% of the
# input positions are padding, trimming alone saves 12% of the positions, four groups 72%. `last` at max_len 200 on
# LastFM: trimming alone saves 3%, four groups 58%.
LENGTH_GROUPS = 4


def length_groups(lengths: torch.Tensor, groups: int = LENGTH_GROUPS) -> list[torch.Tensor]:
    """Row indices of a batch, by real length, in at most ``groups`` nearly equal parts (shortest first).

    Neighbouring parts with the same longest prefix are merged, as splitting them would save nothing: a batch
    without padding (the scaling study's) stays one part, computed as one forward pass.
    """
    lengths = lengths.cpu()
    merged: list[torch.Tensor] = []
    for rows in torch.argsort(lengths, stable=True).tensor_split(groups):
        if len(rows) and merged and lengths[rows].max() == lengths[merged[-1]].max():
            merged[-1] = torch.cat([merged[-1], rows])
        elif len(rows):
            merged.append(rows)
    return merged


def _run_by_length(model: SeqRecModel, inputs: torch.Tensor, users: torch.Tensor | None,
                   run: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]) -> torch.Tensor:
    """``run(rows, their users)`` on each length group of ``inputs``, trimmed to the group's longest prefix; the
    outputs come back in the batch's order.

    No model mixes rows, so each row's output is the one of the whole batch (up to float rounding). An auxiliary
    loss (LISA-Soft's) is a mean over real input positions, so the groups' terms are recombined weighted by their
    numbers of real positions.
    """
    real = inputs > 0
    groups = length_groups(real.sum(1))
    if len(groups) == 1 or (model.training and model.mixes_rows_in_training):
        return run(trim_padding(inputs), users)
    parts, order, aux_terms = [], [], []
    for rows in groups:
        parts.append(run(trim_padding(inputs[rows]), None if users is None else users[rows]))
        order.append(rows)
        aux = model.aux_loss()
        if aux is not None:
            aux_terms.append(aux * real[rows].sum())
    if aux_terms:
        model.record_aux_loss(torch.stack(aux_terms).sum() / real.sum().clamp(min=1))
    return torch.cat(parts)[torch.argsort(torch.cat(order))]


def last_hidden_by_length(model: SeqRecModel, inputs: torch.Tensor,
                          users: torch.Tensor | None = None) -> torch.Tensor:
    """``model.last_hidden(inputs)`` computed in length groups (:func:`_run_by_length`)."""
    return _run_by_length(model, inputs, users, lambda rows, u: model.last_hidden(rows, **model.user_inputs(u)))


def hidden_by_length(model: SeqRecModel, inputs: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
    """``model(inputs)`` (B, L, d) computed in length groups (:func:`_run_by_length`). The columns a group drops
    come back as zeros: they hold no input item, so no objective scores them."""
    width = inputs.shape[1]

    def run(rows: torch.Tensor, group_users: torch.Tensor | None) -> torch.Tensor:
        hidden = model(rows, **model.user_inputs(group_users))
        return F.pad(hidden, (0, 0, width - rows.shape[1], 0))

    return _run_by_length(model, inputs, users, run)
