"""Chunked causal linear attention (+ numerator-only RoPE): references, equivalences, Triton vs reference."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.testing import assert_close_rel, feature_map, linear_inputs, output_grads

TOL = {torch.float32: 1e-5, torch.float16: 2e-2}
VARIANTS = [(True, False), (True, True), (False, False), (False, True)]  # (normalize, rope)
VARIANT_IDS = ["norm", "norm-rope", "plain", "plain-rope"]


@pytest.mark.parametrize("normalize,rope", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("chunk", [16, 64])
def test_chunked_reference_equals_the_quadratic_form(normalize, rope, chunk):
    torch.manual_seed(0)
    q, k, v = feature_map(*linear_inputs(2, 2, 70, 8, dv=6, dtype=torch.float64, requires_grad=False))
    kw = dict(normalize=normalize, rope=rope)
    fast = kernels.naive_chunk_causal_linear_attention(q, k, v, chunk_size=chunk, **kw)
    slow = kernels.naive_quadratic_causal_linear_attention(q, k, v, **kw)
    assert_close_rel(fast, slow, 1e-12, "chunked vs O(N²)")


def test_chunked_reference_spends_no_compute_on_chunk_padding():
    """The CPU path cuts N positions into equal chunks of at most 64: a short (trimmed) window is one chunk of its
    own length, and 70 positions are two chunks of 35, not 128 rows of which 58 are zeros."""
    from torch.utils.flop_counter import FlopCounterMode

    def flops(n: int) -> int:
        q, k, v = feature_map(*linear_inputs(2, 2, n, 8, dtype=torch.float32, requires_grad=False))
        with FlopCounterMode(display=False) as counter:
            kernels.naive_chunk_causal_linear_attention(q, k, v, normalize=True, rope=True)
        return counter.get_total_flops()

    assert flops(64) >= 7 * flops(8)  # the intra-chunk T×T products shrink with T
    assert flops(70) <= 1.2 * flops(64)  # 2×35, against 2×64 for fixed chunks of 64


def test_quadratic_form_matches_a_per_position_loop():
    """The O(N²) reference itself against the definition, position by position (with RoPE)."""
    torch.manual_seed(1)
    q, k, v = (torch.rand(1, 2, 7, 4, dtype=torch.float64) for _ in range(3))
    theta = kernels.rope_theta(2, 4, 10000.0)
    qr, kr = kernels.apply_rope(q, theta), kernels.apply_rope(k, theta)
    out = kernels.naive_quadratic_causal_linear_attention(q, k, v, rope=True, eps=1e-6)
    for h in range(2):
        for t in range(7):
            num = sum((qr[0, h, t] @ kr[0, h, s]) * v[0, h, s] for s in range(t + 1))
            den = sum(q[0, h, t] @ k[0, h, s] for s in range(t + 1)) + 1e-6
            assert torch.allclose(out[0, h, t], num / den, atol=1e-12)


def test_rope_scores_depend_only_on_the_offset():
    torch.manual_seed(2)
    theta = kernels.rope_theta(1, 16, 10000.0)
    a, b = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    seq = torch.zeros(1, 1, 40, 16, dtype=torch.float64)

    def score(i, j):
        qs, ks = seq.clone(), seq.clone()
        qs[0, 0, i], ks[0, 0, j] = a, b
        return kernels.apply_rope(qs, theta)[0, 0, i] @ kernels.apply_rope(ks, theta)[0, 0, j]

    for i, j in [(5, 2), (9, 9), (3, 11)]:
        for shift in (1, 7, 25):
            assert torch.allclose(score(i, j), score(i + shift, j + shift), atol=1e-12)
    assert not torch.allclose(score(5, 2), score(6, 2))  # and it does depend on the offset


def test_rope_uses_the_full_width_convention():
    """Head h of (B, H, N, d) is rotated as slice h of RoPE over the concatenated H·d width (RecGRELA)."""
    torch.manual_seed(3)
    x = torch.randn(2, 3, 11, 8, dtype=torch.float64)
    per_head = kernels.apply_rope(x, kernels.rope_theta(3, 8, 10000.0))
    merged = x.transpose(1, 2).reshape(2, 1, 11, 24)  # (B, 1, N, H·d)
    full = kernels.apply_rope(merged, kernels.rope_theta(1, 24, 10000.0))
    assert torch.allclose(per_head, full.reshape(2, 11, 3, 8).transpose(1, 2), atol=1e-12)


@pytest.mark.parametrize("normalize,rope", [(True, True), (False, False)], ids=["norm-rope", "plain"])
def test_reference_gradcheck_float64(normalize, rope):
    torch.manual_seed(4)
    q, k, v, mask = linear_inputs(1, 2, 7, 4, dtype=torch.float64, n_pad=[2])

    def fn(q, k, v):
        fq, fk, fv = feature_map(q, k, v, mask)
        return kernels.naive_chunk_causal_linear_attention(fq, fk, fv, normalize=normalize, rope=rope, chunk_size=4)

    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


@pytest.mark.parametrize("normalize,rope", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("d", [16, 32, 64])
def test_triton_matches_reference(triton_backend, d, dtype, normalize, rope):
    torch.manual_seed(d)
    raw = linear_inputs(2, 2, 70, d, dtype=dtype, n_pad=[0, 23])  # N = 70: partial last chunk
    fq, fk, fv = feature_map(*raw)
    kw = dict(normalize=normalize, rope=rope)
    out = kernels.causal_linear_attention(fq, fk, fv, backend=triton_backend, **kw)
    assert kernels.backend_used()["causal_linear_attention"] == "triton"
    grads = output_grads(out, raw[:3])
    ref = kernels.naive_quadratic_causal_linear_attention(fq, fk, fv, **kw)
    ref_grads = output_grads(ref, raw[:3])
    assert out.dtype == dtype
    assert_close_rel(out, ref, TOL[dtype], "o")
    for name, g, rg in zip("qkv", grads, ref_grads):
        assert_close_rel(g, rg, TOL[dtype], f"d{name}")


def test_triton_handles_value_dim_and_odd_head_dim(triton_backend):
    torch.manual_seed(5)
    raw = linear_inputs(1, 2, 33, 9, dv=5)
    fq, fk, fv = feature_map(*raw)
    out = kernels.causal_linear_attention(fq, fk, fv, backend=triton_backend)
    ref = kernels.naive_quadratic_causal_linear_attention(fq, fk, fv)
    assert_close_rel(out, ref, 1e-5, "o")
    for g, rg in zip(output_grads(out, raw[:3]), output_grads(ref, raw[:3])):
        assert_close_rel(g, rg, 1e-5, "grad")


@pytest.mark.parametrize("rope", [False, True], ids=["plain", "rope"])
def test_left_padding_gives_zero_rows_and_does_not_move_real_outputs(backend, rope):
    torch.manual_seed(6)
    n_pad = 9
    q, k, v, mask = linear_inputs(1, 2, 30, 16, n_pad=[n_pad])
    out = kernels.causal_linear_attention(*feature_map(q, k, v, mask), rope=rope, backend=backend)
    dq, dk, dv = output_grads(out, (q, k, v))
    assert (out[:, :, :n_pad] == 0).all()
    assert (dq[:, :, :n_pad] == 0).all() and (dk[:, :, :n_pad] == 0).all() and (dv[:, :, :n_pad] == 0).all()
    # the same items without padding: RoPE scores depend on offsets only, so nothing moves
    q2, k2, v2 = (t.detach()[:, :, n_pad:] for t in (q, k, v))
    mask2 = torch.ones(1, 30 - n_pad, dtype=torch.bool)
    unpadded = kernels.causal_linear_attention(*feature_map(q2, k2, v2, mask2), rope=rope, backend=backend)
    assert torch.allclose(out[:, :, n_pad:], unpadded, atol=1e-5)


def test_causal_outputs_ignore_the_future(backend):
    torch.manual_seed(7)
    q, k, v, mask = linear_inputs(1, 1, 40, 16, requires_grad=False)
    out = kernels.causal_linear_attention(*feature_map(q, k, v, mask), rope=True, backend=backend)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 25:] += 3.0
    v2[:, :, 25:] -= 2.0
    out2 = kernels.causal_linear_attention(*feature_map(q, k2, v2, mask), rope=True, backend=backend)
    assert torch.allclose(out[:, :, :25], out2[:, :, :25], atol=1e-6)
    assert not torch.allclose(out[:, :, 25:], out2[:, :, 25:], atol=1e-3)


def test_non_contiguous_inputs_give_the_contiguous_answer(backend):
    torch.manual_seed(8)
    fq, fk, fv = feature_map(*linear_inputs(2, 2, 21, 16, requires_grad=False))
    expected = kernels.causal_linear_attention(fq, fk, fv, rope=True, backend=backend)
    fqt = fq.transpose(1, 2).contiguous().transpose(1, 2)
    assert not fqt.is_contiguous()
    got = kernels.causal_linear_attention(fqt, fk, fv, rope=True, backend=backend)
    assert torch.allclose(got, expected, atol=1e-6)


def test_bad_inputs_raise_clear_errors():
    q, k, v = (torch.rand(2, 2, 8, 16) for _ in range(3))
    with pytest.raises(TypeError, match="floating"):
        kernels.causal_linear_attention(q.int(), k, v)
    with pytest.raises(TypeError, match="one dtype"):
        kernels.causal_linear_attention(q, k.half(), v)
    with pytest.raises(ValueError, match="k must have the shape of q"):
        kernels.causal_linear_attention(q, k[..., :8], v)
    with pytest.raises(ValueError, match=r"v must be \(B, H, N, dv\)"):
        kernels.causal_linear_attention(q, k, v[:, :1])
    with pytest.raises(ValueError, match="even head dim"):
        kernels.causal_linear_attention(q[..., :7], k[..., :7], v, rope=True)
    with pytest.raises(ValueError, match="eps"):
        kernels.causal_linear_attention(q, k, v, eps=-1.0)
    with pytest.raises(ValueError, match="is not one of"):
        kernels.causal_linear_attention(q, k, v, backend="cuda")


def test_unsupported_sizes_error_when_triton_is_forced(triton_backend):
    q, k, v = (torch.rand(1, 1, 8, 130) for _ in range(3))
    with pytest.raises(ValueError, match="outside the Triton kernels' range"):
        kernels.causal_linear_attention(q, k, v, backend="triton")


def test_causal_cosine_attention_is_linear_attention_on_normalised_inputs(backend):
    """The documented recipe (kernels/cosine/__init__.py) equals the masked N×N causal cosine form."""
    torch.manual_seed(9)
    q, k, v, mask = linear_inputs(2, 2, 25, 16, n_pad=[0, 6], requires_grad=False)
    keep = mask[:, None, :, None].float()
    c = mask.sum(1).float().clamp(min=1)[:, None, None, None] ** 0.6

    def unit(x):
        return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + kernels.COSINE_EPS)

    fq, fk, fv = unit(q), unit(k) * keep, v * keep / c
    out = kernels.causal_linear_attention(fq, fk, fv, normalize=False, backend=backend)
    scores = (unit(q) @ (unit(k) * keep).transpose(-1, -2)).tril()
    assert torch.allclose(out, scores @ (v * keep / c), atol=1e-5)


def test_apply_rope_keeps_the_angle_precise_for_half_inputs():
    """Angles of thousands of radians must not be rounded to fp16 (the rotation runs in fp32)."""
    x = torch.randn(1, 1, 3000, 16)
    theta = kernels.rope_theta(1, 16, 10000.0)
    assert_close_rel(kernels.apply_rope(x.half(), theta).float(), kernels.apply_rope(x, theta), 2e-3, "fp16")
