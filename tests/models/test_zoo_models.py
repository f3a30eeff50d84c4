"""Model zoo I (BERT4Rec, LinRec, Cotten4Rec, RecGRELA, GRU4Rec): the model contract on synthetic windows.

Causality, equivalence of each mixer with a naive in-test O(L²) computation, gradients on a real
batch, and clear errors for invalid settings. Learning runs are in ``test_zoo_learning.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import models
from models.mixers import merge_heads, split_heads
from study.train.objectives import objective_loss, resolve_objective
from study.train.trainer import TrialData, run_trial

MAX_LEN = 30

CAUSAL = {
    "linrec-causal-column": ("linrec", {"causal": True}),
    "linrec-causal-row": ("linrec", {"causal": True, "key_norm": "row"}),
    "cotten4rec-causal": ("cotten4rec", {"causal": True}),
    "recgrela-causal": ("recgrela", {"causal": True}),
    "gru4rec": ("gru4rec", {}),
}
BIDIRECTIONAL = {
    "bert4rec": ("bert4rec", {}),
    "cotten4rec": ("cotten4rec", {}),
    "linrec-paper": ("linrec", {}),
    "linrec-paper-row": ("linrec", {"key_norm": "row"}),
    "recgrela-paper": ("recgrela", {}),
}
ALL = {**CAUSAL, **BIDIRECTIONAL, "recgrela-one-layer": ("recgrela", {"num_layers": 1})}


@pytest.fixture(scope="module")
def data(synthetic_prepared) -> TrialData:
    return TrialData.from_prepared(synthetic_prepared, max_len=MAX_LEN)


@pytest.fixture(scope="module")
def windows(data) -> torch.Tensor:
    """Eight test windows: the four shortest users (left-padded) and four full ones."""
    lengths = (data.test.inputs > 0).sum(1)
    order = np.argsort(lengths, kind="stable")
    rows = np.concatenate([order[:4], order[-4:]])
    items = torch.as_tensor(data.test.inputs[rows], dtype=torch.long)
    assert (items[:4, 0] == 0).all() and (items[4:] > 0).all()
    return items


def build(data: TrialData, name: str, **hparams) -> models.SeqRecModel:
    torch.manual_seed(0)
    return models.build(name, num_items=data.num_items, max_len=MAX_LEN, **hparams)


def change_after(items: torch.Tensor, t: int, num_items: int) -> torch.Tensor:
    """Replace every real item after position t by another real item."""
    changed = items.clone()
    tail = changed[:, t + 1:]
    changed[:, t + 1:] = torch.where(tail > 0, tail % num_items + 1, tail)
    return changed


# --------------------------------------------------------------------------- causality


@pytest.mark.parametrize("key", CAUSAL)
def test_causal_models_ignore_items_after_t(key, data, windows, assert_differ):
    name, hparams = CAUSAL[key]
    model = build(data, name, **hparams).eval()
    assert model.is_causal and resolve_objective(model, "auto") == "causal"
    t = MAX_LEN - 8
    with torch.no_grad():
        before, after = model(windows), model(change_after(windows, t, data.num_items))
    torch.testing.assert_close(before[:, : t + 1], after[:, : t + 1], atol=1e-5, rtol=1e-5)
    assert_differ(before[:, t + 1:], after[:, t + 1:], atol=1e-3)


@pytest.mark.parametrize("key", BIDIRECTIONAL)
def test_bidirectional_models_do_see_items_after_t(key, data, windows, assert_differ):
    """The same change moves their early outputs, so the causality test above can fail."""
    name, hparams = BIDIRECTIONAL[key]
    model = build(data, name, **hparams).eval()
    assert not model.is_causal
    t = MAX_LEN - 8
    with torch.no_grad():
        before, after = model(windows), model(change_after(windows, t, data.num_items))
    assert_differ(before[4:, : t + 1], after[4:, : t + 1], atol=1e-4)


# --------------------------------------------------------------------------- equivalence: LinRec


def mixer_input(model: models.SeqRecModel, items: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.embedding(items)


def qkv_heads(mixer, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(split_heads(t, mixer.num_heads).double() for t in mixer.qkv(x).chunk(3, dim=-1))


def naive_linrec(q, k, v, valid, causal: bool, key_norm: str) -> torch.Tensor:
    """LinRec attention written out per query t over the keys it may see, as an explicit L×L product."""
    length = q.shape[2]
    q = F.elu(q)
    q = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    k = F.elu(k) * valid[:, None, :, None]
    v = v * valid[:, None, :, None]
    out = torch.zeros_like(v)
    for t in range(length):
        visible = k[:, :, : t + 1] if causal else k
        if key_norm == "row":
            normed = visible / (visible.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
        else:  # each feature column over the visible positions
            normed = visible / (visible.pow(2).sum(2, keepdim=True) + 1e-6).sqrt()
        scores = q[:, :, t: t + 1] @ normed.transpose(-1, -2)  # (B, H, 1, visible)
        out[:, :, t: t + 1] = scores @ v[:, :, : normed.shape[2]]
    return out / math.sqrt(q.shape[-1])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("key_norm", ["column", "row"])
def test_linrec_mixer_equals_naive_quadratic_form(causal, key_norm, data, windows):
    model = build(data, "linrec", causal=causal, key_norm=key_norm).eval()
    mixer = model.encoder.blocks[0].mixer
    x, valid = mixer_input(model, windows), windows > 0
    with torch.no_grad():
        got = mixer(x, valid)
        q, k, v = qkv_heads(mixer, x)
        expected = mixer.out(merge_heads(naive_linrec(q, k, v, valid, causal, key_norm)).float())
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("key_norm", ["column", "row"])
def test_linrec_causal_form_equals_paper_form_at_the_newest_position(key_norm, data, windows, assert_differ):
    """Prefix column norms make the causal mixer the paper's mixer at the position that is ranked."""
    causal = build(data, "linrec", causal=True, key_norm=key_norm).eval()
    paper = build(data, "linrec", causal=False, key_norm=key_norm).eval()
    paper.load_state_dict(causal.state_dict())
    x, valid = mixer_input(causal, windows), windows > 0
    with torch.no_grad():
        ours = causal.encoder.blocks[0].mixer(x, valid)
        theirs = paper.encoder.blocks[0].mixer(x, valid)
    torch.testing.assert_close(ours[:, -1], theirs[:, -1], atol=1e-5, rtol=1e-5)
    assert_differ(ours[:, :-1], theirs[:, :-1], atol=1e-4)


# --------------------------------------------------------------------------- equivalence: Cotten4Rec


def naive_cosine(q, k, v, valid, m, causal: bool) -> torch.Tensor:
    """(Q̂ K̂ᵀ) V′ with the L×L score matrix; V′ scaled by 1 / max(1, n ** σ(m)) (prefix n when causal)."""
    mask = valid[:, None, :, None].double()
    qh = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() * mask
    kh = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() * mask
    scores = qh @ kh.transpose(-1, -2)
    exponent = torch.sigmoid(m.double())[None, :, None, None]
    if causal:
        scores = scores.tril()
        count = valid.double().cumsum(1)[:, None, :, None]  # per query position
        return (scores @ (v * mask)) / torch.clamp(count**exponent, min=1.0)
    count = valid.double().sum(1)[:, None, None, None]
    return scores @ (v * mask / torch.clamp(count**exponent, min=1.0))


@pytest.mark.parametrize("causal", [False, True])
def test_cotten4rec_mixer_equals_naive_quadratic_form(causal, data, windows):
    model = build(data, "cotten4rec", causal=causal).eval()
    mixer = model.encoder.blocks[0].mixer
    with torch.no_grad():
        mixer.m.copy_(torch.tensor([-0.7, 1.3]))  # distinct heads: the scale must be applied per head
    x, valid = mixer_input(model, windows), windows > 0
    with torch.no_grad():
        got = mixer(x, valid)
        q, k, v = qkv_heads(mixer, x)
        expected = mixer.out(merge_heads(naive_cosine(q, k, v, valid, mixer.m, causal)).float())
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_cotten4rec_causal_variant_equals_bidirectional_at_the_newest_position(data, windows):
    causal = build(data, "cotten4rec", causal=True).eval()
    bidirectional = build(data, "cotten4rec").eval()
    bidirectional.load_state_dict(causal.state_dict())
    x, valid = mixer_input(causal, windows), windows > 0
    with torch.no_grad():
        ours = causal.encoder.blocks[0].mixer(x, valid)
        theirs = bidirectional.encoder.blocks[0].mixer(x, valid)
    torch.testing.assert_close(ours[:, -1], theirs[:, -1], atol=1e-5, rtol=1e-5)


def test_cotten4rec_learnable_scale_starts_at_paper_value_per_head_and_layer(data):
    model = build(data, "cotten4rec", num_heads=4)
    scales = [block.mixer.m for block in model.encoder.blocks]
    assert len(scales) == 2 and all(m.shape == (4,) and torch.all(m == 0.5) for m in scales)
    assert len({id(m) for m in scales}) == 2


# --------------------------------------------------------------------------- equivalence: RecGRELA


def naive_rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """Full-width RoPE with complex numbers: pair (2j, 2j+1) of position p rotated by p·base^(-j/(D/2))."""
    batch, length, width = x.shape
    j = torch.arange(width // 2, dtype=torch.float64)
    angle = torch.arange(length, dtype=torch.float64)[:, None] * base ** (-j / (width // 2))[None, :]
    rotation = torch.polar(torch.ones_like(angle), angle)
    return torch.view_as_real(torch.view_as_complex(x.reshape(batch, length, width // 2, 2)) * rotation).flatten(-2)


def naive_rela(rela, x: torch.Tensor, valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """RELA + local shortcut with explicit L×L scores and an explicit tap-by-tap causal conv."""
    x = x.double()
    batch, length, width = x.shape
    weight, bias = rela.qk.weight.double(), rela.qk.bias.double()
    q, k = (F.elu(t) + 1 for t in (x @ weight.T + bias).chunk(2, dim=-1))
    qr, kr = naive_rope(q, rela.rope_base), naive_rope(k, rela.rope_base)
    heads, dim = rela.num_heads, width // rela.num_heads
    allowed = valid[:, None, :].expand(batch, length, length).double()
    if causal:
        allowed = allowed.tril()
    out = torch.zeros_like(x)
    for h in range(heads):
        cols = slice(h * dim, (h + 1) * dim)
        numerator = qr[..., cols] @ kr[..., cols].transpose(1, 2)
        denominator = q[..., cols] @ k[..., cols].transpose(1, 2)
        if causal:  # padded keys and values dropped, prefix only
            out[..., cols] = ((numerator * allowed) @ x[..., cols]) / (
                (denominator * allowed).sum(-1, keepdim=True) + rela.eps)
        else:  # the official code: every position of the window, pads included
            out[..., cols] = (numerator @ x[..., cols] / length) / (denominator.mean(-1, keepdim=True) + rela.eps)
    masked = x * valid[..., None]
    taps = rela.conv.weight.double()[:, 0, :]  # (D, K); output t = Σ_j w_j · x[t - (K-1) + j]
    size = taps.shape[1]
    local = rela.conv.bias.double().expand(batch, length, width).clone()
    for j in range(size):
        shift = size - 1 - j
        local[:, shift:] += taps[:, j] * masked[:, : length - shift]
    return out + F.silu(local)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("conv_kernel_size", [4, 1])
def test_rela_equals_naive_quadratic_form(causal, conv_kernel_size, data, windows):
    model = build(data, "recgrela", causal=causal, conv_kernel_size=conv_kernel_size).eval()
    block = model.blocks[0]
    valid = windows > 0
    with torch.no_grad():
        x = block.in_proj(block.norm_mix(model.embedding_norm(model.items(windows))))
        got = block.rela(x, valid)
        expected = naive_rela(block.rela, x, valid, causal).float()
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_rope_scores_depend_on_the_offset_only(assert_differ):
    """⟨R_i q, R_j k⟩ = ⟨R_{i+s} q, R_{j+s} k⟩ for the rotation RELA uses (full width, 4 heads)."""
    import kernels

    torch.manual_seed(0)
    q, k = torch.rand(2, 64, dtype=torch.float64) + 1, torch.rand(2, 64, dtype=torch.float64) + 1
    theta = kernels.rope_theta(4, 16, 10000.0).double()

    def score(i: int, j: int) -> torch.Tensor:
        length = max(i, j) + 1
        sequence_q = torch.zeros(2, length, 64, dtype=torch.float64)
        sequence_k = torch.zeros_like(sequence_q)
        sequence_q[:, i], sequence_k[:, j] = q, k
        rq = merge_heads(kernels.apply_rope(split_heads(sequence_q, 4), theta))[:, i]
        rk = merge_heads(kernels.apply_rope(split_heads(sequence_k, 4), theta))[:, j]
        return (rq * rk).sum(-1)

    torch.testing.assert_close(score(3, 1), score(40, 38))
    torch.testing.assert_close(score(1, 3), score(150, 152))
    assert_differ(score(3, 1), score(3, 2))


@pytest.mark.parametrize("name,hparams", [("recgrela", {"causal": True}), ("gru4rec", {})])
def test_outputs_do_not_depend_on_the_amount_of_left_padding(name, hparams, data, windows):
    """No absolute positions: relative RoPE + zeroed pads (RecGRELA), zero state through pads (GRU4Rec)."""
    model = build(data, name, **hparams).eval()
    padded = torch.cat([torch.zeros(len(windows), 7, dtype=torch.long), windows], dim=1)
    with torch.no_grad():
        short, long = model(windows), model(padded)[:, 7:]
    torch.testing.assert_close(short, long, atol=1e-5, rtol=1e-5)


def test_recgrela_paper_form_sums_over_padding(data, windows, assert_differ):
    """The paper's non-causal RELA includes pads in its sums, so extra padding changes the outputs."""
    model = build(data, "recgrela").eval()
    padded = torch.cat([torch.zeros(len(windows), 7, dtype=torch.long), windows], dim=1)
    with torch.no_grad():
        assert_differ(model(windows), model(padded)[:, 7:], atol=1e-4)


def test_recgrela_records_which_rela_form_ran(data):
    assert build(data, "recgrela").stats() == {"rela_causal": 0.0}
    assert build(data, "recgrela", causal=True).stats() == {"rela_causal": 1.0}


def test_recgrela_defaults_and_parameter_count_match_the_paper():
    """Spec §1.7: 436,672 parameters on ML-1M (3,417 embedding rows incl. padding), at its window of 200 (the zoo's
    default window is 50, models.base)."""
    model = models.build("recgrela", num_items=3416, max_len=200)
    c = model.config
    assert (c.hidden_size, c.num_layers, c.num_heads, c.conv_kernel_size, c.drop_path) == (64, 4, 4, 4, 0.1)
    assert sum(p.numel() for p in model.parameters()) == 436_672


# --------------------------------------------------------------------------- BERT4Rec next-item query


def test_bert4rec_ranks_the_next_item_through_an_appended_mask_token(data, windows, assert_differ):
    model = build(data, "bert4rec").eval()
    assert model.mask_token == data.num_items + 1
    assert model.item_weights().shape[0] == data.num_items + 1  # the mask token is never ranked
    oldest_changed, newest_changed = windows.clone(), windows.clone()
    oldest_changed[4:, 0] = windows[4:, 0] % data.num_items + 1
    newest_changed[:, -1] = windows[:, -1] % data.num_items + 1
    with torch.no_grad():
        query = model.last_hidden(windows)
        # the window shifts left by one, so the oldest item falls out and the newest is still read
        torch.testing.assert_close(query[4:], model.last_hidden(oldest_changed)[4:])
        assert_differ(query, model.last_hidden(newest_changed), atol=1e-4)
        assert_differ(query, model(windows)[:, -1], atol=1e-4)


def test_bert4rec_scores_add_the_papers_output_bias_through_the_scoring_contract(data, windows):
    """softmax(GELU(h W^P + b^P) E^T + b^O): the bias b^O rides as one more column of the hidden state (a
    constant 1) and of the item weights (the bias), so ``hidden @ item_weights().T`` is ``h·e_i + b_i``."""
    model = build(data, "bert4rec").eval()
    plain = build(data, "bert4rec", output_bias=False).eval()
    assert plain.output_bias is None and plain.item_weights().shape == (data.num_items + 1, 64)
    assert model.item_weights().shape == (data.num_items + 1, 65)
    assert torch.count_nonzero(model.output_bias) == 0  # zero at the start, as BERT's
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k != "output_bias"})
    with torch.no_grad():
        model.output_bias.copy_(torch.randn(data.num_items + 1))
        model.output_bias[7] = 1e3  # an item every query must then rank first
        query, plain_query = model.last_hidden(windows), plain.last_hidden(windows)
        torch.testing.assert_close(query[:, :-1], plain_query)
        assert (query[:, -1] == 1).all()
        scores = query @ model.item_weights().T
        torch.testing.assert_close(scores, plain_query @ plain.item_weights().T + model.output_bias)
        assert (scores[:, 1:].argmax(dim=1) + 1 == 7).all()
    # the cloze loss trains the bias of every item (full softmax), from its zero start
    model = build(data, "bert4rec").train()
    loss = objective_loss("cloze", model, torch.as_tensor(data.train[:32], dtype=torch.long), mask_prob=0.2,
                          generator=torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(model.output_bias.grad).all() and model.output_bias.grad[1:].abs().min() > 0
    # Cotten4Rec reuses BERT4Rec's head; its config has no such key, and its scores stay h·e_i
    assert build(data, "cotten4rec").output_bias is None


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("key", ALL)
def test_every_parameter_gets_a_finite_nonzero_gradient(key, data):
    name, hparams = ALL[key]
    model = build(data, name, **hparams).train()
    objective = resolve_objective(model, "auto")
    windows = torch.as_tensor(data.train[:64], dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    loss = objective_loss(objective, model, windows, mask_prob=0.2, generator=generator)
    loss.backward()
    assert torch.isfinite(loss)
    for param_name, param in model.named_parameters():
        assert param.grad is not None, param_name
        assert torch.isfinite(param.grad).all(), param_name
        assert param.grad.abs().sum() > 0, param_name


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", ["bert4rec", "cotten4rec", "linrec", "recgrela"])
def test_heads_must_divide_the_hidden_size(name):
    with pytest.raises(models.ConfigError) as caught:
        models.build(name, num_items=10, hidden_size=64, num_heads=5)
    assert ("num_heads", "must divide hidden_size=64, got 5") in caught.value.errors


def test_recgrela_conv_kernel_and_rope_head_size_constraints():
    with pytest.raises(models.ConfigError) as caught:
        models.build("recgrela", num_items=10, conv_kernel_size=0, drop_path=1.0)
    assert dict(caught.value.errors) == {"conv_kernel_size": "must be >= 1, got 0",
                                         "drop_path": "must be in [0, 1), got 1.0"}
    with pytest.raises(models.ConfigError, match="num_heads: must leave an even head size for RoPE"):
        models.build("recgrela", num_items=10, hidden_size=12, num_heads=4)


def test_linrec_rejects_an_unknown_key_norm():
    with pytest.raises(models.ConfigError, match=r"key_norm: must be one of \('column', 'row'\), got 'softmax'"):
        models.build("linrec", num_items=10, key_norm="softmax")


def test_unknown_objective_is_rejected_by_name(data):
    with pytest.raises(models.ConfigError, match="objective: must be auto or one of"):
        run_trial("recgrela", data, {"objective": "pairwise"})


@pytest.mark.parametrize("name,hparams", [
    ("gru4rec", {}), ("linrec", {"causal": True}), ("recgrela", {"causal": True}), ("cotten4rec", {"causal": True}),
])
def test_cloze_is_refused_for_causal_models(name, hparams, data):
    with pytest.raises(models.ConfigError, match=f"objective: {name} cannot train with 'cloze'"):
        run_trial(name, data, {"objective": "cloze", "max_epochs": 1, **hparams})


@pytest.mark.parametrize("name,hparams", [
    ("bert4rec", {}), ("cotten4rec", {}), ("linrec", {}), ("recgrela", {}),
])
def test_all_position_objectives_are_refused_for_bidirectional_models(name, hparams, data):
    for objective in ("causal", "bce"):
        with pytest.raises(models.ConfigError, match=f"{name} cannot train with '{objective}'"):
            run_trial(name, data, {"objective": objective, "max_epochs": 1, **hparams})
