"""ELASTIC: product-key retrieval, padding masks, ablations, expert statistics, O(N·k) memory, learning."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import models
from models.blocks import SoftmaxAttention, TransformerBlock
from models.elastic import DispatcherLayer, ElasticConfig, product_key_topk
from study.train.metrics import evaluate
from study.train.objectives import objective_loss, resolve_objective
from study.train.trainer import TrialData, run_trial

SMALL = {"num_items": 60, "max_len": 22, "hidden_size": 16, "num_heads": 2, "inner_size": 32,
         "num_experts": 16, "top_k": 3, "pool_size": 3, "dropout": 0.0, "attn_dropout": 0.0}
ABLATIONS = {
    "full": {},
    "mean_query": {"query_net": "mean"},
    "no_imr": {"imr": False},
    "no_dispatcher": {"dispatcher": False},
}




def _build(**overrides) -> models.SeqRecModel:
    torch.manual_seed(0)
    return models.build("elastic", **{**SMALL, **overrides}).eval()


@pytest.fixture(scope="module")
def ml100k(ml100k_prepared):
    return TrialData.from_prepared(ml100k_prepared, max_len=50)


def test_product_key_topk_equals_brute_force_over_all_keys():
    generator = torch.Generator().manual_seed(1)
    n, half, k = 16, 12, 8
    sub_keys = torch.randn(2, n, half, generator=generator, dtype=torch.float64)
    queries = torch.randn(200, 2 * half, generator=generator, dtype=torch.float64)
    scores, ids = product_key_topk(queries, sub_keys, k)
    # every one of the n² full keys written out: key i·n + j = (c_i, c'_j)
    full_keys = torch.cat([sub_keys[0].repeat_interleave(n, 0), sub_keys[1].repeat(n, 1)], dim=1)
    brute_scores, brute_ids = (queries @ full_keys.T).topk(k, dim=-1)
    assert torch.equal(ids, brute_ids)
    assert torch.allclose(scores, brute_scores)
    # and the selection really depends on both halves of the query (ids span many rows and columns)
    assert len(torch.unique(ids // n)) > 8 and len(torch.unique(ids % n)) > 8


@pytest.mark.parametrize(("overrides", "key", "text"), [
    ({"num_experts": 200}, "num_experts", "perfect square"),
    ({"num_experts": 64, "top_k": 9}, "top_k", "must be <= sqrt(num_experts)=8"),
    ({"pool_size": 1}, "pool_size", "must be >= 2"),
    ({"query_net": "max"}, "query_net", "must be one of"),
    ({"hidden_size": 15, "num_heads": 1}, "hidden_size", "must be even with imr=True"),
    ({"top_k": 0}, "top_k", "must be >= 1"),
    ({"key_heads": 0}, "key_heads", "must be >= 1"),
])
def test_bad_config_names_the_key_and_the_constraint(overrides, key, text):
    with pytest.raises(models.ConfigError) as caught:
        models.build("elastic", **{**SMALL, **overrides})
    assert [k for k, _ in caught.value.errors] == [key]
    assert text in str(caught.value) and f"{key}:" in str(caught.value)


def test_all_errors_are_reported_together_and_max_len_need_not_divide_by_the_pool_size(left_padded):
    errors = ElasticConfig(num_items=5, num_experts=10, top_k=5, pool_size=0, query_net="max").constraint_errors()
    assert {key for key, _ in errors} == {"num_experts", "top_k", "pool_size", "query_net"}
    # 22 = 3·7 + 1: the query network left-pads each level instead of requiring divisibility
    model = _build(max_len=22, pool_size=3)
    assert ElasticConfig(**{**SMALL, "max_len": 22, "pool_size": 3}).constraint_errors() == []
    assert len(model.memory.levels) == 3  # 22 → 8 → 3 → 1
    with torch.no_grad():
        assert torch.isfinite(model(left_padded(60, 22, [22, 5, 1]))).all()


@pytest.mark.parametrize("ablation", list(ABLATIONS))
def test_padding_does_not_leak_into_real_positions(ablation, left_padded, assert_differ):
    """What sits in the padding (embedding row 0, positions of padded slots) never reaches the output."""
    model = _build(**ABLATIONS[ablation])
    items = left_padded(60, 22, [7, 4, 7])  # every row has >= 15 padded slots
    with torch.no_grad():
        before = model(items)
        model.embedding.items.weight[0].normal_()
        model.embedding.positions.weight[:15].normal_()
        after = model(items)
        assert torch.allclose(before, after, atol=1e-5)
        model.embedding.positions.weight[20].normal_()  # a real position: the output must move
        assert_differ(before[:, -7:], model(items)[:, -7:], atol=1e-3)


def test_elastic_is_not_causal_so_the_trainer_refuses_all_position_training(left_padded, assert_differ):
    model = _build()
    items = left_padded(60, 22, [22, 22])
    changed = items.clone()
    changed[:, -1] = changed[:, -1] % 60 + 1
    with torch.no_grad():
        earlier_before, earlier_after = model(items)[:, :-1], model(changed)[:, :-1]
    assert_differ(earlier_before, earlier_after, atol=1e-4)  # the future leaks through P and q
    assert model.default_objective == "last" and not model.is_causal
    assert resolve_objective(model, "auto") == "last"
    for objective in ("causal", "bce"):
        with pytest.raises(models.ConfigError, match="cannot train with"):
            resolve_objective(model, objective)


def test_last_hidden_equals_the_newest_position_of_forward(left_padded):
    model = _build()
    items = left_padded(60, 22, [22, 9, 1])
    with torch.no_grad():
        assert torch.allclose(model.last_hidden(items), model(items)[:, -1], atol=1e-5)


def test_imr_off_uses_one_learned_interest_set_for_every_user():
    model = _build(imr=False)
    names = {name for name, _ in model.named_parameters()}
    assert "shared_interests" in names and not any("sub_keys" in n or "experts" in n for n in names)
    x = torch.randn(4, 22, 16)
    valid = torch.ones(4, 22, dtype=torch.bool)
    p = model.interests(x, valid)
    assert p.shape == (4, 3, 16)
    assert all(torch.equal(p[i], model.shared_interests) for i in range(4))
    assert model.stats() == {}


def test_dispatcher_off_items_interact_only_through_the_interest_tokens(left_padded):
    """dispatcher=False: X attends to P⁰ only, so with P⁰ fixed, position t sees item t and nothing else."""
    items = left_padded(60, 22, [22, 22, 22])
    changed = items.clone()
    changed[:, :-1] = changed[:, :-1] % 60 + 1  # every item but the newest
    fixed = torch.randn(3, 3, 16)
    for dispatcher in (False, True):
        model = _build(dispatcher=dispatcher)
        model.interests = lambda x, valid: fixed  # same P⁰ for both windows
        with torch.no_grad():
            same = torch.allclose(model.last_hidden(items), model.last_hidden(changed), atol=1e-5)
        assert same is (not dispatcher)  # with the aggregation step, the other items move P and the output
    # imr=False and dispatcher=False together: a per-position network of (item, position)
    model = _build(imr=False, dispatcher=False)
    with torch.no_grad():
        assert torch.allclose(model.last_hidden(items), model.last_hidden(changed), atol=1e-5)
    names = {name for name, _ in model.named_parameters()}
    assert not any("aggregate" in n or "ffn_p" in n for n in names)


def test_mean_query_is_the_masked_mean_of_the_embeddings(left_padded):
    model = _build(query_net="mean")
    assert len(model.memory.levels) == 0
    x = torch.randn(3, 22, 16)
    valid = left_padded(60, 22, [22, 5, 1]) > 0
    expected = torch.stack([x[i][valid[i]].mean(0) for i in range(3)])
    assert torch.allclose(model.memory.query(x, valid), expected, atol=1e-6)


@pytest.mark.parametrize("ablation", list(ABLATIONS))
def test_gradients_reach_every_parameter_on_a_batch(synthetic, ablation):
    torch.manual_seed(0)
    model = models.build("elastic", num_items=synthetic.num_items, max_len=50, num_experts=64, top_k=4,
                         **ABLATIONS[ablation])
    windows = torch.as_tensor(synthetic.train[:64], dtype=torch.long)
    loss = objective_loss("last", model, windows, mask_prob=0.2, generator=torch.Generator().manual_seed(0))
    loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name
    if ablation in ("full", "no_dispatcher"):  # the score gate is what lets the keys and query net learn
        assert model.memory.sub_keys.grad.abs().sum() > 0
        if ablation == "full":
            assert model.memory.levels[0].pool.weight.grad.abs().sum() > 0


def test_expert_usage_counts_exactly_the_first_eval_pass_after_training(left_padded):
    model = _build(num_experts=64, top_k=4)
    selected = []
    model.memory.register_forward_hook(lambda module, args, out: selected.append(out[1]))
    train_items, eval_items = left_padded(60, 22, [22] * 8, seed=1), left_padded(60, 22, [22, 12, 3, 1] * 10, seed=2)

    model.train()
    model(train_items)  # counts nothing, but arms the next evaluation pass
    model.eval()
    selected.clear()
    with torch.no_grad():
        model.item_weights()  # an evaluator opens its pass by fetching the item table
        model.last_hidden(eval_items[:25])
        model.last_hidden(eval_items[25:])
    ids = torch.cat(selected).flatten()
    assert int(model.memory.counts.sum()) == 40 * 4 == ids.numel()
    stats = model.stats()
    assert stats["expert_usage_rate"] == pytest.approx(len(torch.unique(ids)) / 64)
    shares = torch.bincount(ids, minlength=64).double() / ids.numel()
    entropy = -(shares[shares > 0] * shares[shares > 0].log()).sum().item()
    assert stats["expert_load_entropy"] == pytest.approx(entropy)
    assert stats["expert_load_entropy_norm"] == pytest.approx(entropy / math.log(64))
    assert stats["expert_max_load"] == pytest.approx(shares.max().item())

    counts = model.memory.counts.clone()
    model.train()
    model.eval()  # a second pass without training in between (the trainer's test pass) is not counted
    with torch.no_grad():
        model.item_weights()
        model.last_hidden(train_items)
    assert torch.equal(model.memory.counts, counts)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    model(train_items)
    model.eval()  # a new epoch's evaluation starts from zero
    with torch.no_grad():
        model.item_weights()
        model.last_hidden(train_items[:2])
    assert int(model.memory.counts.sum()) == 2 * 4
    model.load_state_dict(state)  # a restored checkpoint carries the counts of its own validation pass
    assert torch.equal(model.memory.counts, counts)


def test_query_batchnorm_normalises_a_training_batch_and_keeps_running_statistics(left_padded):
    model = _build(query_batchnorm=True).train()
    items = left_padded(60, 22, [22, 15, 9, 4, 1, 18, 7, 12], seed=3)
    queries = []
    model.memory.query_norm.register_forward_hook(lambda module, args, out: queries.append(out))
    model(items)
    normalised = queries[-1]
    torch.testing.assert_close(normalised.mean(0), torch.zeros(16), atol=1e-5, rtol=0)
    torch.testing.assert_close(normalised.var(0, unbiased=False), torch.ones(16), atol=1e-3, rtol=0)
    assert int(model.memory.query_norm.num_batches_tracked) == 1
    model(items[:1])  # one row has no batch statistics: the running ones normalise it, and stay as they were
    assert int(model.memory.query_norm.num_batches_tracked) == 1
    model.eval()
    with torch.no_grad():  # in eval mode a row's query does not depend on the rest of its batch
        torch.testing.assert_close(model.last_hidden(items)[:3], model.last_hidden(items[:3]), atol=1e-6, rtol=0)
    assert model.mixes_rows_in_training and not _build().mixes_rows_in_training  # so the trainer never groups it


def test_key_heads_sum_the_experts_each_head_retrieves(left_padded):
    """Two heads whose sub-keys are the same retrieve the same experts twice: P⁰ doubles, and each user's 2·k
    selections are all counted; with their own keys the heads retrieve different experts."""
    one, two = _build(), _build(key_heads=2)
    assert one.memory.sub_keys.shape == (2, 4, 8) and two.memory.sub_keys.shape == (4, 4, 8)
    with torch.no_grad():
        state = {**two.state_dict(), "memory.sub_keys": two.memory.sub_keys[:2].clone()}
        one.load_state_dict(state)
        items = left_padded(60, 22, [22, 15, 9, 4, 1], seed=4)
        x, valid = one.embedding(items), items > 0
        p_one, ids_one = one.memory(x, valid)
        p_two, ids_two = two.memory(x, valid)
        assert ids_two.shape == (5, 6) and torch.equal(ids_two[:, :3], ids_one)
        assert not torch.equal(ids_two[:, 3:], ids_one)
        two.memory.sub_keys[2:] = two.memory.sub_keys[:2]
        p_same, ids_same = two.memory(x, valid)
    torch.testing.assert_close(p_same, 2 * p_one)
    assert torch.equal(ids_same, torch.cat([ids_one, ids_one], -1))
    assert not torch.allclose(p_two, p_same)
    two.train()
    two(items)
    two.eval()
    with torch.no_grad():
        two.item_weights()
        two.last_hidden(items)
    assert two.stats()["expert_selections"] == 5 * 3 * 2


def test_the_evaluator_counts_its_validation_pass_and_not_the_test_pass(synthetic):
    """What run_trial does each epoch: train, evaluate valid (counted), evaluate test (not counted)."""
    torch.manual_seed(0)
    model = models.build("elastic", num_items=synthetic.num_items, max_len=50, hidden_size=16, num_experts=16,
                         top_k=3, inner_size=32)
    model.train()
    model(torch.as_tensor(synthetic.train[:8, :-1], dtype=torch.long))
    evaluate(model, synthetic.valid, batch_size=64, device=torch.device("cpu"))
    assert int(model.memory.counts.sum()) == len(synthetic.valid.targets) * 3
    counts = model.memory.counts.clone()
    evaluate(model, synthetic.test, batch_size=64, device=torch.device("cpu"))
    assert torch.equal(model.memory.counts, counts)
    assert model.training  # the evaluator restored the mode; no train() override was involved
    assert model.stats()["expert_selections"] == len(synthetic.valid.targets) * 3
    # an epoch without a test pass leaves its counted validation pass open; then the trainer restores the best
    # epoch and probes efficiency with eval forwards that belong to no evaluation pass and must not be counted
    model.train()
    model(torch.as_tensor(synthetic.train[:8, :-1], dtype=torch.long))
    evaluate(model, synthetic.valid, batch_size=64, device=torch.device("cpu"))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    with torch.no_grad():
        model.eval().last_hidden(torch.as_tensor(synthetic.test.inputs[:5], dtype=torch.long))
    assert torch.equal(model.memory.counts, state["memory.counts"])


def _saved_bytes(module: torch.nn.Module, *inputs: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for the backward of one forward (deterministic, not timing)."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if not isinstance(tensor, torch.nn.Parameter):
            total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return total


def test_one_dispatcher_layer_has_activation_memory_linear_in_n():
    torch.manual_seed(0)
    config = ElasticConfig(num_items=10, hidden_size=32, num_heads=2, inner_size=64, top_k=8,
                           dropout=0.0, attn_dropout=0.0)
    layer = DispatcherLayer(config, aggregate=True)
    mixer = SoftmaxAttention(32, 2, 0.0, causal=False, backend="math")
    block = TransformerBlock(mixer, 32, 64, 0.0)  # softmax self-attention: the N×N control

    def measure(n: int) -> tuple[int, int]:
        x = torch.randn(4, n, 32, requires_grad=True)
        p = torch.randn(4, 8, 32, requires_grad=True)
        valid = torch.ones(4, n, dtype=torch.bool)
        return _saved_bytes(layer, x, p, valid), _saved_bytes(block, x, valid)

    (lda_256, softmax_256), (lda_512, softmax_512), (lda_1024, _) = measure(256), measure(512), measure(1024)
    assert lda_512 / lda_256 <= 2.05 and lda_1024 / lda_512 <= 2.05
    assert lda_512 / lda_256 >= 1.8  # it does grow with N: the measurement sees the activations
    assert softmax_512 / softmax_256 > 3.0  # the quadratic block fails the same bound


@pytest.mark.slow
def test_elastic_learns_on_movielens_and_records_expert_usage(ml100k):
    result = run_trial("elastic", ml100k, {
        "max_epochs": 3, "measure_efficiency": False, "prefixes_per_user": 6, "lr": 0.003, "dropout": 0.1,
        "attn_dropout": 0.1, "max_len": 50, "num_experts": 64, "top_k": 4, "pool_size": 8, "seed": 0})
    assert result["objective"] == "last"
    assert result["test_ndcg@10"] > result["pop_ndcg@10"]
    extra = result["extra"]
    assert 0.0 < extra["expert_usage_rate"] <= 1.0 and 0.0 < extra["expert_load_entropy_norm"] <= 1.0
    # the statistic covers the validation split: one retrieval of top_k experts per user
    assert extra["expert_selections"] == len(ml100k.valid.targets) * 4
    assert np.isfinite(result["valid_ndcg@10"])
