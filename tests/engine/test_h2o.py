"""H2O (Zhang et al. 2023, "Heavy-Hitter Oracle"): the accumulated attention of every query.

The oracle materialises what the engine never does: the model's own eager attention, the full
[H, n, n] causal matrix of every layer (`output_attentions`), summed down its query rows and averaged
over each KV head's query heads. The engine's block-wise sums (`window.accumulated_attention`, run
from the cache hook during prefill) must equal it to float32 rounding, with blocks that do and do not
divide n; the tokens H2O keeps must be the reference's top-k; decoding keeps accumulating.
"""

from __future__ import annotations

import pytest
import torch

from cake_cli.engine import window
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.cachefile import cache_from_tensors, cache_tensors
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.continuation import extend_and_evict
from cake_cli.engine.families import attention_layout
from cake_cli.engine.generate import Prefilled, decode, forward_step, prefill
from cake_cli.engine.indicators import token_scores
from cake_cli.engine.methods import with_method
from cake_cli.engine.replay import record, replay
from tests.helpers.models import tiny_family, tiny_llama

W = 6  # observation window
_models: dict = {}


def model(case: str):
    """Tiny random models: Llama with GQA (8 query / 2 KV heads) or MHA (4 / 4), Gemma 2 (local
    sliding layers 0 and 2, soft-cap 1, query_pre_attn_scalar scaling)."""
    if case not in _models:
        _models[case] = {
            "gqa": lambda: tiny_llama(heads=8, kv_heads=2),
            "mha": lambda: tiny_llama(heads=4, kv_heads=4),
            "gemma2": lambda: tiny_family("gemma2"),
        }[case]()
    return _models[case]


def prompt(n: int, seed: int = 5) -> torch.Tensor:
    return torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def h2o(budget: int, policy: str = "fixed") -> CakeConfig:
    return with_method(CakeConfig(budget=budget, window=W, decode_policy=policy), "h2o")


def reference_sums(m, ids: torch.Tensor) -> list[torch.Tensor | None]:
    """Per layer, [H_kv, n] float32: the eager [1, H, n, n] attention summed over its n query rows,
    averaged over the g query heads of each KV head; None for a local (sliding) layer."""
    m.set_attn_implementation("eager")
    with torch.inference_mode():
        attentions = m(ids, output_attentions=True).attentions  # [L] x [1, H, n, n]
    num_kv, windows = m.config.num_key_value_heads, attention_layout(m.config).windows
    out = []
    for a, local in zip(attentions, windows):
        full = a[0].float()  # [H, n, n], causal: zeros above the diagonal
        assert full.shape[-1] == full.shape[-2] == ids.shape[1]
        sums = full.sum(dim=1)  # [H, n]
        out.append(None if local else sums.view(num_kv, -1, sums.shape[-1]).mean(dim=1))
    return out


def reference_top_k(sums: torch.Tensor, k: int) -> list[set[int]]:
    """Per KV head, the k evictable positions (all but the last W) with the highest reference sums."""
    cand = sums[:, :-W]
    order = cand.sort(dim=-1, descending=True, stable=True)
    # the comparison means something only where the k-th and (k+1)-th scores are apart
    gap = order.values[:, k - 1] - order.values[:, k]
    assert bool((gap > 1e-4 * order.values[:, k - 1]).all()), "near-tie at the cut: pick another seed"
    return [set(row.tolist()) for row in order.indices[:, :k]]


@pytest.fixture
def block(monkeypatch, request):
    """Rows per block of `accumulated_attention` during the test (`request.param`); checks it was used."""
    calls = []
    monkeypatch.setattr(window, "block_rows", lambda heads, keys: calls.append(keys) or request.param)
    yield request.param
    assert calls, "accumulated_attention never ran"


@pytest.mark.parametrize("block", [16, 48, 1024], indirect=True)
@pytest.mark.parametrize("n", [40, 97, 256])
@pytest.mark.parametrize("case", ["gqa", "mha"])
def test_blockwise_sums_equal_the_full_attention_column_sums(case, n, block):
    """Blocks of 16 and 48 rows (n = 40 and 97 are no multiple of either, 256 one of 16 only) and of
    1024 (one block); GQA (8 query heads averaged per KV head, 4 each) and MHA."""
    m, ids = model(case), prompt(n)
    want = reference_sums(m, ids)
    use_cake_attention(m, "eager")
    rec = record(m, ids, W)  # a full cache that accumulates
    for layer, expected in zip(rec.cache.layers, want):
        got = layer.scores  # [H_kv, n]
        assert got.shape == (m.config.num_key_value_heads, n)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        # every query's probabilities sum to 1: the total mass is the number of queries
        torch.testing.assert_close(got.sum(dim=-1), torch.full((got.shape[0],), float(n)), rtol=1e-5, atol=0)


@pytest.mark.parametrize("block", [16, 1024], indirect=True)
def test_soft_capping_scaling_and_local_layers(block):
    """Gemma 2: soft-capped, query_pre_attn_scalar-scaled sums on the global layers; the local
    (sliding) layers accumulate nothing (never scored)."""
    m, ids = model("gemma2"), prompt(60)
    want = reference_sums(m, ids)
    use_cake_attention(m, "eager")
    rec = record(m, ids, W)
    assert [x is None for x in want] == [w is not None for w in attention_layout(m.config).windows] != [False] * 4
    for layer, expected in zip(rec.cache.layers, want):
        if expected is None:
            assert layer.scores is None and not layer.accumulates
        else:
            torch.testing.assert_close(layer.scores, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 7, 29, 30, 31, 1024])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_function_with_cached_keys_equals_the_materialised_attention(rows, softcap):
    """q = 30 new queries after 50 cached keys (a continuation): the cached keys are visible to every
    row, the new ones causal; = the full [H, q, k] probabilities (`window_attention`) summed down."""
    gen = torch.Generator().manual_seed(0)
    query, key = torch.randn(8, 30, 16, generator=gen) * 2, torch.randn(2, 80, 16, generator=gen) * 2
    full = window.window_attention(query, key, 0.25, softcap)  # [H, q, k]
    want = full.sum(dim=1).view(2, 4, 80).mean(dim=1)
    got = window.accumulated_attention(query, key, 0.25, softcap, rows=rows)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="bad shapes"):
        window.accumulated_attention(query, key[:, :20], 0.25)


@pytest.mark.parametrize("block", [16, 48], indirect=True)
@pytest.mark.parametrize("case, n, budget", [("gqa", 97, 30), ("gqa", 150, 40), ("mha", 120, 24)])
def test_kept_tokens_are_the_reference_top_k(case, n, budget, block):
    """H2O (uniform budgets B - w per layer) keeps, per KV head, the top B - w evictable tokens of
    the reference sums, plus the window; KV heads keep different tokens."""
    m, ids = model(case), prompt(n, seed=11)
    want = reference_sums(m, ids)
    use_cake_attention(m, "eager")
    state = prefill(m, ids, h2o(budget))
    assert state.cascade.final_budgets == [budget - W] * m.config.num_hidden_layers
    distinct = False
    for layer, sums in zip(state.cache.layers, want):
        kept = layer.positions  # [H_kv, B]
        for head, top in enumerate(reference_top_k(sums, budget - W)):
            assert set(kept[head].tolist()) == top | set(range(n - W, n))
        distinct |= len({tuple(row.tolist()) for row in kept}) > 1
        # the scores kept with the tokens are the reference's, gathered with them
        torch.testing.assert_close(layer.scores, sums.gather(1, kept), rtol=1e-5, atol=1e-6)
    assert distinct or kept.shape[0] == 1


def test_indicator_is_the_accumulated_scores_not_the_window():
    """token_scores('h2o') returns the accumulated [H_kv, m] scores as given (no pooling, no window)."""
    a, pos, acc = torch.rand(8, 3, 5), torch.arange(5).expand(2, 5), torch.rand(2, 5)
    assert torch.equal(token_scores("h2o", a, pos, 2, gamma=0.0, pool=("max", 7), accumulated=acc), acc)
    with pytest.raises(ValueError, match="accumulated attention"):
        token_scores("h2o", a, pos, 2, gamma=0.0, pool=("avg", 1))


def test_decode_accumulates_every_decoded_query():
    """Nothing evicted (B >= prompt + answer): after decoding, the scores are the column sums of the
    eager attention over prompt + generated tokens (every decoded query included)."""
    m, ids, new = model("gqa"), prompt(50), 8
    use_cake_attention(m, "sdpa")
    state = prefill(m, ids, h2o(64))
    result = decode(m, ids, state, h2o(64), max_new_tokens=new)
    fed = torch.cat([ids, torch.tensor([list(result.token_ids[:-1])])], dim=1)  # the last token is not fed back
    for layer, expected in zip(state.cache.layers, reference_sums(m, fed)):
        torch.testing.assert_close(layer.scores, expected, rtol=1e-5, atol=1e-5)


def test_decode_evicts_the_lowest_accumulated_score():
    """Under eviction, each step releases the candidate (all but the most recent w) with the lowest
    score accumulated so far, this step's query included; the total mass grows by 1 a query."""
    m, ids = model("gqa"), prompt(80)
    config = h2o(24)
    use_cake_attention(m, "sdpa")
    state = prefill(m, ids, config)
    decode(m, ids, state, config, max_new_tokens=0)  # no step, but the fixed policy is installed
    cache = state.cache
    mass = [layer.scores.sum(dim=-1) for layer in cache.layers]
    with torch.inference_mode():
        for step, token in enumerate([3, 14, 15, 92]):
            forward_step(m, cache, torch.tensor([[token]]), 80 + step, None)
            for i, layer in enumerate(cache.layers):
                order = layer.positions.argsort(dim=-1)
                scores = layer.scores.gather(1, order)[:, :-W]  # candidates in position order
                victim = layer.scores.gather(1, layer.free.unsqueeze(1)).squeeze(1)  # [H_kv]
                torch.testing.assert_close(victim, scores.min(dim=-1).values, rtol=0, atol=0)
                mass[i] = mass[i] + 1.0
                torch.testing.assert_close(layer.scores.sum(dim=-1), mass[i], rtol=1e-5, atol=0)
                mass[i] = mass[i] - victim  # the released slot's score goes with its token


def test_replay_needs_an_accumulating_recording_and_grow_stops_accumulating():
    m, ids = model("gqa"), prompt(60)
    use_cake_attention(m, "sdpa")
    with pytest.raises(ValueError, match="accumulate=True"):
        replay(record(m, ids, W, accumulate=False), h2o(24))
    state = prefill(m, ids, h2o(24, "grow"))
    generate_grow = decode(m, ids, state, h2o(24, "grow"), max_new_tokens=3)
    assert generate_grow.decode_steps == 2
    assert all(layer.scores is None and not layer.accumulates for layer in state.cache.layers)


def test_saved_tensors_keep_the_scores_and_a_cache_without_them_is_refused():
    m, ids = model("gqa"), prompt(70)
    use_cake_attention(m, "sdpa")
    state = prefill(m, ids, h2o(24))
    tensors = cache_tensors(state.cache)
    loaded = cache_from_tensors(tensors, 4, 70, "cpu")
    for a, b in zip(loaded.layers, state.cache.layers):
        assert a.accumulates and torch.equal(a.scores, b.scores)
    bare = cache_from_tensors({k: v for k, v in tensors.items() if not k.startswith("scores.")}, 4, 70, "cpu")
    with pytest.raises(ValueError, match="accumulated attention"):
        bare_state = Prefilled(bare, None, state.logits, 0.0, bare.lengths(), 0, 0)
        decode(m, ids, bare_state, h2o(24), max_new_tokens=2, capacity=bare.lengths())


def test_question_aware_eviction_runs_every_prompt_query():
    """A whole prefix evicted when the question comes (`extend_and_evict`): H2O runs the whole prompt
    again, so it keeps what one prefill of the prompt keeps."""
    m, full = model("gqa"), prompt(90)
    use_cake_attention(m, "sdpa")
    whole = prefill(m, full[:, :70], None)
    aware = extend_and_evict(m, whole, full, h2o(24))
    live = prefill(m, full, h2o(24))
    assert aware.cascade.final_budgets == live.cascade.final_budgets
    for a, b in zip(aware.cache.layers, live.cache.layers):
        assert torch.equal(a.positions, b.positions)
        torch.testing.assert_close(a.scores, b.scores, rtol=1e-5, atol=1e-6)
