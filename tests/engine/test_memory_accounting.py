"""KV memory accounting measured from the cache tensors (docs/method.md §Memory accounting, issue 5)."""

from __future__ import annotations

import pytest
import torch

from cake_cli.engine import allocation
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import prefill
from cake_cli.engine.methods import with_method
from tests.helpers.models import tiny_llama

LAYERS, KV, D = 4, 2, 8


@pytest.mark.parametrize("dtype, elem", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_bytes_equal_layers_heads_dim_tokens_two_elem(dtype, elem):
    model = tiny_llama(layers=LAYERS, heads=8, kv_heads=KV, head_dim=D).to(dtype)
    use_cake_attention(model, "sdpa")
    n = 150
    state = prefill(model, torch.randint(0, 97, (1, n)), CakeConfig(budget=40, window=8))
    assert state.cache.full_bytes == LAYERS * KV * D * n * 2 * elem
    assert state.kv_bytes == sum(state.lengths) * KV * D * 2 * elem
    for layer, kept in zip(state.cache.layers, state.lengths):
        assert layer.keys.shape == (1, KV, kept, D) and layer.values.shape == (1, KV, kept, D)
        assert layer.keys.dtype == dtype


@pytest.mark.parametrize("method", ["cake", "snapkv", "pyramidkv"])
def test_peak_during_prefill_is_what_the_cascade_promises(tiny_model, method):
    """Peak = max over layers m of (what layers 0..m-1 hold after stage m-1) + the full layer m."""
    use_cake_attention(tiny_model, "sdpa")
    n, w = 120, 8
    config = with_method(CakeConfig(budget=30, window=w), method)
    state = prefill(tiny_model, torch.randint(0, 97, (1, n)), config)
    token_bytes = KV * D * 2 * 4
    if method == "cake":
        logs = [s.log_preference for s in state.cascade.stats]
        stages = allocation.cascade(logs, config.evictable_total(LAYERS), n - w)
    else:
        schedule = allocation.ALLOCATIONS[config.allocation].split(LAYERS, config.evictable_total(LAYERS), n - w, w)
        stages = [schedule[: m + 1] for m in range(LAYERS)]
    assert stages[-1] == state.cascade.final_budgets
    expected = max(sum(b + w for b in (stages[m - 1] if m else [])) + n for m in range(LAYERS))
    assert state.peak_bytes == expected * token_bytes
    full = n * LAYERS * token_bytes
    assert state.peak_bytes < 0.5 * full
