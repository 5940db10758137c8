"""The engine's hook classes implement the Protocols of `engine.policy` with the same signatures."""

from __future__ import annotations

import inspect

import pytest

from cake_cli.engine import policy
from cake_cli.engine.cache import CakeCache
from cake_cli.engine.cascade import CascadePrefill
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.continuation import DeferredCascade, SavedCascade
from cake_cli.engine.decode import FixedDecode, GrowDecode
from cake_cli.engine.generate import LayerProgress
from cake_cli.engine.replay import Recorder


def parameters(func) -> list[tuple[str, object]]:
    """(name, default) of every parameter but self."""
    return [(p.name, p.default) for p in inspect.signature(func).parameters.values() if p.name != "self"]


@pytest.mark.parametrize("cls", [CascadePrefill, DeferredCascade, FixedDecode, GrowDecode, Recorder, LayerProgress])
def test_policies_share_the_eviction_hook_signature(cls):
    expected = parameters(policy.EvictionPolicy.after_attention)
    assert parameters(cls.after_attention) == expected


def test_the_cache_is_the_attention_hook():
    assert parameters(CakeCache.after_attention) == parameters(policy.AttentionHook.after_attention)
    assert parameters(CakeCache.needs_probs) == parameters(policy.AttentionHook.needs_probs)
    assert isinstance(CakeCache(2), policy.AttentionHook)


def test_fixed_decode_scores_decode_queries():
    fixed = FixedDecode(CakeConfig(budget=64, window=8), [40, 40])
    assert isinstance(fixed, policy.ScoresDecodeQuery) and isinstance(fixed, policy.EvictionPolicy)
    assert fixed.needs_probs(0, 41) and not fixed.needs_probs(1, 40)


def test_live_and_saved_cascades_are_cascade_views():
    config = CakeConfig(budget=64, window=8)
    live = CascadePrefill(config, num_layers=2, prompt_len=100)
    saved = SavedCascade(stats=[None, None], final_budgets=[56, 56], evicting=True)
    for view in (live, saved):
        assert isinstance(view, policy.CascadeView)
    assert live.evicting and live.final_budgets is None  # nothing scored yet
    assert saved.final_budgets == [56, 56]
