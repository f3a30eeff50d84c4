"""HSTU and FPMC, the remaining ELASTIC baselines: the math on tiny tensors, causality, gradients, config errors,
the user ids FPMC reads (through the trainer's batches, the prefix expansion and the evaluator, on synthetic
windows), and learning on real LastFM windows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import models
from models.hstu import PointwiseAttention
from study.errors import UserError
from study.train.config import TrainConfig
from study.train.metrics import evaluate, metrics_from_ranks, popularity_metrics, rank_of_target
from study.train.objectives import objective_loss
from study.train.trainer import TrialData, epoch_windows, run_trial, user_batches, with_user_count

NUM_ITEMS, MAX_LEN = 30, 8
HSTU_SMALL = {"hidden_size": 16, "num_heads": 2, "attention_dim": 4, "linear_dim": 8, "dropout": 0.0}


def tiny_windows() -> torch.Tensor:
    """Three windows: two left-padded, one full, over items 1..NUM_ITEMS."""
    generator = torch.Generator().manual_seed(0)
    items = torch.randint(1, NUM_ITEMS + 1, (3, MAX_LEN), generator=generator)
    items[0, :5] = 0
    items[1, :2] = 0
    return items


def hstu(**overrides) -> models.SeqRecModel:
    torch.manual_seed(0)
    return models.build("hstu", num_items=NUM_ITEMS, max_len=MAX_LEN, **{**HSTU_SMALL, **overrides}).eval()


def fpmc(num_users: int = 3) -> models.SeqRecModel:
    torch.manual_seed(0)
    return models.build("fpmc", num_items=NUM_ITEMS, max_len=MAX_LEN, num_users=num_users, hidden_size=6).eval()


# ---------------------------------------------------------------------------------------------------------------
# HSTU


def naive_pointwise_attention(mixer: PointwiseAttention, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The paper's equations written out per query, key and head, with loops."""
    batch, length, _ = x.shape
    heads, dqk, dv = mixer.num_heads, mixer.attention_dim, mixer.linear_dim
    projected = F.silu(x @ mixer.uvqk.weight.T)
    u, v = projected[..., :heads * dv], projected[..., heads * dv:2 * heads * dv]
    q, k = projected[..., 2 * heads * dv:2 * heads * dv + heads * dqk], projected[..., 2 * heads * dv + heads * dqk:]
    gated = torch.zeros(batch, length, heads * dv)
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                aggregated = torch.zeros(dv)
                for j in range(i + 1 if mixer.causal else length):
                    if valid[b, j]:
                        score = q[b, i, h * dqk:(h + 1) * dqk] @ k[b, j, h * dqk:(h + 1) * dqk]
                        score = score + mixer.relative_bias[j - i + mixer.max_len - 1]
                        aggregated += F.silu(score) / length * v[b, j, h * dv:(h + 1) * dv]
                normed = (aggregated - aggregated.mean()) / torch.sqrt(aggregated.var(unbiased=False) + 1e-6)
                gated[b, i, h * dv:(h + 1) * dv] = normed * u[b, i, h * dv:(h + 1) * dv]
    return mixer.out(gated)


@pytest.mark.parametrize("causal", [True, False])
def test_pointwise_attention_equals_the_papers_equations(causal):
    torch.manual_seed(1)
    mixer = PointwiseAttention(16, 2, 4, 8, MAX_LEN, dropout=0.0, causal=causal)
    torch.nn.init.normal_(mixer.relative_bias, std=0.5)  # non-zero, so a wrong distance index would show
    x = torch.randn(3, MAX_LEN, 16)
    valid = tiny_windows() > 0
    torch.testing.assert_close(mixer(x, valid), naive_pointwise_attention(mixer, x, valid), atol=1e-5, rtol=1e-4)


def test_pointwise_weights_are_not_normalised_like_a_softmax():
    # one real key, so a softmax would give it weight 1 and return exactly its value; SiLU(s)/N does not
    mixer = PointwiseAttention(4, 1, 4, 4, 4, dropout=0.0)
    x = torch.randn(1, 4, 4)
    valid = torch.tensor([[False, False, False, True]])
    heads = F.silu(x @ mixer.uvqk.weight.T)
    v, q, k = heads[..., 4:8], heads[..., 8:12], heads[..., 12:]
    weight = F.silu(q[0, 3] @ k[0, 3] + mixer.relative_bias[3]) / 4
    expected = F.layer_norm(weight * v[0, 3], (4,), eps=1e-6) * heads[0, 3, :4]
    torch.testing.assert_close(mixer(x, valid)[0, 3], mixer.out(expected))
    assert not torch.isclose(weight, torch.tensor(1.0))


@pytest.mark.parametrize("causal", [True, False])
def test_hstu_changing_a_future_item_changes_earlier_outputs_only_without_the_causal_mask(causal):
    model = hstu(num_layers=2)
    for layer in model.layers:
        layer.mixer.causal = causal  # the non-causal control shows the check can see a leak
    items = tiny_windows()
    changed = items.clone()
    changed[:, 6] = changed[:, 6] % NUM_ITEMS + 1
    before, after = model(items), model(changed)
    assert not torch.allclose(before[:, 6], after[:, 6])
    assert torch.allclose(before[:, :6], after[:, :6]) == causal
    assert model.is_causal and model.default_objective == "causal"


def test_hstu_padded_positions_are_zero_and_scores_use_the_tied_item_table():
    model = hstu()
    items = tiny_windows()
    hidden = model(items)
    assert hidden.shape == (3, MAX_LEN, 16)
    assert (hidden[0, :5] == 0).all() and (hidden[0, 5:].abs().sum(-1) > 0).all()
    assert model.item_weights() is model.embedding.items.weight
    torch.testing.assert_close(model.last_hidden(items), hidden[:, -1])


def test_hstu_defaults_record_the_laptop_sizes():
    config = models.make_config("hstu", num_items=10)
    assert (config.hidden_size, config.num_layers, config.num_heads, config.attention_dim, config.linear_dim,
            config.dropout) == (64, 2, 1, 64, 64, 0.2)


# ---------------------------------------------------------------------------------------------------------------
# FPMC


def test_fpmc_score_is_matrix_factorisation_plus_the_factorised_markov_chain():
    model = fpmc()
    items, users = tiny_windows(), torch.tensor([2, 0, 1])
    scores = model.last_hidden(items, users=users) @ model.item_weights().T
    for row, (user, last) in enumerate(zip(users.tolist(), items[:, -1].tolist())):
        for item in range(1, NUM_ITEMS + 1):
            expected = (model.user_item.weight[user] @ model.item_user.weight[item]
                        + model.item_last.weight[item] @ model.last_item.weight[last])
            torch.testing.assert_close(scores[row, item], expected)


def test_fpmc_gives_different_users_different_scores_and_only_the_last_item_matters():
    model = fpmc()
    items = tiny_windows()[[2, 2]]
    scores = model.last_hidden(items, users=torch.tensor([0, 1])) @ model.item_weights().T
    assert not torch.allclose(scores[0], scores[1])
    older_changed = items.clone()
    older_changed[:, :-1] = older_changed[:, :-1] % NUM_ITEMS + 1
    torch.testing.assert_close(model.last_hidden(older_changed, users=torch.tensor([0, 1])),
                               model.last_hidden(items, users=torch.tensor([0, 1])))
    # position t reads item t only, so the all-position hidden states (the causal objective's) never see the future
    one_changed = items.clone()
    one_changed[:, 3] = one_changed[:, 3] % NUM_ITEMS + 1
    moved = (model(items, users=torch.tensor([0, 1])) != model(one_changed, users=torch.tensor([0, 1]))).any(-1)
    assert moved[:, 3].all() and not moved[:, :3].any() and not moved[:, 4:].any()
    assert model.needs_users and model.user_inputs(torch.tensor([0])) == {"users": torch.tensor([0])}


def test_only_models_that_ask_get_user_ids():
    sasrec = models.build("sasrec", num_items=NUM_ITEMS, max_len=MAX_LEN, hidden_size=8, num_heads=1)
    assert not sasrec.needs_users and sasrec.user_inputs(torch.tensor([0, 1])) == {}


def test_fpmc_without_user_ids_scores_with_the_markov_chain_alone():
    model = fpmc()
    items = tiny_windows()
    hidden = model.last_hidden(items)
    assert (hidden[:, :6] == 0).all()
    torch.testing.assert_close(hidden[:, 6:], model.last_item(items[:, -1]))


# ---------------------------------------------------------------------------------------------------------------
# Both: gradients and config errors


@pytest.mark.parametrize("name,objective", [("hstu", "causal"), ("hstu", "last"), ("hstu", "bce"),
                                            ("fpmc", "causal"), ("fpmc", "last"), ("fpmc", "bce")])
def test_every_parameter_gets_a_finite_nonzero_gradient(name, objective):
    model = (hstu() if name == "hstu" else fpmc()).train()
    windows = torch.cat([tiny_windows(), torch.randint(1, NUM_ITEMS + 1, (3, 1))], dim=1)
    loss = objective_loss(objective, model, windows, mask_prob=0.2, generator=torch.Generator().manual_seed(0),
                          users=torch.tensor([0, 1, 2]))
    loss.backward()
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), parameter_name
        assert parameter.grad.abs().sum() > 0, parameter_name


@pytest.mark.parametrize("name,hparams,keys", [
    ("hstu", {"num_heads": 0, "attention_dim": 0, "linear_dim": 0, "num_layers": 0},
     {"num_heads", "attention_dim", "linear_dim", "num_layers"}),
    ("hstu", {"dropout": 1.0, "hidden_size": 0}, {"dropout", "hidden_size"}),
    ("fpmc", {"num_users": 0}, {"num_users"}),
    ("fpmc", {"dropout": 0.1}, {"dropout"}),  # FPMC has no dropout: an unknown key, not a silently ignored one
])
def test_impossible_configs_are_reported_all_at_once(name, hparams, keys):
    with pytest.raises(models.ConfigError) as caught:
        models.build(name, num_items=NUM_ITEMS, **{**({"num_users": 3} if name == "fpmc" else {}), **hparams})
    assert {key for key, _ in caught.value.errors} == keys


def test_fpmc_rejects_users_of_the_wrong_shape():
    with pytest.raises(ValueError, match="users must have shape"):
        fpmc()(tiny_windows(), users=torch.tensor([0, 1]))


def test_the_trainer_sizes_num_users_and_rejects_a_wrong_count():
    assert with_user_count("fpmc", {"num_items": 5}, {"num_users": 7})["num_users"] == 7
    assert with_user_count("sasrec", {"num_items": 5}, {"num_users": 7}) == {"num_items": 5}
    with pytest.raises(UserError, match="set it to 7"):
        with_user_count("fpmc", {"num_users": 943}, {"num_users": 7, "name": "tiny"})


# ---------------------------------------------------------------------------------------------------------------
# User ids through the trainer's batches and the evaluator, on synthetic windows sized like LastFM's


@pytest.fixture(scope="module")
def data(synthetic_lastfm_prepared) -> TrialData:
    return TrialData.from_prepared(synthetic_lastfm_prepared, max_len=20)


def test_user_batches_carry_each_window_s_user(data):
    batches = list(user_batches(data.train, 64, np.random.default_rng(0)))
    assert len(batches) > 1
    for windows, users, _ in batches:
        np.testing.assert_array_equal(windows, data.train[users])  # rows of the prepared windows are users
    seen = np.concatenate([batch.users for batch in batches])
    assert len(np.unique(seen)) == len(seen)


def test_last_objective_prefixes_keep_their_user(data):
    config = TrainConfig(prefixes_per_user=3, batch_size=64)
    batches = list(epoch_windows(data, iter(()), "last", config, np.random.default_rng(0)))
    assert len(batches) > 1
    split = data.valid  # histories end right before the validation target: the training sequences
    for prefixes, prefix_users, _ in batches[:3]:
        assert len(prefixes) == len(prefix_users)
        for prefix, user in zip(prefixes, prefix_users):
            real = prefix[prefix > 0]
            start = split.history_starts[user]
            history = split.history_items[start:start + split.history_lengths[user]]
            # a prefix of user u is a contiguous piece of u's training history ending at one of its targets
            assert any(np.array_equal(history[end - len(real):end], real) for end in range(len(real), len(history) + 1))
    windows, users, scored = next(epoch_windows(data, [data.train[:5]], "causal", config, np.random.default_rng(0)))
    assert users is None and scored is None  # a source of bare windows (a Ray Data shard) carries no user ids


def test_the_evaluator_scores_row_u_as_user_u(data):
    torch.manual_seed(0)
    model = models.build("fpmc", num_items=data.num_items, max_len=20, num_users=data.meta["num_users"]).eval()
    inputs = torch.as_tensor(data.valid.inputs, dtype=torch.long)
    targets = torch.as_tensor(data.valid.targets, dtype=torch.long)

    def by_hand(users: torch.Tensor) -> dict[str, float]:
        with torch.no_grad():
            scores = model.last_hidden(inputs, users=users) @ model.item_weights().T
        scores[:, 0] = float("-inf")
        return metrics_from_ranks(rank_of_target(scores, scores.gather(1, targets[:, None]).squeeze(1)))

    evaluated = evaluate(model, data.valid, batch_size=100, device=torch.device("cpu"))
    users = torch.arange(len(inputs))
    assert evaluated == pytest.approx(by_hand(users))
    assert evaluated != pytest.approx(by_hand(users.flip(0)))  # the user term matters to the figures


@pytest.mark.slow
@pytest.mark.parametrize("name,settings", [("hstu", {"lr": 3e-3, "max_epochs": 3}),
                                           ("fpmc", {"lr": 5e-3, "max_epochs": 4})])
def test_learning_beats_popularity_on_lastfm(name, settings, lastfm_prepared):
    data = TrialData.from_prepared(lastfm_prepared, max_len=50)
    result = run_trial(name, data, {"batch_size": 32, "patience": 0, "measure_efficiency": False, "num_threads": 2,
                                    "seed": 0, "max_len": 50, "window_step": 0, **settings})  # as tuned
    popularity = popularity_metrics(data.valid, data.item_popularity)["ndcg@10"]
    assert result["valid_ndcg@10"] > 1.5 * popularity, (result["valid_ndcg@10"], popularity)
    assert result["objective"] == "causal"
    if name == "fpmc":
        assert result["config"]["num_users"] == data.meta["num_users"]


@pytest.mark.parametrize("name,hparams", [("hstu", HSTU_SMALL), ("fpmc", {"num_users": 1, "hidden_size": 6})])
def test_scaling_cells_run_without_user_ids(name, hparams):
    # the scaling study times windows, not users: its train step and serving call carry no user ids
    from study.train.efficiency import inference_latency_ms
    from study.train.step import build_step

    model_hparams = {**hparams, "num_items": NUM_ITEMS, "max_len": MAX_LEN}
    step = build_step(name, model_hparams, {"objective": "last"}, torch.device("cpu"))
    windows = torch.cat([tiny_windows(), torch.randint(1, NUM_ITEMS + 1, (3, 1))], dim=1)
    assert torch.isfinite(step(windows))
    p50, p95 = inference_latency_ms(step.model, tiny_windows().numpy(), torch.device("cpu"), warmup=0, repeats=2)
    assert 0 < p50 <= p95
