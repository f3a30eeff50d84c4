"""The speed benchmark's yardsticks: the plain SASRec computes the platform's loss, the FLOP count is the formula
the benchmark states, and pmixer's run is wrapped and parsed without touching its code."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch

import models
from benchmarks.plain_sasrec import PlainSASRec, all_position_ce, train_epoch
from benchmarks.speed import Shape, step_gflop, time_pmixer, write_pmixer_dataset
from study.train.objectives import causal_loss
from study.train.trainer import TrialData


def plain_with_weights_of(ours: torch.nn.Module, num_items: int, max_len: int) -> PlainSASRec:
    """A PlainSASRec holding our SASRec's weights: the fused (3d, d) QKV matrix split into its Q, K and V rows."""
    plain = PlainSASRec(num_items, max_len, dropout=0.0)
    with torch.no_grad():
        plain.items.weight.copy_(ours.embedding.items.weight)
        plain.positions.weight.copy_(ours.embedding.positions.weight)
        plain.embed_norm.load_state_dict(ours.embedding.norm.state_dict())
        for mine, theirs in zip(plain.blocks, ours.encoder.blocks):
            for index, part in enumerate((mine.query, mine.key, mine.value)):
                rows = slice(index * 64, (index + 1) * 64)
                part.weight.copy_(theirs.mixer.qkv.weight[rows])
                part.bias.copy_(theirs.mixer.qkv.bias[rows])
            mine.proj.load_state_dict(theirs.mixer.out.state_dict())
            mine.ffn[0].load_state_dict(theirs.ffn.up.state_dict())
            mine.ffn[2].load_state_dict(theirs.ffn.down.state_dict())
            mine.norm1.load_state_dict(theirs.norm_mix.state_dict())
            mine.norm2.load_state_dict(theirs.norm_ffn.state_dict())
    return plain


def test_plain_reference_computes_our_loss_and_outputs_with_mapped_weights():
    """Fused QKV (ours) and separate Q, K, V (plain) give the same hidden states to 1e-6 and the same loss to 1e-6
    on left-padded windows, so the benchmark compares two implementations of one model and one loss."""
    torch.manual_seed(0)
    num_items, max_len = 40, 12
    ours = models.build("sasrec", num_items=num_items, max_len=max_len).eval()
    plain = plain_with_weights_of(ours, num_items, max_len).eval()
    windows = torch.randint(1, num_items + 1, (6, max_len + 1))
    for row, padding in enumerate((0, 3, 7, 11, 5, 9)):
        windows[row, :padding] = 0
    with torch.no_grad():
        real = windows[:, :-1] > 0
        ours_hidden, plain_hidden = ours(windows[:, :-1]), plain(windows[:, :-1])
        torch.testing.assert_close(plain_hidden[real], ours_hidden[real], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(all_position_ce(plain, windows), causal_loss(ours, windows), atol=1e-6, rtol=1e-6)


def test_plain_reference_learns_on_prepared_windows(synthetic_lastfm_prepared):
    data = TrialData.from_prepared(synthetic_lastfm_prepared, 50)
    torch.manual_seed(0)
    model = PlainSASRec(data.num_items, 50, hidden=32, inner=64, dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(0)
    first, steps = train_epoch(model, optimizer, data.train, 64, rng, max_steps=3)
    for _ in range(3):
        last, _ = train_epoch(model, optimizer, data.train, 64, rng, max_steps=3)
    assert steps == 3
    assert last < first - 0.1


def test_step_gflop_counts_the_stated_matrix_products():
    batch = np.array([[0, 0, 1, 2, 3], [4, 5, 6, 7, 8]])  # B = 2, L = 4; scored: 2 + 4 positions
    shape = Shape(hidden=8, heads=2, inner=16, layers=1, items=9, negatives=None)
    tokens, d = 8, 8
    forward = 8 * tokens * d * d + 4 * tokens * d * 16 + 4 * 2 * 16 * d + 2 * 6 * d * 10
    assert step_gflop(shape, batch) == pytest.approx(3 * forward / 1e9)
    one_negative = Shape(hidden=8, heads=2, inner=16, layers=1, items=9, negatives=1)
    assert step_gflop(shape, batch) - step_gflop(one_negative, batch) == pytest.approx(3 * 2 * 6 * d * 8 / 1e9)


def test_pmixer_is_fed_its_format_and_timed_from_its_output(synthetic_lastfm_prepared, tmp_path: Path):
    """A stand-in for pmixer's main.py (same arguments, same loss lines, data read from ./data/NAME.txt): the
    wrapper writes every user's whole sequence in time order and times the epochs after the first."""
    checkout = tmp_path / "checkout"
    (checkout / "python").mkdir(parents=True)
    (checkout / "python" / "main.py").write_text(
        "import argparse, time\n"
        "p = argparse.ArgumentParser()\n"
        "for name in ('dataset', 'train_dir', 'device', 'maxlen', 'dropout_rate', 'num_epochs'):\n"
        "    p.add_argument('--' + name)\n"
        "args = p.parse_args()\n"
        "lines = open(f'data/{args.dataset}.txt').read().split()\n"
        "assert len(lines) % 2 == 0 and lines[0] == '1'\n"
        "for epoch in range(1, int(args.num_epochs) + 1):\n"
        "    for step in range(2):\n"
        "        time.sleep(0.05 * epoch)\n"
        "        print(f'loss in epoch {epoch} iteration {step}: 0.5')\n")
    args = argparse.Namespace(threads=1, max_len=50, dropout=0.2, pmixer_epochs=2, device=torch.device("cpu"))
    epochs = time_pmixer(checkout, synthetic_lastfm_prepared, args)
    assert len(epochs) == 2
    assert epochs[0] == pytest.approx(0.2, abs=0.15) and epochs[1] > epochs[0]

    write_pmixer_dataset(synthetic_lastfm_prepared, tmp_path, "x")
    pairs = np.loadtxt(tmp_path / "data" / "x.txt", dtype=np.int64)
    from study.data import load_prepared

    dataset = load_prepared(synthetic_lastfm_prepared)
    indptr = np.asarray(dataset.history_indptr)
    assert len(pairs) == indptr[-1] and (np.diff(pairs[:, 0]) >= 0).all()
    first_user = pairs[pairs[:, 0] == 1, 1]
    np.testing.assert_array_equal(first_user, np.asarray(dataset.history_indices)[indptr[0]:indptr[1]])
