"""The fixed decode policy's batched step (`decode.batched_victims`) against its per-layer path."""

from __future__ import annotations

import pytest
import torch

import cake_cli.engine.decode as decode_module
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.cache import CakeCache
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.decode import FixedDecode, batched_victims
from cake_cli.engine.generate import generate

HEADS, KV_HEADS, DIM = 6, 2, 4


def random_layers(capacity: list[int], seed: int, levels: int | None):
    """A cache of len(capacity) layers, layer l holding capacity[l] + 1 slots with shuffled true
    positions, and one decode query's probabilities [H, 1, k] per layer; with `levels`, the
    probabilities take few distinct values, so the indicator has ties."""
    g = torch.Generator().manual_seed(seed)
    cache = CakeCache(len(capacity))
    probs = []
    for layer, cap in zip(cache.layers, capacity):
        k = cap + 1
        layer.update(torch.randn(1, KV_HEADS, k, DIM, generator=g), torch.randn(1, KV_HEADS, k, DIM, generator=g))
        gaps = torch.randint(1, 4, (KV_HEADS, k), generator=g).cumsum(dim=1)  # distinct, increasing per head
        shuffle = torch.stack([torch.randperm(k, generator=g) for _ in range(KV_HEADS)])
        layer.positions = gaps.gather(1, shuffle)  # [H_kv, k] slot order is not position order
        logits = torch.randn(HEADS, 1, k, generator=g)
        if levels is not None:
            logits = logits.mul(levels / 4).round()
        probs.append(torch.softmax(logits, dim=-1))
    return cache, probs


def per_layer_victims(config: CakeConfig, cache: CakeCache, probs, capacity) -> torch.Tensor:
    """The slots `FixedDecode.after_attention` releases, one layer at a time (its reference path)."""
    policy = FixedDecode(config, capacity, batched=False)
    query = torch.zeros(1, HEADS, 1, DIM)
    slots = []
    for i, (layer, p) in enumerate(zip(cache.layers, probs)):
        policy.after_attention(cache, i, query, layer.keys, 1.0, probs=p)
        slots.append(layer.free.clone())
        layer.free = None
    return torch.stack(slots)  # [P, H_kv]


CONFIGS = [
    CakeConfig(budget=16, window=4),  # the paper's avg pooling, kernel 5
    CakeConfig(budget=16, window=4, pool_kind="max", pool_kernel=7),
    CakeConfig(budget=16, window=8, pool_kind="avg", pool_kernel=1),
    CakeConfig(budget=16, window=4, indicator="snapkv"),
    CakeConfig(budget=16, window=4, indicator="tova"),
    CakeConfig(budget=16, window=4, indicator="chunk", chunk=3),  # chunks cut by the window and by evictions
    CakeConfig(budget=16, window=4, indicator="chunk", chunk=5, pool_kind="max", pool_kernel=7),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.indicator}-{c.pool_kind}{c.pool_kernel}-w{c.window}")
@pytest.mark.parametrize("levels", [None, 2])
@pytest.mark.parametrize("seed", range(4))
def test_batched_victims_equal_the_per_layer_path(config, levels, seed):
    # layers of different lengths; 5 < window + kernel: candidates near the edge; 2 < kernel // 2 (kernel 7): a
    # window narrower than the separator, so the next layer's separator alone keeps pooling inside the layer
    capacity = [12, 30, 9, 21, 5, 30, 2, 7]
    cache, probs = random_layers(capacity, seed, levels)
    want = per_layer_victims(config, cache, probs, capacity)
    positions = [layer.positions for layer in cache.layers]
    got = batched_victims(config, probs, positions, capacity)
    assert got.slots.tolist() == want.tolist() and not got.reused
    assert (got.slots < torch.tensor(capacity)[:, None] + 1).all()
    # a wrong guess of the order (another seed's, or a real slot left out) is checked and not used
    for wrong in (batched_victims(config, *random_layers_probs(capacity, seed + 9, levels), capacity).following,
                  got.following):  # fmt: skip
        again = batched_victims(config, probs, positions, capacity, order=wrong)
        assert again.slots.tolist() == want.tolist() and not again.reused


@pytest.mark.parametrize(
    "config,short",
    [(CakeConfig(budget=16, window=4, pool_kind="max", pool_kernel=7), 2), (CakeConfig(budget=16, window=4), 1)],
)
def test_pooling_never_reads_into_the_next_layer(config, short):
    """A short layer (capacity below kernel // 2, so its window is narrower than the pooling's reach) with
    one high candidate, then a layer whose first candidate is its clear minimum: pooling across the
    boundary would lift that minimum and move the victim; the batched step must evict as layer by layer."""
    capacity = [short, 12]
    cache = CakeCache(2)
    for layer, cap in zip(cache.layers, capacity):
        layer.update(torch.zeros(1, KV_HEADS, cap + 1, DIM), torch.zeros(1, KV_HEADS, cap + 1, DIM))
    high = torch.zeros(HEADS, 1, short + 1)
    high[:, 0, 0] = 0.9  # the short layer's one candidate
    low = torch.full((HEADS, 1, 13), 0.5)
    low[:, 0, :4] = 0.01  # the long layer's first candidates score lowest, the first of them alone at its minimum
    probs = [high, low]
    want = per_layer_victims(config, cache, probs, capacity)
    got = batched_victims(config, probs, [layer.positions for layer in cache.layers], capacity)
    assert want[1].tolist() == [0, 0] and got.slots.tolist() == want.tolist()


def random_layers_probs(capacity, seed, levels):
    cache, probs = random_layers(capacity, seed, levels)
    return probs, [layer.positions for layer in cache.layers]


@pytest.mark.parametrize(
    "config", CONFIGS[:2] + CONFIGS[3:4] + CONFIGS[5:], ids=lambda c: f"{c.indicator}-{c.pool_kind}"
)
@pytest.mark.parametrize("seed", range(3))
def test_steps_that_reuse_the_order_evict_as_the_per_layer_path(config, seed):
    """Six decode steps on two copies of a cache: the batched policy (the order carried from step to
    step, no sort after the first) and the per-layer reference release the same slots every step."""
    import copy

    capacity = [12, 30, 9, 21]
    fast_cache, _ = random_layers(capacity, seed, None)
    for layer in fast_cache.layers:
        layer.seen = int(layer.positions.max()) + 1  # the next token is the newest
    slow_cache = copy.deepcopy(fast_cache)
    fast, slow = FixedDecode(config, capacity), FixedDecode(config, capacity, batched=False)
    g = torch.Generator().manual_seed(seed + 100)
    query = torch.zeros(1, HEADS, 1, DIM)
    for step in range(6):
        new = [(torch.randn(1, KV_HEADS, 1, DIM, generator=g), torch.randn(1, KV_HEADS, 1, DIM, generator=g))
               for _ in capacity]  # fmt: skip
        probs = [torch.softmax(torch.randn(HEADS, 1, cap + 1, generator=g), dim=-1) for cap in capacity]
        released = []
        for cache, policy in ((fast_cache, fast), (slow_cache, slow)):
            for i, layer in enumerate(cache.layers):
                if step:  # the new token takes the slot released last step
                    layer.update(*new[i])
                policy.after_attention(cache, i, query, layer.keys, 1.0, probs=probs[i])
            policy.flush(cache)
            released.append([layer.free.tolist() for layer in cache.layers])
        assert released[0] == released[1], step
        for a, b in zip(fast_cache.layers, slow_cache.layers):
            assert torch.equal(a.positions, b.positions)
    assert fast.orders_reused == 5


def test_batched_victims_refuse_what_they_do_not_score():
    config = CakeConfig(budget=16, window=4)
    cache, probs = random_layers([8], 0, None)
    positions = [cache.layers[0].positions]
    with pytest.raises(ValueError, match="one slot over its capacity"):
        batched_victims(config, probs, positions, [6])
    with pytest.raises(ValueError, match="not 'h2o'"):
        batched_victims(CakeConfig(budget=16, window=4, indicator="h2o"), probs, positions, [8])


@pytest.mark.parametrize("indicator", ["cake", "snapkv", "chunk"])
def test_generation_with_the_batched_step_equals_the_per_layer_step(tiny_model, monkeypatch, indicator):
    """Same tokens and the same logits at every step, bit for bit, and the same cache afterwards."""
    ids = torch.randint(0, 97, (1, 72), generator=torch.Generator().manual_seed(3))
    config = CakeConfig(budget=20, window=6, indicator=indicator, decode_policy="fixed")
    use_cake_attention(tiny_model, "sdpa")
    runs = []
    for batched in (True, False):
        if not batched:
            monkeypatch.setattr(decode_module, "BATCHED", frozenset())
        logits: list[torch.Tensor] = []
        result = generate(tiny_model, ids, config, max_new_tokens=10, step_logits=logits)
        runs.append((result, logits))
    (fast, fast_logits), (slow, slow_logits) = runs
    assert fast.token_ids == slow.token_ids and len(fast.token_ids) == 10
    for a, b in zip(fast_logits, slow_logits):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert fast.kv_bytes_final == slow.kv_bytes_final
    assert fast.eviction_seconds > 0


def test_the_order_is_trusted_only_after_a_write_into_the_released_slot(monkeypatch):
    """Steps whose only change to a layer was the new token in the released slot pass the carried order
    as trusted (its positions unread); a step after a layer's positions were replaced (as `keep` does, here
    with two old tokens swapped) gets the checked path, and every step evicts as the per-layer reference."""
    import copy

    config, capacity = CakeConfig(budget=16, window=4, pool_kind="max", pool_kernel=5), [12, 30, 9, 21]
    fast_cache, _ = random_layers(capacity, 5, None)
    for layer in fast_cache.layers:
        layer.seen = int(layer.positions.max()) + 1
    slow_cache = copy.deepcopy(fast_cache)
    fast, slow = FixedDecode(config, capacity), FixedDecode(config, capacity, batched=False)
    trusted: list[bool] = []
    real = decode_module.batched_victims

    def spy(*args, **kwargs):
        trusted.append(kwargs.get("trusted", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(decode_module, "batched_victims", spy)
    g = torch.Generator().manual_seed(7)
    query = torch.zeros(1, HEADS, 1, DIM)
    for step in range(5):
        new = [(torch.randn(1, KV_HEADS, 1, DIM, generator=g), torch.randn(1, KV_HEADS, 1, DIM, generator=g))
               for _ in capacity]  # fmt: skip
        probs = [torch.softmax(torch.randn(HEADS, 1, cap + 1, generator=g), dim=-1) for cap in capacity]
        released = []
        for cache, policy in ((fast_cache, fast), (slow_cache, slow)):
            for i, layer in enumerate(cache.layers):
                if step:
                    layer.update(*new[i])
                if step == 2 and i == 1:  # replaced (as `keep` does), two old tokens' slots swapped
                    oldest = layer.positions.argsort(dim=1)[:, :2]  # [H_kv, 2]
                    layer.positions = layer.positions.scatter(1, oldest, layer.positions.gather(1, oldest.flip(1)))
                policy.after_attention(cache, i, query, layer.keys, 1.0, probs=probs[i])
            policy.flush(cache)
            released.append([layer.free.tolist() for layer in cache.layers])
        assert released[0] == released[1], step
    assert trusted == [False, True, False, True, True]
    assert fast.orders_reused == 3  # step 2: checked, found stale and sorted again


def test_a_trusted_order_must_have_the_steps_shape():
    config = CakeConfig(budget=16, window=4)
    cache, probs = random_layers([8, 5], 0, None)
    positions = [layer.positions for layer in cache.layers]
    with pytest.raises(ValueError, match="trusted order"):
        batched_victims(config, probs, positions, [8, 5], trusted=True)
    first = batched_victims(config, probs, positions, [8, 5])
    with pytest.raises(ValueError, match="trusted order"):
        batched_victims(config, probs, positions, [8, 5], order=first.following[:, :-1], trusted=True)
