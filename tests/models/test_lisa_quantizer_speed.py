"""LISA's quantizer shortcuts (r·(U·Cᵀ), the straight-through gather) equal the plain formulation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import models


def _plain_quantizer(quantizer, x):
    residual, assigns, vectors = x, [], 0.0
    for book in quantizer.codebooks:
        logits = (residual @ quantizer.bilinear) @ book.T
        probs = (logits / quantizer.temperature).softmax(-1)
        assign = probs + (F.one_hot(logits.argmax(-1), book.shape[0]).to(probs) - probs).detach()
        chosen = assign @ book
        residual = residual - chosen
        assigns.append(assign)
        vectors = vectors + chosen
    return torch.stack(assigns, -2), vectors


def test_quantizer_values_and_gradients_equal_the_matmul_formulation():
    torch.manual_seed(0)
    model = models.build("lisa", num_items=50, max_len=10, hidden_size=32, num_codebooks=3, num_codewords=8,
                         inner_size=32)
    quantizer = model.quantizer
    x = torch.randn(4, 10, 32, requires_grad=True)
    plain_assign, plain_vectors = _plain_quantizer(quantizer, x)
    fast = quantizer(x)
    assert torch.equal(fast.assign, plain_assign)
    assert torch.equal(fast.vectors, plain_vectors)  # a one-hot product adds zeros only: the gather is exact
    weights = torch.randn_like(plain_assign), torch.randn_like(plain_vectors)
    parameters = (x, quantizer.codebooks, quantizer.bilinear)
    expected = torch.autograd.grad((plain_assign * weights[0]).sum() + (plain_vectors * weights[1]).sum(), parameters)
    got = torch.autograd.grad((fast.assign * weights[0]).sum() + (fast.vectors * weights[1]).sum(), parameters)
    for g, e in zip(got, expected):
        assert float((g - e).abs().max() / e.abs().max()) < 1e-5  # float32 reassociation; observed ≤ 4e-7
