"""Cotten4Rec cosine attention: reference maths, gradients, and the Triton kernels against the reference."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.testing import assert_close_rel, cosine_inputs, output_grads

TOL = {torch.float32: 1e-5, torch.float16: 2e-2}


def test_reassociated_reference_equals_the_quadratic_form():
    torch.manual_seed(0)
    q, k, v, mask, m = cosine_inputs(2, 2, 37, 8, dtype=torch.float64, n_pad=[0, 11])
    fast = kernels.naive_cosine_attention(q, k, v, mask, m)
    slow = kernels.naive_quadratic_cosine_attention(q, k, v, mask, m)
    assert_close_rel(fast, slow, 1e-12, "Q̂(K̂ᵀV′) vs (Q̂K̂ᵀ)V′")


def test_reference_matches_the_formula_written_out_by_hand():
    """Independent of naive.py: per-row loops with F.normalize-style maths and the n^σ(m) clamp."""
    torch.manual_seed(1)
    q, k, v, mask, m = cosine_inputs(1, 2, 9, 4, dtype=torch.float64, n_pad=[3], requires_grad=False)
    out = kernels.naive_cosine_attention(q, k, v, mask, m)
    n = int(mask.sum())
    for h in range(2):
        c = max(1.0, n ** torch.sigmoid(m[h]).item())
        for i in range(9):
            expected = torch.zeros(4, dtype=torch.float64)
            if mask[0, i]:
                qi = q[0, h, i] / torch.sqrt(q[0, h, i].pow(2).sum() + kernels.COSINE_EPS)
                for j in range(9):
                    if mask[0, j]:
                        kj = k[0, h, j] / torch.sqrt(k[0, h, j].pow(2).sum() + kernels.COSINE_EPS)
                        expected += (qi @ kj) * v[0, h, j] / c
            assert torch.allclose(out[0, h, i], expected, atol=1e-12)


def test_reference_gradcheck_float64():
    torch.manual_seed(2)
    q, k, v, mask, m = cosine_inputs(2, 2, 6, 4, dtype=torch.float64, n_pad=[0, 2])
    m = m.double().detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: kernels.naive_cosine_attention(*a[:3], mask, a[3]), (q, k, v, m))


def test_dm_matches_the_closed_form_of_the_spec():
    """spec §10.1: dm_h = Σ_b [c>1]·(−ln n_b)·σ(1−σ)·Σ_i v′_i·dv′_i, with dv′ = k̂ dS."""
    torch.manual_seed(3)
    q, k, v, mask, m = cosine_inputs(2, 2, 10, 4, dtype=torch.float64, n_pad=[0, 4])
    m = m.double().detach().requires_grad_()
    out = kernels.naive_cosine_attention(q, k, v, mask, m)
    do = torch.randn_like(out)
    (dm,) = torch.autograd.grad(out, (m,), do)
    with torch.no_grad():
        maskf = mask[:, None, :, None].double()
        qh = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + kernels.COSINE_EPS) * maskf
        kh = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + kernels.COSINE_EPS) * maskf
        n = mask.sum(1).double()
        sig = torch.sigmoid(m)
        c = torch.clamp(n[:, None] ** sig[None, :], min=1.0)
        v_s = v * maskf / c[:, :, None, None]
        d_state = qh.transpose(-1, -2) @ do
        dv_s = kh @ d_state
        inner = (v_s * dv_s).sum((-1, -2))  # (B, H)
        expected = ((c > 1) * (-torch.log(n))[:, None] * sig * (1 - sig) * inner).sum(0)
    assert torch.allclose(dm, expected, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("d", [16, 32, 64])
def test_triton_matches_reference(triton_backend, dtype, d):
    torch.manual_seed(d)
    # N = 70 is not a multiple of any block size; row 1 has 23 left-padded positions
    q, k, v, mask, m = cosine_inputs(2, 2, 70, d, dtype=dtype, n_pad=[0, 23])
    out = kernels.cosine_attention(q, k, v, mask, m, backend=triton_backend)
    assert kernels.backend_used()["cosine_attention"] == "triton"
    grads = output_grads(out, (q, k, v, m))
    ref = kernels.cosine_attention(q, k, v, mask, m, backend="reference")
    ref_grads = output_grads(ref, (q, k, v, m))
    assert out.dtype == dtype
    assert_close_rel(out, ref, TOL[dtype], "o")
    for name, g, rg in zip("qkvm", grads, ref_grads):
        assert_close_rel(g, rg, TOL[dtype], f"d{name}")


def test_triton_handles_value_dim_and_odd_head_dim(triton_backend):
    torch.manual_seed(5)
    q, k, v, mask, m = cosine_inputs(2, 1, 19, 12, dv=20, n_pad=[5, 0])
    out = kernels.cosine_attention(q, k, v, mask, m, backend=triton_backend)
    ref = kernels.naive_cosine_attention(q, k, v, mask, m)
    assert_close_rel(out, ref, 1e-5, "o")
    for g, rg in zip(output_grads(out, (q, k, v, m)), output_grads(ref, (q, k, v, m))):
        assert_close_rel(g, rg, 1e-5, "grad")


def test_padded_rows_give_zero_output_and_zerooutput_grads(backend):
    torch.manual_seed(6)
    q, k, v, mask, m = cosine_inputs(2, 2, 20, 16, n_pad=[7, 0])
    out = kernels.cosine_attention(q, k, v, mask, m, backend=backend)
    dq, dk, dv, dm = output_grads(out, (q, k, v, m))
    pad = ~mask[:, None, :, None].expand_as(out)
    assert (out[pad] == 0).all()
    for g in (dq, dk, dv):
        assert (g[pad.expand_as(g)] == 0).all()
    # and the real rows do not depend on what sits in the padding
    q2, k2, v2 = (t.detach().clone() for t in (q, k, v))
    for t in (q2, k2, v2):
        t[0, :, :7] = 1e3 * torch.randn_like(t[0, :, :7])
    out2 = kernels.cosine_attention(q2, k2, v2, mask, m, backend=backend)
    assert torch.allclose(out2, out, atol=1e-5)


def test_all_padding_row_is_zero_and_finite(backend):
    q, k, v, mask, m = cosine_inputs(2, 2, 9, 16, n_pad=[9, 0])
    out = kernels.cosine_attention(q, k, v, mask, m, backend=backend)
    grads = output_grads(out, (q, k, v, m))
    assert (out[0] == 0).all()
    assert all(torch.isfinite(g).all() for g in grads)


def test_non_contiguous_inputs_give_the_contiguous_answer(backend):
    torch.manual_seed(7)
    q, k, v, mask, m = cosine_inputs(2, 2, 13, 16, requires_grad=False)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, (B, N, H, d) memory layout
    assert not qt.is_contiguous()
    expected = kernels.cosine_attention(q, k, v, mask, m, backend=backend)
    assert torch.allclose(kernels.cosine_attention(qt, k, v, mask, m, backend=backend), expected, atol=1e-6)


def test_bad_inputs_raise_clear_errors():
    q, k, v, mask, m = cosine_inputs(2, 2, 8, 16, requires_grad=False)
    with pytest.raises(TypeError, match="mask must be a bool"):
        kernels.cosine_attention(q, k, v, mask.float(), m)
    with pytest.raises(TypeError, match="floating"):
        kernels.cosine_attention(q.long(), k, v, mask, m)
    with pytest.raises(TypeError, match="one dtype"):
        kernels.cosine_attention(q, k.half(), v, mask, m)
    with pytest.raises(ValueError, match="k must have the shape of q"):
        kernels.cosine_attention(q, k[:, :, :5], v, mask, m)
    with pytest.raises(ValueError, match=r"mask must have shape \(B, N\)"):
        kernels.cosine_attention(q, k, v, mask[:, :5], m)
    with pytest.raises(ValueError, match=r"m must have shape \(H,\)"):
        kernels.cosine_attention(q, k, v, mask, m[:1])
    with pytest.raises(ValueError, match=r"\(B, H, N, d\)"):
        kernels.cosine_attention(q[0], k[0], v[0], mask, m)


def test_unsupported_head_dim_errors_when_forced_and_falls_back_under_auto(triton_backend):
    q, k, v, mask, m = cosine_inputs(1, 1, 8, 160, requires_grad=False)
    with pytest.raises(ValueError, match="outside the Triton kernels' range"):
        kernels.cosine_attention(q, k, v, mask, m, backend="triton")
    q64, k64, v64 = q.double(), k.double(), v.double()
    with pytest.raises(ValueError, match="fp16/bf16/fp32"):
        kernels.cosine_attention(q64, k64, v64, mask, m, backend="triton")
    out = kernels.cosine_attention(q, k, v, mask, m, backend="auto")  # CPU -> reference anyway
    assert kernels.backend_used()["cosine_attention"] == "reference"
    assert torch.allclose(out, kernels.naive_cosine_attention(q, k, v, mask, m))
