"""Budget allocation properties (Eq. 7, Prop. 1) and Thm. 1 on random indicators."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cake_cli.engine import allocation
from cake_cli.engine.cache import CakeCache
from cake_cli.engine.cascade import CascadePrefill, LayerStats
from cake_cli.engine.config import CakeConfig

log_pref = st.one_of(st.floats(-50, 50), st.just(float("-inf")))


@settings(max_examples=300, deadline=None)
@given(
    logs=st.lists(log_pref, min_size=1, max_size=40),
    budget=st.integers(1, 600),
    window=st.integers(1, 64),
    n=st.integers(2, 900),
)
def test_cascade_budgets_are_integer_capped_monotone_and_sum(logs, budget, window, n):
    budget = max(budget, window)
    layers = len(logs)
    total, cap = (budget - window) * layers, max(n - window, 0)
    stages = allocation.cascade(logs, total, cap)
    for m, stage in enumerate(stages):
        assert len(stage) == m + 1
        assert all(isinstance(b, int) and 0 <= b <= cap for b in stage)
        target = min(total, (m + 1) * cap)
        assert target - (m + 1) <= sum(stage) <= target
        if m:
            assert all(b <= p for b, p in zip(stage, stages[m - 1])), "Prop. 1: budgets never increase"


def test_proportional_to_preference_and_caps_redistribute():
    # P = 1 : 3 -> 25 : 75 of 100
    assert allocation.allocate([0.0, math.log(3.0)], 100, 1000) == [25, 75]
    # a cap of 60 hands the excess of layer 1 to layer 0
    assert allocation.allocate([0.0, math.log(3.0)], 100, 60) == [40, 60]
    # all P = 0 -> uniform
    assert allocation.allocate([float("-inf")] * 4, 10, 100) == [3, 3, 2, 2]
    # P = 0 layers get nothing while others have room
    assert allocation.allocate([0.0, float("-inf")], 10, 100) == [10, 0]
    # a one-layer model takes the whole budget, up to its cap
    assert allocation.cascade([1.5], 50, 40) == [[40]]
    # budget >= everything: every layer keeps all
    assert allocation.allocate([0.0, 1.0, 2.0], 3 * 70, 70) == [70, 70, 70]


def test_uniform_rounding_sums_exactly():
    assert allocation.uniform(30, 30 * 7 + 4, 1000) == [8] * 4 + [7] * 26


@settings(max_examples=100, deadline=None)
@given(
    layers=st.integers(1, 6),
    kv=st.integers(1, 3),
    n=st.integers(10, 60),
    window=st.integers(1, 8),
    budget_frac=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**16),
    ties=st.booleans(),
)
def test_cascade_equals_one_shot_top_k(layers, kv, n, window, budget_frac, seed, ties):
    """Thm. 1: evicting stage by stage keeps exactly the one-shot top-k with the final budgets."""
    gen = torch.Generator().manual_seed(seed)
    budget = max(window, int(window + budget_frac * (n - window)))
    if n <= budget:
        return
    config = CakeConfig(budget=budget, window=window)
    cascade = CascadePrefill(config, layers, n)
    cache = CakeCache(layers)
    indicators = []
    for layer in range(layers):
        keys = torch.randn(1, kv, n, 4, generator=gen)
        cache.update(keys, keys.clone(), layer)
        scores = (
            torch.randint(0, 4, (kv, n - window), generator=gen).float()
            if ties
            else torch.rand(kv, n - window, generator=gen)
        )
        indicators.append(scores)
        cascade.indicators[layer] = scores.clone()
        cascade.stats[layer] = LayerStats(1.0, 1.0, float(torch.randn(1, generator=gen)) * 3)
        cascade._cascade(cache, layer)
    for layer, budget_l in enumerate(cascade.final_budgets):
        for head in range(kv):
            s = indicators[layer][head].tolist()
            want = sorted(sorted(range(len(s)), key=lambda j: (-s[j], j))[:budget_l]) + list(range(n - window, n))
            assert cache.layers[layer].positions[head].tolist() == want
