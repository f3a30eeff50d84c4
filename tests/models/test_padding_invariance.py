"""Trimmed windows: every model gives the full window's outputs at its real items (issue #16, item 1).

The trainer drops the leading columns that are padding in every row of a batch (``study.train.padding``). That is
only free if a model's outputs at real items do not depend on the window's width, so positions must count from
the newest item. Each registered model (and each variant that computes differently: causal forms, ablations,
LISA's variants) is checked in eval mode on synthetic left-padded windows, at an absolute tolerance of 1e-5: the
trimmed and full computations differ only by float rounding (sums over fewer zeroed pads, RoPE angles).
"""

from __future__ import annotations

import pytest
import torch

import models
from models.blocks import right_aligned_positions

MAX_LEN = 37
NUM_ITEMS = 60
TOLERANCE = 1e-5
LENGTHS = [3, 9, 14, 1, 11]  # the longest real window (14) sets the trimmed width

VARIANTS = {
    "sasrec": ("sasrec", {}),
    "sasrec-pre-ln-math": ("sasrec", {"norm_first": True, "attention_backend": "math"}),
    "bert4rec": ("bert4rec", {}),
    "gru4rec": ("gru4rec", {}),
    "linrec": ("linrec", {}),
    "linrec-causal": ("linrec", {"causal": True}),
    "linrec-row": ("linrec", {"key_norm": "row"}),
    "cotten4rec": ("cotten4rec", {}),
    "cotten4rec-causal": ("cotten4rec", {"causal": True}),
    "recgrela": ("recgrela", {}),
    "recgrela-causal": ("recgrela", {"causal": True}),
    "lisa": ("lisa", {"num_codewords": 16}),
    "lisa-soft": ("lisa", {"variant": "soft", "num_codewords": 16}),
    "lisa-mini": ("lisa", {"variant": "mini", "num_codewords": 8, "target_codewords": 16}),
    "lisa-no-decay": ("lisa", {"decay": 0.0, "num_codewords": 16}),
    "elastic": ("elastic", {"num_experts": 16, "top_k": 2}),
    "elastic-mean-query": ("elastic", {"num_experts": 16, "top_k": 2, "query_net": "mean"}),
    "elastic-no-imr": ("elastic", {"imr": False, "top_k": 2}),
    "elastic-no-dispatcher": ("elastic", {"num_experts": 16, "top_k": 2, "dispatcher": False}),
    "elastic-batchnorm-heads": ("elastic", {"num_experts": 16, "top_k": 2, "query_batchnorm": True, "key_heads": 2}),
    "linrec-elu-cloze": ("linrec", {"feature_map": "elu", "cloze": True}),
    "hstu": ("hstu", {"attention_dim": 8, "linear_dim": 8}),
    "fpmc": ("fpmc", {"num_users": 1}),  # without user ids: its Markov-chain term
}


def test_every_registered_model_is_checked():
    assert {name for name, _ in VARIANTS.values()} == set(models.available())


@pytest.fixture(scope="module")
def full_window() -> torch.Tensor:
    """Five left-padded windows of ``MAX_LEN`` columns with ``LENGTHS`` real items."""
    generator = torch.Generator().manual_seed(0)
    items = torch.randint(1, NUM_ITEMS + 1, (len(LENGTHS), MAX_LEN), generator=generator)
    for row, real in enumerate(LENGTHS):
        items[row, :MAX_LEN - real] = 0
    return items


@pytest.mark.parametrize("variant", VARIANTS)
def test_trimmed_window_gives_the_full_windows_outputs(variant, full_window):
    name, hparams = VARIANTS[variant]
    torch.manual_seed(0)
    model = models.build(name, num_items=NUM_ITEMS, max_len=MAX_LEN, hidden_size=16, **hparams).eval()
    width = max(LENGTHS)
    trimmed = full_window[:, -width:]
    assert (full_window[:, :-width] == 0).all() and (trimmed[:, 0] > 0).any()
    real = trimmed > 0
    with torch.no_grad():
        full_hidden, trimmed_hidden = model(full_window), model(trimmed)
        full_last, trimmed_last = model.last_hidden(full_window), model.last_hidden(trimmed)
    assert trimmed_hidden.shape[:2] == (len(LENGTHS), width)
    for full, cut in ((full_hidden[:, -width:][real], trimmed_hidden[real]), (full_last, trimmed_last)):
        assert torch.isfinite(full).all() and torch.isfinite(cut).all()
        assert full.abs().amax(-1).min() > 0  # every real position has an output, not zeros that match anything
        torch.testing.assert_close(cut, full, atol=TOLERANCE, rtol=0)


def test_positions_count_from_the_newest_item():
    assert right_aligned_positions(3, 5, torch.device("cpu")).tolist() == [2, 3, 4]
    assert right_aligned_positions(5, 5, torch.device("cpu")).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="exceeds max_len=5"):
        right_aligned_positions(6, 5, torch.device("cpu"))


def test_bert4rec_keeps_the_oldest_item_of_a_trimmed_window():
    """Its "what comes next?" query appends the mask token; a full window drops its oldest column for it, a
    trimmed one must not (that column holds a real item there), and a one-item change there must show."""
    torch.manual_seed(0)
    model = models.build("bert4rec", num_items=NUM_ITEMS, max_len=8, hidden_size=16).eval()
    window = torch.tensor([[0, 0, 0, 0, 5, 6, 7, 8]])
    changed = window.clone()
    changed[0, 4] = 9
    with torch.no_grad():
        assert not torch.allclose(model.last_hidden(window[:, 4:]), model.last_hidden(changed[:, 4:]))
        torch.testing.assert_close(model.last_hidden(window[:, 4:]), model.last_hidden(window), atol=TOLERANCE, rtol=0)
