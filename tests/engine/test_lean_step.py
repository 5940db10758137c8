"""The lean decode step (`engine.lean_step`) against the model's own forward: the same tokens and the
same logits, bit for bit, at every decode step, for every family it runs, both dtypes, plain and int8
linear layers, the full cache and evicting decode policies; and the models it must leave alone."""

from __future__ import annotations

import pytest
import torch

import cake_cli.engine.lean_step as lean_step
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import generate
from cake_cli.models.quantize import quantize_model
from tests.helpers.models import needs_fbgemm, tiny_family

CONFIGS = {
    "full": None,
    "cake-fixed": CakeConfig(budget=24, window=6, pool_kind="max", pool_kernel=5, decode_policy="fixed"),
    "cake-grow": CakeConfig(budget=24, window=6, decode_policy="grow"),
    "h2o-fixed": CakeConfig(budget=24, window=6, indicator="h2o", allocation="uniform", decode_policy="fixed"),
}


def _run(model, ids, config, lean: bool, monkeypatch) -> tuple:
    """(token ids, step logits, lean steps taken) of a 10-token greedy generation."""
    monkeypatch.setattr(lean_step, "ENABLED", lean)
    calls = []
    real = lean_step.LeanDecoder.__call__
    monkeypatch.setattr(lean_step.LeanDecoder, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    logits: list[torch.Tensor] = []
    result = generate(model, ids, config, max_new_tokens=10, step_logits=logits)
    return result.token_ids, logits, len(calls)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize(
    "weights",
    [
        "plain",
        "int8",
        pytest.param("w8a8", marks=needs_fbgemm),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_lean_steps_equal_the_models_forward(arch, dtype, weights, config, monkeypatch):
    model = tiny_family(arch, seed=3).to(dtype)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():  # norms of their own (a fresh model's are all ones, so a swapped norm would pass)
        for module in model.modules():
            if type(module).__name__ in lean_step.NORMS:
                module.weight.normal_(1.0, 0.3, generator=g)
    if weights != "plain":
        quantize_model(model, weights)
    use_cake_attention(model, "sdpa")
    ids = torch.randint(3, 97, (1, 60), generator=torch.Generator().manual_seed(5))
    tokens, logits, steps = _run(model, ids, CONFIGS[config], True, monkeypatch)
    plain_tokens, plain_logits, plain_steps = _run(model, ids, CONFIGS[config], False, monkeypatch)
    assert steps == 9 and plain_steps == 0  # every decode forward (10 tokens: 9 forwards) took the lean step
    assert tokens == plain_tokens and len(tokens) == 10
    for a, b in zip(logits, plain_logits, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("arch", ["qwen3", "gemma2", "gemma3_text", "phi3"])
def test_other_families_keep_the_models_forward(arch):
    model = tiny_family(arch)
    use_cake_attention(model, "sdpa")
    assert lean_step.lean_decoder(model) is None and lean_step.unsupported(model)


def test_a_model_with_hooks_or_without_cake_attention_keeps_its_forward():
    model = tiny_family("llama")
    assert "not a CPU CAKE attention" in lean_step.unsupported(model)  # attention not switched yet
    use_cake_attention(model, "eager")
    assert isinstance(lean_step.lean_decoder(model), lean_step.LeanDecoder)
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *args: None)  # after the decision
    try:
        assert lean_step.unsupported(model) == "hooks on its modules" and lean_step.lean_decoder(model) is None
    finally:
        handle.remove()
    assert isinstance(lean_step.lean_decoder(model), lean_step.LeanDecoder)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)  # a global hook
    try:
        assert lean_step.lean_decoder(model) is None
    finally:
        handle.remove()
    model.model.layers[1]._hf_hook = object()  # accelerate wraps forward instead of registering a hook
    assert lean_step.lean_decoder(model) is None
    del model.model.layers[1]._hf_hook
    before = lean_step.lean_decoder(model)
    model.model.layers[2] = tiny_family("llama", seed=9).model.layers[2]  # a layer replaced: decided again
    after = lean_step.lean_decoder(model)
    assert after is not before and after.layers[2] is model.model.layers[2]
    sliding = tiny_family("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2)
    use_cake_attention(sliding, "sdpa")
    assert lean_step.unsupported(sliding) == "local sliding-window layers"
