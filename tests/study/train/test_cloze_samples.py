"""The cloze task's samples: masked copies per window and the §3.6 samples that mask only the newest item."""

from __future__ import annotations

import torch

import models
from study.train.objectives import cloze_inputs, cloze_loss

# four left-padded (L + 1 = 7) windows; the first column is dropped by the cloze task (its newest L items)
WINDOWS = torch.tensor([
    [0, 0, 0, 0, 5, 6, 7],
    [0, 1, 2, 3, 4, 5, 6],
    [0, 0, 0, 0, 0, 8, 9],
    [4, 3, 2, 1, 9, 8, 7],
])


def test_defaults_are_the_plain_cloze_draw():
    items, masked = cloze_inputs(WINDOWS, 0.3, torch.Generator().manual_seed(5))
    # the draw written out: one uniform per position, the newest item masked where the coin left none
    expected = (WINDOWS[:, 1:] > 0) & (torch.rand((4, 6), generator=torch.Generator().manual_seed(5)) < 0.3)
    expected[~expected.any(1), -1] = True
    assert torch.equal(items, WINDOWS[:, 1:])
    assert torch.equal(masked, expected)


def test_copies_mask_each_window_independently():
    items, masked = cloze_inputs(WINDOWS, 0.5, torch.Generator().manual_seed(0), copies=3)
    assert torch.equal(items, WINDOWS[:, 1:].repeat(3, 1))
    assert not (masked & (items == 0)).any()  # padding is never a target
    assert masked.any(1).all()  # every sample supervises at least one item
    copies = masked.view(3, 4, 6)
    assert not torch.equal(copies[0], copies[1]) and not torch.equal(copies[1], copies[2])


def test_last_item_samples_mask_exactly_the_newest_item():
    items, masked = cloze_inputs(WINDOWS, 0.2, torch.Generator().manual_seed(1), copies=2, last_item_samples=True)
    assert items.shape == (3 * 4, 6)
    extra_items, extra_masked = items[8:], masked[8:]
    assert torch.equal(extra_items, WINDOWS[:, 1:])
    assert extra_masked.sum(1).tolist() == [1, 1, 1, 1]
    assert extra_masked[:, -1].all()
    assert extra_items[extra_masked].tolist() == [7, 6, 9, 7]  # each window's last real item is the target
    # the random copies come first and are unchanged by the extra samples
    plain_items, plain_masked = cloze_inputs(WINDOWS, 0.2, torch.Generator().manual_seed(1), copies=2)
    assert torch.equal(items[:8], plain_items) and torch.equal(masked[:8], plain_masked)


def test_bert4rec_config_sets_the_samples_the_loss_supervises():
    """The loss reads the options from BERT4Rec's config, so they travel in the result row's ``config``."""
    seen: list[int] = []
    for options in ({}, {"cloze_copies": 3}, {"cloze_last_item_samples": True}):
        torch.manual_seed(0)
        model = models.build("bert4rec", num_items=9, max_len=6, hidden_size=8, num_heads=2, **options)
        assert all(model.config.to_dict()[key] == value for key, value in options.items())
        hook = model.head.register_forward_hook(lambda _module, _inputs, output: seen.append(output.shape[0]))
        loss = cloze_loss(model, WINDOWS, 0.2, torch.Generator().manual_seed(3), trim=True)
        hook.remove()
        assert torch.isfinite(loss)
    assert seen == [4, 12, 8]  # the model ran on 1, 3 and 1 + 1 samples per window


def test_the_cost_line_counts_every_cloze_sample() -> None:
    """Copies and the §3.6 samples multiply what an epoch computes; the cost estimate must say so."""
    import numpy as np

    from models.bert4rec import BERT4RecConfig
    from study.train.objectives import cloze_samples_per_window, computed_positions

    windows = np.array([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]])
    plain = computed_positions("cloze", windows, trim=True)
    assert plain == 2 * 4
    samples = cloze_samples_per_window(BERT4RecConfig(num_items=9, cloze_copies=3, cloze_last_item_samples=True))
    assert samples == 4 and computed_positions("cloze", windows, trim=True, cloze_samples=samples) == 4 * plain
    assert cloze_samples_per_window(BERT4RecConfig(num_items=9)) == 1
