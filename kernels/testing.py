"""Random inputs and comparison helpers shared by tests/kernels/ and benchmarks.kernels.

Inputs follow the project's conventions: LEFT padding (real items at the end of each row), k/v zeroed at
padding for the causal ops, zero assignment rows at padding for LISA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def left_padding_mask(batch: int, seq_len: int, n_pad: list[int] | None = None,
                      device: torch.device | str | None = None) -> torch.Tensor:
    """(B, N) bool, True = real item; row b has ``n_pad[b]`` padded positions on the left."""
    if n_pad is None:
        n_pad = [(b * seq_len) // (2 * max(batch, 1)) for b in range(batch)]  # 0, N/4, ... padded
    pos = torch.arange(seq_len, device=device)
    return pos[None, :] >= torch.tensor(n_pad, device=device)[:, None]


def cosine_inputs(B: int, H: int, N: int, d: int, dv: int | None = None, dtype: torch.dtype = torch.float32,
                  device: torch.device | str | None = None, n_pad: list[int] | None = None,
                  requires_grad: bool = True) -> tuple[torch.Tensor, ...]:
    """Raw q, k, v (B, H, N, d/dv), mask (B, N) and m (H,) for :func:`kernels.cosine_attention`."""
    dv = d if dv is None else dv
    q = torch.randn(B, H, N, d, device=device, dtype=dtype)
    k = torch.randn(B, H, N, d, device=device, dtype=dtype)
    v = torch.randn(B, H, N, dv, device=device, dtype=dtype)
    mask = left_padding_mask(B, N, n_pad, device)
    m = torch.full((H,), 0.5, device=device) + 0.3 * torch.randn(H, device=device)
    if requires_grad:
        for t in (q, k, v, m):
            t.requires_grad_()
    return q, k, v, mask, m


def linear_inputs(B: int, H: int, N: int, d: int, dv: int | None = None, dtype: torch.dtype = torch.float32,
                  device: torch.device | str | None = None, n_pad: list[int] | None = None,
                  requires_grad: bool = True) -> tuple[torch.Tensor, ...]:
    """Raw projections (q, k, v) and the padding mask; :func:`feature_map` turns them into kernel inputs."""
    dv = d if dv is None else dv
    q = torch.randn(B, H, N, d, device=device, dtype=dtype)
    k = torch.randn(B, H, N, d, device=device, dtype=dtype)
    v = torch.randn(B, H, N, dv, device=device, dtype=dtype)
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_()
    return q, k, v, left_padding_mask(B, N, n_pad, device)


def feature_map(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RecGRELA's caller side: ELU+1 features, k and v zeroed at (left) padding."""
    keep = mask[:, None, :, None].to(v.dtype)
    return F.elu(q) + 1, (F.elu(k) + 1) * keep, v * keep


def histogram_inputs(
    B: int, N: int, C: int, W: int, D: int, dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None, n_pad: list[int] | None = None, soft: bool = False,
    temperature: float = 0.7, requires_grad: bool = True,
) -> tuple[torch.Tensor, ...]:
    """LISA inputs: straight-through one-hot (or softmax) assignments zeroed at padding, hard query codes,
    a logit table and value codewords.  Returns (assign, query_codes, logits_table, values, mask); assign is
    a leaf (gradients are read from it directly)."""
    mask = left_padding_mask(B, N, n_pad, device)
    logits = torch.randn(B, N, C, W, device=device)
    probs = torch.softmax(logits / temperature, dim=-1)
    codes = probs.argmax(dim=-1)
    if soft:
        assign = probs
    else:
        hard = F.one_hot(codes, W).to(probs.dtype)
        assign = probs + (hard - probs).detach()  # exactly one-hot in value
    assign = (assign * mask[:, :, None, None]).to(dtype).detach()
    table = (torch.randn(C, W, W, device=device) * 1.5).to(dtype)
    values = torch.randn(C, W, D, device=device).to(dtype)
    if requires_grad:
        for t in (assign, table, values):
            t.requires_grad_()
    return assign, codes, table, values, mask


def max_rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual − expected| / max |expected| in float64 (a scale-free error for whole tensors)."""
    a, e = actual.detach().double(), expected.detach().double()
    scale = e.abs().max().item()
    return (a - e).abs().max().item() / max(scale, 1e-12)


def assert_close_rel(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str = "") -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = max_rel_err(actual, expected)
    assert err <= tol, f"{what}: max rel err {err:.2e} > {tol:.1e}"


def output_grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Gradients of ``inputs`` for a seeded random output gradient: compares backward passes of two implementations."""
    generator = torch.Generator().manual_seed(seed)
    upstream = torch.randn(out.shape, generator=generator, device="cpu").to(out.device, out.dtype)
    return torch.autograd.grad(out, inputs, upstream, retain_graph=True)
