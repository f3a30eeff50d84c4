"""The SASRec step's speed-ups change no result: the attention mask built once per forward gives the outputs of
one mask per layer, the mixed-precision option leaves a CPU step in fp32, and the compile option reaches the
network under every objective, in the mode asked for."""

from __future__ import annotations

import functools
import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

import models
import models.blocks as blocks
from models import ConfigError
from study.train.config import TrainConfig, split_settings
from study.train.step import TrainStep


def windows(num_items: int, max_len: int, rows: int = 5) -> torch.Tensor:
    batch = torch.randint(1, num_items + 1, (rows, max_len + 1), generator=torch.Generator().manual_seed(1))
    for row in range(rows):
        batch[row, : 2 * row] = 0  # left padding of several lengths
    return batch


def per_layer_mask(valid: torch.Tensor, causal: bool, additive: bool = False) -> torch.Tensor:
    """What every layer did before: a fresh mask per layer (SDPA converted the boolean one to this float form
    itself; that the two forms give SDPA equal results, dropout included, is tested below)."""
    mask = blocks.attention_mask(valid, causal)
    return torch.where(mask, 0.0, float("-inf")) if additive else mask


@pytest.mark.parametrize("name, backend", [("sasrec", "sdpa"), ("sasrec", "math"), ("bert4rec", "sdpa")])
def test_mask_built_once_per_forward_gives_the_same_outputs_and_gradients(monkeypatch, name, backend):
    """Train mode, dropout on, same seed: outputs and gradients equal to 1e-6 (the float mask is what SDPA
    converted the boolean one to, so only the number of conversions changes)."""
    settings = {"num_items": 30, "max_len": 10}
    if name == "sasrec":
        settings["attention_backend"] = backend
    torch.manual_seed(0)
    model = models.build(name, **settings).train()
    items = windows(30, 10)[:, 1:]

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad()
        torch.manual_seed(5)
        out = model(items)
        out.square().sum().backward()
        return out.detach(), model.embedding.items.weight.grad.clone()

    fast_out, fast_grad = run()
    with monkeypatch.context() as patch:
        patch.setattr(blocks, "shared_attention_mask", per_layer_mask)
        slow_out, slow_grad = run()
    torch.testing.assert_close(fast_out, slow_out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fast_grad, slow_grad, atol=1e-6, rtol=1e-6)


def test_no_shared_mask_outlives_its_valid_tensor():
    """The mask of one forward is not kept until the next one: it goes with the ``valid`` tensor it was built from."""
    valid = torch.ones(4, 6, dtype=torch.bool)
    mask = blocks.shared_attention_mask(valid, causal=True, additive=True)
    watcher = weakref.ref(mask)
    assert blocks.shared_attention_mask(valid, causal=True, additive=True) is mask
    del valid, mask
    gc.collect()
    assert watcher() is None


def test_shared_mask_is_rebuilt_for_another_or_modified_valid_tensor():
    valid = torch.tensor([[False, True, True], [True, True, True]])
    first = blocks.shared_attention_mask(valid, causal=True)
    assert blocks.shared_attention_mask(valid, causal=True) is first  # the next layer of the same forward
    assert torch.equal(first, blocks.attention_mask(valid, causal=True))
    valid[0, 0] = True  # in place: the tensor is the same object, its contents are not
    assert torch.equal(blocks.shared_attention_mask(valid, causal=True), blocks.attention_mask(valid, causal=True))
    other = valid.clone()
    other[1, 0] = False
    assert torch.equal(blocks.shared_attention_mask(other, causal=False), blocks.attention_mask(other, causal=False))
    additive = blocks.shared_attention_mask(other, causal=False, additive=True)
    assert additive.dtype == torch.float32
    assert torch.equal(additive == 0, blocks.attention_mask(other, causal=False))
    q, k, v = torch.randn(3, 2, 2, 3, 4)
    for dropout in (0.0, 0.5):  # the dropout mask is drawn alike for both forms
        torch.manual_seed(3)
        as_float = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, dropout_p=dropout)
        torch.manual_seed(3)
        as_bool = F.scaled_dot_product_attention(q, k, v, attn_mask=blocks.attention_mask(other, False),
                                                 dropout_p=dropout)
        torch.testing.assert_close(as_float, as_bool, atol=1e-6, rtol=1e-6)


def test_mixed_precision_leaves_a_cpu_step_in_fp32():
    losses = {}
    for precision in ("fp32", "bf16", "fp16"):
        torch.manual_seed(0)
        step = TrainStep(models.build("sasrec", num_items=30, max_len=10), TrainConfig(precision=precision))
        assert step.autocast_dtype is None and step.scaler is None
        losses[precision] = [step(windows(30, 10)).item() for _ in range(3)]
    assert losses["bf16"] == losses["fp32"] == losses["fp16"]
    with pytest.raises(ValueError, match="precision"):
        TrainStep(models.build("sasrec", num_items=30, max_len=10), TrainConfig(precision="int8"))


def test_compile_option_keeps_the_state_dict_keys():
    """``compile`` leaves the model object alone: checkpoints and exports keep their keys (no ``_orig_mod.``)."""
    model = models.build("sasrec", num_items=30, max_len=10)
    keys = list(model.state_dict())
    TrainStep(model, TrainConfig(compile=True))
    assert list(model.state_dict()) == keys


@pytest.mark.parametrize(("name", "objective"),
                         [("sasrec", "causal"), ("sasrec", "last"), ("elastic", "last"), ("bert4rec", "cloze")])
def test_compile_traces_the_network_whichever_way_the_objective_calls_it(monkeypatch, name, objective):
    """``last`` reaches the network through ``last_hidden`` (ELASTIC through ``encode``), which a compiled
    ``nn.Module.forward`` never sees: such steps ran eager under ``compile=true``. A backend that keeps the
    traced graphs shows the item lookup inside them; it runs them as traced, so the losses are the eager ones."""
    graphs = []

    def keep_graph(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=keep_graph))
    torch._dynamo.reset()
    losses = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = models.build(name, num_items=30, max_len=10)
        step = TrainStep(model, TrainConfig(objective=objective, compile=compiled, trim_padding=False))
        losses[compiled] = [step(windows(30, 10)).item() for _ in range(2)]
    torch._dynamo.reset()
    traced = {node.target for graph in graphs for node in graph.graph.nodes}
    assert F.embedding in traced
    assert losses[True] == losses[False]


def test_compile_mode_reaches_torch_compile_and_a_cpu_step_replays_no_graphs(monkeypatch):
    """``compile_mode`` is torch.compile's ``mode`` (``default`` passes none); a CPU step has no CUDA graphs to
    replay, so it hands back its loss as the default mode does. The mode without ``compile`` is refused: it would
    silently run eager."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: seen.append(kwargs) or fn)
    for mode in ("default", "reduce-overhead"):
        config = TrainConfig(compile=True, compile_mode=mode, objective="last")
        step = TrainStep(models.build("sasrec", num_items=30, max_len=10), config)
        assert step.cuda_graphs is False
        assert torch.isfinite(step(windows(30, 10)))
    assert seen == [{"mode": None}, {"mode": "reduce-overhead"}]
    assert split_settings("sasrec", {"compile": "true", "compile_mode": "reduce-overhead"})[0].compile_mode \
        == "reduce-overhead"
    with pytest.raises(ConfigError, match="compile_mode: 'reduce-overhead' needs compile: true"):
        split_settings("sasrec", {"compile_mode": "reduce-overhead"})
    with pytest.raises(ConfigError, match="compile_mode: must be one of"):
        split_settings("sasrec", {"compile": "true", "compile_mode": "fast"})


@pytest.mark.parametrize(("model_name", "objective"), [("sasrec", "auto"), ("sasrec", "bce"), ("bert4rec", "auto")])
def test_cuda_graph_modes_are_refused_where_the_scored_positions_vary(model_name, objective):
    """Causal CE and cloze score a batch-dependent number of positions, which crashed torch's CUDA-graph trees on
    a GPU (BCE selects its positions the same way); the step refuses those modes with them on any device, before a
    cluster trial could crash, and keeps the default mode."""
    model = models.build(model_name, num_items=30, max_len=10)
    for mode in ("reduce-overhead", "max-autotune"):
        with pytest.raises(ConfigError, match=f"compile_mode: '{mode}' replays CUDA graphs, which only the `last`"):
            TrainStep(model, TrainConfig(compile=True, compile_mode=mode, objective=objective))
    assert TrainStep(model, TrainConfig(compile=True, objective=objective)).cuda_graphs is False
