"""Oracles for continuing a compressed prefix (`engine.continuation`): plain generation without
eviction, the masking reference after eviction, and a saved-and-reloaded cache against the
in-process one (token-identical, logits bit-identical)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.cachefile import cache_from_tensors, cache_tensors
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.continuation import (
    SavedCascade,
    clone_cache,
    continuation_capacity,
    continue_and_decode,
    drop_from,
    extend,
    extend_and_evict,
)
from cake_cli.engine.generate import Prefilled, decode, generate, prefill
from tests.helpers.models import ids_of
from tests.helpers.reference import MaskedReference


def answer(model, prefix_state: Prefilled, suffix: torch.Tensor, prefix: torch.Tensor, config, new: int, **kw):
    """Continue `prefix_state` with `suffix`, then decode greedily `new` tokens."""
    state = extend(model, prefix_state, suffix)
    evicting = prefix_state.cascade is not None and prefix_state.cascade.evicting
    capacity = continuation_capacity(config, evicting, state.lengths) if config is not None else None
    full = torch.cat([prefix, suffix], dim=1)
    return decode(model, full, state, config, max_new_tokens=new, capacity=capacity, **kw), state


@pytest.mark.parametrize("config", [None, CakeConfig(budget=400, window=8, decode_policy="fixed")])
def test_no_eviction_plus_continuation_equals_plain_generation(tiny_model, config):
    prefix, suffix, new = ids_of(50, 1), ids_of(9, 2), 10
    full = torch.cat([prefix, suffix], dim=1)
    tiny_model.set_attn_implementation("sdpa")
    plain = tiny_model.generate(full, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    use_cake_attention(tiny_model, "sdpa")
    state = prefill(tiny_model, prefix, config)
    result, cont = answer(tiny_model, state, suffix, prefix, config, new)
    assert list(result.token_ids) == plain[0, full.shape[1] :].tolist()
    assert cont.lengths == [59] * 4 and cont.kv_bytes == result.kv_bytes_full  # full cache of prefix + suffix
    assert state.cache.lengths() == [50] * 4, "the compressed prefix itself is left unchanged"


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_continuation_after_eviction_equals_masking_reference(tiny_model, backend):
    """grow policy: the reference feeds the suffix one token at a time with nothing more evicted, which
    is what the one multi-token continuation forward must compute over the evicted cache."""
    prefix, suffix, new = ids_of(70, 3), ids_of(7, 4), 6
    config = CakeConfig(budget=20, window=6, decode_policy="grow")
    use_cake_attention(tiny_model, backend)
    state = prefill(tiny_model, prefix, config)
    assert state.cascade.evicting and len(set(state.lengths)) > 1
    logits: list[torch.Tensor] = []
    cont = extend(tiny_model, state, suffix, step_logits=logits)
    result = decode(tiny_model, torch.cat([prefix, suffix], 1), cont, config, max_new_tokens=new, step_logits=logits)
    reference = MaskedReference(tiny_model, config)
    ref = reference.run(prefix, suffix[0].tolist() + list(result.token_ids))
    want = ref[len(suffix[0]) :]  # after the last suffix token, then after each answer token
    assert len(logits) == len(want) == new
    for step, (got, expected) in enumerate(zip(logits, want)):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0, msg=f"step {step}")
    # the test can fail: the full cache (nothing evicted) gives other logits
    plain = extend(tiny_model, prefill(tiny_model, prefix, None), suffix)
    assert float((plain.logits.float() - logits[0]).abs().max()) > 1e-3


def test_continuation_tokens_are_held_on_top_of_the_budget(tiny_model):
    prefix, suffix = ids_of(80, 5), ids_of(12, 6)
    config = CakeConfig(budget=24, window=6, decode_policy="fixed")
    use_cake_attention(tiny_model, "sdpa")
    state = prefill(tiny_model, prefix, config)
    cont = extend(tiny_model, state, suffix)
    assert cont.lengths == [n + 12 for n in state.lengths]
    for layer in cont.cache.layers:  # every KV head holds every suffix token after the continuation
        assert (layer.positions[:, -12:] == torch.arange(80, 92)).all()
    capacity = continuation_capacity(config, True, cont.lengths)
    result = decode(tiny_model, torch.cat([prefix, suffix], 1), cont, config, max_new_tokens=8, capacity=capacity)
    assert result.decode_steps == 7
    assert cont.cache.lengths() == cont.lengths, "fixed decoding keeps every layer at its size after it"
    assert continuation_capacity(config, False, [10, 30]) == [24, 30]  # not evicted: at least B


def saved_and_loaded(state: Prefilled) -> Prefilled:
    """The state as a .cake file would carry it: safetensors bytes and back (nothing else shared)."""
    blob = save_tensors(cache_tensors(state.cache))
    tensors = load_tensors(blob)
    n = state.cache.layers[0].seen
    cache = cache_from_tensors(tensors, len(state.cache.layers), n, "cpu")
    cascade = SavedCascade(list(state.cascade.stats), state.cascade.final_budgets, state.cascade.evicting)
    return Prefilled(cache, cascade, state.logits, 0.0, cache.lengths(), cache.kv_bytes(), cache.kv_bytes())


@pytest.mark.parametrize("policy", ["fixed", "grow"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loaded_cache_answers_token_identically(tiny_model, policy, seed):
    gen = torch.Generator().manual_seed(100 + seed)
    n, q = int(torch.randint(40, 120, (1,), generator=gen)), int(torch.randint(2, 15, (1,), generator=gen))
    window = int(torch.randint(4, 10, (1,), generator=gen))
    config = CakeConfig(
        budget=window + int(torch.randint(4, 30, (1,), generator=gen)), window=window, decode_policy=policy
    )
    prefix, suffix = ids_of(n, seed), ids_of(q, seed + 50)
    use_cake_attention(tiny_model, "sdpa")
    state = prefill(tiny_model, prefix, config)
    assert state.cascade.evicting
    here_logits: list[torch.Tensor] = []
    there_logits: list[torch.Tensor] = []
    here, _ = answer(tiny_model, state, suffix, prefix, config, 12, step_logits=here_logits)
    loaded = saved_and_loaded(state)
    there, _ = answer(tiny_model, loaded, suffix, prefix, config, 12, step_logits=there_logits)
    assert there.token_ids == here.token_ids and len(here.token_ids) == 12
    assert all(torch.equal(a, b) for a, b in zip(here_logits, there_logits))
    assert [r.budget for r in there.layers] == [r.budget for r in here.layers]
    # a second question on the same loaded cache starts from the same compressed state
    again, _ = answer(tiny_model, loaded, suffix, prefix, config, 12)
    assert again.token_ids == here.token_ids


def test_drop_from_removes_a_probe_inside_the_window(tiny_model):
    prefix, probe = ids_of(60, 7), ids_of(5, 8)
    config = CakeConfig(budget=20, window=8)
    use_cake_attention(tiny_model, "sdpa")
    state = prefill(tiny_model, torch.cat([prefix, probe], 1), config)
    before = state.cache.lengths()
    drop_from(state.cache, 60)
    assert state.cache.lengths() == [b - 5 for b in before]
    for layer in state.cache.layers:
        assert int(layer.positions.max()) == 59 and layer.seen == 60
    copy = clone_cache(state.cache)
    assert all(torch.equal(a.keys, b.keys) for a, b in zip(copy.layers, state.cache.layers))


def test_bad_tensors_are_refused():
    good = {
        "keys.0": torch.zeros(2, 3, 4),
        "values.0": torch.zeros(2, 3, 4),
        "positions.0": torch.tensor([[0, 1, 2]] * 2),
    }
    cache_from_tensors(good, 1, 3, "cpu")
    for bad, words in (
        ({**good, "values.0": torch.zeros(2, 4, 4)}, "do not fit"),
        ({**good, "positions.0": torch.tensor([[0, 2, 1]] * 2)}, "increasing"),
        ({k: v for k, v in good.items() if k != "keys.0"}, "missing"),
    ):
        with pytest.raises(ValueError, match=words):
            cache_from_tensors(bad, 1, 3, "cpu")
    with pytest.raises(ValueError, match="increasing"):
        cache_from_tensors(good, 1, 2, "cpu")  # position 2 is not below seen = 2


@pytest.mark.parametrize("policy", ["fixed", "grow"])
@pytest.mark.parametrize("split", [30, 75, 87])
def test_question_aware_eviction_on_a_whole_prefix_equals_one_prefill(tiny_model, policy, split):
    """A prefix kept whole, then the rest of the prompt run with the cascade (`extend_and_evict`): the
    same tokens kept per layer and KV head, and the same logits, as one CAKE prefill of the whole prompt
    (split 87: a 3-token continuation, shorter than the 6-token window, runs 3 prefix tokens again)."""
    full = ids_of(90, 11)
    config = CakeConfig(budget=24, window=6, decode_policy=policy)
    use_cake_attention(tiny_model, "sdpa")
    aware_logits: list[torch.Tensor] = []
    aware = generate(tiny_model, full, config, max_new_tokens=8, step_logits=aware_logits)
    whole = prefill(tiny_model, full[:, :split], None)
    state = extend_and_evict(tiny_model, whole, full, config)
    reference = prefill(tiny_model, full, config)
    assert state.lengths == reference.lengths and state.cascade.final_budgets == reference.cascade.final_budgets
    for got, want in zip(state.cache.layers, reference.cache.layers):
        assert torch.equal(got.positions, want.positions)
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=0)
    logits: list[torch.Tensor] = []
    forced = list(aware.token_ids)
    result = continue_and_decode(tiny_model, whole, full, config, evict=True, forced_tokens=forced,
                                 max_new_tokens=8, step_logits=logits)  # fmt: skip
    assert result.evicted and whole.cache.lengths() == [split] * 4, "the whole prefix stays reusable"
    torch.testing.assert_close(result.first_logits, aware.first_logits, atol=1e-4, rtol=0)
    for step, (got, want) in enumerate(zip(logits, aware_logits[1:])):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0, msg=f"decode step {step}")


def test_the_question_time_cascade_asks_for_the_window_rows_only_when_it_evicts():
    """`DeferredCascade.window_rows`: the window's w rows when the layer will be evicted (their probabilities
    then give its output and its score, `attention.split_attention`); 0 when nothing is evicted, so the
    backend runs every row as a prefill of the whole prompt does, and 0 for a forward over other keys."""
    from cake_cli.engine.continuation import DeferredCascade

    evicting = DeferredCascade(CakeConfig(budget=24, window=6), 4, 90)
    assert evicting.window_rows(0, 90) == 6 and evicting.window_rows(0, 91) == 0
    assert DeferredCascade(CakeConfig(budget=200, window=6), 4, 90).window_rows(0, 90) == 0


def test_the_cache_hands_the_window_rows_over_on_whole_global_layers_only():
    """`CakeCache.window_rows`: the policy's rows on a global layer; 0 on a layer that accumulates H2O's
    attention (it needs every query's) or whose KV heads hold different numbers of tokens (the split's
    probabilities would spread over their padding)."""
    from cake_cli.engine.cache import CakeCache
    from cake_cli.engine.continuation import DeferredCascade

    cache = CakeCache(2, policy=DeferredCascade(CakeConfig(budget=24, window=6), 2, 90))
    assert [cache.window_rows(i, 90) for i in range(2)] == [6, 6]
    cache.layers[0].accumulates = True
    cache.layers[1].start = torch.zeros(2, dtype=torch.long)
    assert [cache.window_rows(i, 90) for i in range(2)] == [0, 0]
