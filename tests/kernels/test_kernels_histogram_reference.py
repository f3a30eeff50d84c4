"""The hand-written reference of the histogram attention against its autograd formulation, and the scans."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.histogram.naive import (
    autograd_causal_histogram_attention,
    decayed_cumsum,
    matmul_decayed_cumsum,
    naive_causal_histogram_attention,
)

# float32 outputs and gradients agree to 1e-5 of the largest entry (observed: ≤ 6e-7); float64 to 1e-10
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


def _recurrence(x: torch.Tensor, gamma: float | None, reverse: bool) -> torch.Tensor:
    out, carry, step = torch.zeros_like(x), torch.zeros_like(x[:, 0]), 1.0 if gamma is None else gamma
    for i in reversed(range(x.shape[1])) if reverse else range(x.shape[1]):
        carry = step * carry + x[:, i]
        out[:, i] = carry
    return out


@pytest.mark.parametrize("gamma", [None, 0.9, 0.05])
@pytest.mark.parametrize("length", [1, 7, 70, 130])
def test_scans_equal_the_recurrence_forward_and_reverse(gamma, length):
    x = torch.randn(2, length, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(length))
    for reverse in (False, True):
        assert torch.allclose(decayed_cumsum(x, gamma, reverse=reverse), _recurrence(x, gamma, reverse), atol=1e-12)
    assert torch.allclose(matmul_decayed_cumsum(x, gamma), _recurrence(x, gamma, False), atol=1e-12)


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((got - expected).abs().max() / expected.abs().max().clamp(min=1e-30)).detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("decay", [None, 0.9])
@pytest.mark.parametrize("hard", [True, False], ids=["straight-through", "soft"])
def test_hand_written_backward_equals_autograd(dtype, decay, hard):
    generator = torch.Generator().manual_seed(3)
    B, N, C, W, D = 3, 41, 2, 8, 16
    raw = torch.randn(B, N, C, W, dtype=dtype, generator=generator, requires_grad=True)
    probs = raw.softmax(-1)
    assign = probs + (F.one_hot(probs.argmax(-1), W).to(dtype) - probs).detach() if hard else probs
    valid = torch.ones(B, N, dtype=dtype)
    valid[0, :7] = 0  # left padding: empty histograms, output 0
    assign = assign * valid[..., None, None]
    codes = torch.randint(0, W, (B, N, C), generator=generator)
    table = torch.randn(C, W, W, dtype=dtype, generator=generator, requires_grad=True)
    values = torch.randn(C, W, D, dtype=dtype, generator=generator, requires_grad=True)
    grad_out = torch.randn(B, N, D, dtype=dtype, generator=generator)
    results = []
    for attention in (autograd_causal_histogram_attention, naive_causal_histogram_attention):
        out = attention(assign, codes, table, values, decay=decay)
        results.append((out, *torch.autograd.grad(out, (raw, table, values), grad_out, retain_graph=True)))
    for got, expected in zip(results[1], results[0]):
        assert _relative_error(got, expected) < TOLERANCE[dtype]
    assert (results[1][0][0, :7] == 0).all()


def test_backward_can_run_twice_on_a_retained_graph():
    generator = torch.Generator().manual_seed(4)
    assign = torch.rand(2, 9, 2, 5, generator=generator, requires_grad=True)
    codes = torch.randint(0, 5, (2, 9, 2), generator=generator)
    table, values = torch.randn(2, 5, 5, generator=generator), torch.randn(2, 5, 6, generator=generator)
    out = naive_causal_histogram_attention(assign, codes, table, values, decay=0.8)
    first = torch.autograd.grad(out.sum(), assign, retain_graph=True)[0]
    second = torch.autograd.grad(out.sum(), assign)[0]
    assert torch.equal(first, second)
