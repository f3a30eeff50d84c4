"""The model contract, the registry and SASRec: causality, backends, gradients, config errors."""

from __future__ import annotations

import pytest
import torch

import models
from models.blocks import SoftmaxAttention, attention_mask


def _window(num_items: int, length: int, pad: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    items = torch.randint(1, num_items + 1, (3, length), generator=generator)
    items[:, :pad] = 0
    return items


def test_registry_lists_and_builds_sasrec_with_recbole_defaults():
    assert "sasrec" in models.available()
    model = models.build("sasrec", num_items=50, max_len=16)
    config = model.config
    assert (config.hidden_size, config.num_layers, config.num_heads, config.inner_size) == (64, 2, 2, 256)
    assert (config.dropout, config.attn_dropout) == (0.5, 0.5)
    assert model.item_weights().shape == (51, 64)


def test_registry_reports_every_bad_key_at_once():
    with pytest.raises(models.ConfigError) as caught:
        models.build("sasrec", num_items=50, num_heads=3, dropout=1.5)
    keys = {key for key, _ in caught.value.errors}
    assert keys == {"num_heads", "dropout"}
    assert "must divide hidden_size=64" in str(caught.value)
    with pytest.raises(models.ConfigError, match="unknown model 'nope'"):
        models.build("nope", num_items=5)
    with pytest.raises(models.ConfigError, match="not a hyperparameter of sasrec"):
        models.build("sasrec", num_items=5, pool_size=4)


def test_sasrec_is_causal_changing_the_future_leaves_the_past_unchanged(assert_differ):
    model = models.build("sasrec", num_items=40, max_len=12).eval()
    items = _window(40, 12, pad=3)
    changed = items.clone()
    changed[:, 8:] = (changed[:, 8:] % 40) + 1
    with torch.no_grad():
        before, after = model(items), model(changed)
    assert torch.allclose(before[:, :8], after[:, :8], atol=1e-6)
    assert_differ(before[:, 8:], after[:, 8:], atol=1e-3)


def test_bidirectional_attention_does_see_the_future(assert_differ):
    """The causality test above can fail: the same change moves a bidirectional mixer's early outputs."""
    torch.manual_seed(0)
    mixer = SoftmaxAttention(16, 2, 0.0, causal=False).eval()
    x = torch.randn(2, 10, 16)
    valid = torch.ones(2, 10, dtype=torch.bool)
    y = x.clone()
    y[:, 7:] += 1.0
    assert_differ(mixer(x, valid)[:, :7], mixer(y, valid)[:, :7], atol=1e-4)


def test_padding_is_invisible_to_real_positions():
    model = models.build("sasrec", num_items=40, max_len=12).eval()
    items = _window(40, 12, pad=5)
    other_padding_embedding = items.clone()
    model_b = models.build("sasrec", num_items=40, max_len=12).eval()
    model_b.load_state_dict(model.state_dict())
    with torch.no_grad():
        model_b.embedding.items.weight[0] += 3.0  # if padding leaked, real outputs would move
        a, b = model(items), model_b(other_padding_embedding)
    assert torch.allclose(a[:, 5:], b[:, 5:], atol=1e-5)
    assert torch.isfinite(a).all()


def test_math_and_sdpa_attention_backends_agree():
    torch.manual_seed(0)
    sdpa = SoftmaxAttention(32, 4, 0.0, causal=True, backend="sdpa").eval()
    math = SoftmaxAttention(32, 4, 0.0, causal=True, backend="math").eval()
    math.load_state_dict(sdpa.state_dict())
    x = torch.randn(2, 9, 32)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[0, :4] = False
    assert torch.allclose(sdpa(x, valid)[valid], math(x, valid)[valid], atol=1e-5)


def test_attention_mask_never_leaves_a_row_empty():
    valid = torch.tensor([[False, False, True, True]])
    mask = attention_mask(valid, causal=True)[0, 0]
    assert mask.any(-1).all()
    assert mask[3].tolist() == [False, False, True, True]
    assert mask[2].tolist() == [False, False, True, False]


def test_every_sasrec_parameter_gets_a_finite_nonzero_gradient(synthetic):
    data = synthetic
    model = models.build("sasrec", num_items=data.num_items, max_len=50)
    from study.train.objectives import causal_loss

    batch = torch.as_tensor(data.train[:64], dtype=torch.long)
    causal_loss(model, batch).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name


@pytest.mark.parametrize("name", models.available())
def test_every_default_config_satisfies_its_declared_constraints(name):
    # the sizes the trainer takes from the dataset are given, as the trainer gives them; everything else defaults
    data_sized = {"num_items": 10, **({"num_users": 7} if models.model_class(name).needs_users else {})}
    config = models.make_config(name, **data_sized)
    assert config.constraint_errors() == []


def test_constraints_are_declared_on_fields_and_checked_generically():
    from models.base import Constraint, field_constraint
    from models.gru4rec import GRU4RecConfig
    from models.lisa import LISAConfig
    from models.sasrec import SASRecConfig

    assert field_constraint(SASRecConfig, "dropout") == Constraint(at_least=0, below=1)
    # GRU4Rec only changes hidden_size's default: the base class's constraint still applies
    assert field_constraint(GRU4RecConfig, "hidden_size") == Constraint(at_least=1)
    assert ("hidden_size", "must be >= 1, got 0") in GRU4RecConfig(num_items=5, hidden_size=0).constraint_errors()
    errors = dict(SASRecConfig(num_items=5, activation="tanh", num_heads=0, attn_dropout=-0.1).constraint_errors())
    assert errors == {"activation": "must be one of ('gelu', 'relu', 'silu'), got 'tanh'",
                      "num_heads": "must be >= 1, got 0", "attn_dropout": "must be in [0, 1), got -0.1"}
    # only_if: LISA's target codebooks are checked in the mini variant only; bounded floats must be finite
    assert LISAConfig(num_items=5, target_codebooks=0).constraint_errors() == []
    mini = LISAConfig(num_items=5, variant="mini", target_codebooks=0, decay=float("inf"))
    assert dict(mini.constraint_errors()) == {"target_codebooks": "must be >= 1, got 0",
                                              "decay": "must be >= 0 (0 = no decay), got inf"}


def test_token_mixer_causality_is_a_plain_attribute():
    assert SoftmaxAttention(16, 2, 0.0, causal=True).causal is True
    assert SoftmaxAttention(16, 2, 0.0, causal=False).causal is False
    assert "causal" in vars(SoftmaxAttention(16, 2, 0.0, causal=True))
