"""Reproduction details (issue #15): RecBole's feed-forward, what LinRec's causal form does and does not equal,
and LinRec as the Cotten4Rec paper's baseline (ELU + 1 inside BERT4Rec). Synthetic windows, short and full."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import models
from models.blocks import FeedForward
from study.train.objectives import objective_loss, resolve_objective
from study.train.trainer import TrialData

MAX_LEN = 30


@pytest.fixture(scope="module")
def data(synthetic_prepared) -> TrialData:
    return TrialData.from_prepared(synthetic_prepared, max_len=MAX_LEN)


@pytest.fixture(scope="module")
def windows(data) -> torch.Tensor:
    """Sixteen test windows: the eight shortest users (left-padded) and eight full ones."""
    lengths = (data.test.inputs > 0).sum(1)
    order = np.argsort(lengths, kind="stable")
    return torch.as_tensor(data.test.inputs[np.concatenate([order[:8], order[-8:]])], dtype=torch.long)


def build(data: TrialData, name: str, **hparams) -> models.SeqRecModel:
    torch.manual_seed(0)
    return models.build(name, num_items=data.num_items, max_len=MAX_LEN, **hparams)


def inner_activations(ffn: FeedForward, x: torch.Tensor) -> torch.Tensor:
    """What the second linear of the feed-forward receives."""
    seen = []
    handle = ffn.down.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].detach()))
    try:
        ffn(x)
    finally:
        handle.remove()
    return seen[0]


# --------------------------------------------------------------------------- feed-forward


@pytest.mark.parametrize("name", ["sasrec", "bert4rec", "cotten4rec", "linrec"])
def test_feed_forward_has_no_dropout_between_its_linears_by_default(name, data, windows):
    """RecBole's FeedForward: Linear → activation → Linear; the block drops out only the branch's output."""
    model = build(data, name, dropout=0.5).train()
    assert model.config.to_dict()["ffn_inner_dropout"] is False
    ffn = model.encoder.blocks[0].ffn
    with torch.no_grad():
        x = model.embedding(windows)
        expected = ffn.activation(ffn.up(x))
        torch.testing.assert_close(inner_activations(ffn, x), expected, rtol=0, atol=0)
        torch.testing.assert_close(ffn(x), ffn(x), rtol=0, atol=0)  # nothing random left in training mode


@pytest.mark.parametrize("name", ["sasrec", "bert4rec", "cotten4rec", "linrec"])
def test_ffn_inner_dropout_restores_the_earlier_form(name, data, windows):
    model = build(data, name, dropout=0.5, ffn_inner_dropout=True).train()
    ffn = model.encoder.blocks[0].ffn
    with torch.no_grad():
        x = model.embedding(windows)
        expected = ffn.activation(ffn.up(x))
        dropped = inner_activations(ffn, x)
        zeroed = (dropped == 0) & (expected != 0)
        assert 0.4 < zeroed.float().mean().item() < 0.6  # p = 0.5 between the linears
        kept = ~zeroed & (expected != 0)
        torch.testing.assert_close(dropped[kept], 2 * expected[kept])  # survivors scaled by 1 / (1 - p)
        ffn.eval()
        torch.testing.assert_close(inner_activations(ffn, x), expected, rtol=0, atol=0)


# --------------------------------------------------------------------------- LinRec: causal form vs the paper's


def ranked_hidden_pair(data: TrialData, windows: torch.Tensor, num_layers: int, key_norm: str):
    causal = build(data, "linrec", causal=True, num_layers=num_layers, key_norm=key_norm).eval()
    paper = build(data, "linrec", causal=False, num_layers=num_layers, key_norm=key_norm).eval()
    paper.load_state_dict(causal.state_dict())
    with torch.no_grad():
        return causal.last_hidden(windows), paper.last_hidden(windows)


@pytest.mark.parametrize("key_norm", ["column", "row"])
def test_one_layer_causal_linrec_is_the_papers_model_at_the_ranked_position(key_norm, data, windows):
    ours, theirs = ranked_hidden_pair(data, windows, 1, key_norm)
    assert torch.isfinite(ours).all() and torch.isfinite(theirs).all()
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key_norm", ["column", "row"])
def test_two_layer_causal_linrec_is_not_the_papers_model(key_norm, data, windows):
    """The second layer reads earlier positions, where the causal first layer saw only a prefix."""
    ours, theirs = ranked_hidden_pair(data, windows, 2, key_norm)
    assert torch.isfinite(ours).all() and torch.isfinite(theirs).all()
    gap = (ours - theirs).abs().max().item()
    assert gap > 1e-4
    assert gap < 0.1 * theirs.abs().max().item()  # close relatives, not unrelated functions


# --------------------------------------------------------------------------- LinRec as Cotten4Rec's baseline


def naive_elu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                        causal: bool) -> torch.Tensor:
    """φ(Q) φ(K)ᵀ V with φ = ELU + 1 and the L×L score matrix; padded keys never count."""
    scores = (torch.nn.functional.elu(q) + 1) @ (torch.nn.functional.elu(k) + 1).transpose(-1, -2)
    allowed = valid[:, None, None, :].expand_as(scores)
    if causal:
        allowed = allowed & torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    return scores.masked_fill(~allowed, 0.0) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_elu_feature_map_is_elu_plus_one_linear_attention_without_norms(causal, data, windows):
    from models.mixers import merge_heads, split_heads

    model = build(data, "linrec", feature_map="elu", causal=causal).eval()
    mixer, valid = model.encoder.blocks[0].mixer, windows > 0
    with torch.no_grad():
        x = model.embedding(windows)
        q, k, v = (split_heads(t, mixer.num_heads).double() for t in mixer.qkv(x).chunk(3, dim=-1))
        expected = mixer.out(merge_heads(naive_elu_attention(q, k, v, valid, causal)).float())
        ours = mixer(x, valid)
    torch.testing.assert_close(ours[valid], expected[valid], atol=1e-4, rtol=1e-4)
    l2 = build(data, "linrec", causal=causal).eval()
    l2.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(l2.encoder.blocks[0].mixer(x, valid)[valid], ours[valid], atol=1e-3)


def test_cloze_form_is_linrec_inside_bert4rec(data, windows):
    """Mask token, BERT's prediction transform and cloze training: the setting of Cotten4Rec's baseline."""
    model = build(data, "linrec", feature_map="elu", cloze=True)
    assert resolve_objective(model, "auto") == "cloze" and model.objectives == ("cloze", "last")
    assert model.item_weights().shape[0] == data.num_items + 1  # the mask token is never ranked
    bert = build(data, "bert4rec", hidden_size=128, inner_size=256)
    assert model.embedding.items.weight.shape[0] == bert.embedding.items.weight.shape[0]
    assert [type(m) for m in model.head] == [type(m) for m in bert.head]
    model.eval()
    with torch.no_grad():
        masked = torch.cat([windows[:, 1:], torch.full_like(windows[:, :1], model.mask_token)], dim=1)
        torch.testing.assert_close(model.last_hidden(windows), model(masked)[:, -1])
    model.train()
    batch = torch.as_tensor(data.train[:32], dtype=torch.long)
    loss = objective_loss("cloze", model, batch, mask_prob=0.2, generator=torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss) and model.embedding.items.weight.grad[model.mask_token].abs().sum() > 0


def test_linrec_refuses_an_unknown_feature_map_and_a_causal_cloze_form():
    with pytest.raises(models.ConfigError) as error:
        models.build("linrec", num_items=10, feature_map="softmax", cloze=True, causal=True)
    keys = {key for key, _ in error.value.errors}
    assert keys == {"feature_map", "cloze"}
