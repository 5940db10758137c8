"""Oracles for the CAKE engine: plain generation, masking reference, one-shot top-k (Thm. 1)."""

from __future__ import annotations

import pytest
import torch

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import forward_step, generate, prefill
from tests.helpers.oracles import check_eviction, check_no_eviction
from tests.helpers.reference import MaskedReference


def prompt(n: int, vocab: int = 97, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("policy", ["fixed", "grow"])
def test_no_eviction_equals_plain_generation(tiny_model, policy):
    check_no_eviction(tiny_model, prompt(60), 12, policy)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("policy", ["fixed", "grow"])
def test_eviction_equals_masking_reference(tiny_model, backend, policy):
    check_eviction(tiny_model, prompt(72), CakeConfig(budget=20, window=6, decode_policy=policy), 8, backend)


def test_a_full_cache_prefill_reports_every_layer_and_changes_nothing(tiny_model):
    """Without a config nothing is scored, yet `on_layer` sees each layer as the cascade's does (progress
    for prefills kept whole: compress, qa with several questions, chat); the state equals a silent prefill's."""
    ids = prompt(40)
    use_cake_attention(tiny_model, "sdpa")
    seen = []
    reported = prefill(tiny_model, ids, None, on_layer=lambda i, total: seen.append((i, total)))
    silent = prefill(tiny_model, ids, None)
    layers = tiny_model.config.num_hidden_layers
    assert seen == [(i, layers) for i in range(layers)]
    assert reported.cache.policy is None and reported.cascade is None
    torch.testing.assert_close(reported.logits, silent.logits, atol=0, rtol=0)
    assert reported.lengths == silent.lengths == [40] * layers


def test_fixed_policy_keeps_sizes_and_grow_appends(tiny_model):
    ids, new = prompt(72), 6
    use_cake_attention(tiny_model, "sdpa")
    sizes = {}
    for policy in ("fixed", "grow"):
        config = CakeConfig(budget=20, window=6, decode_policy=policy)
        result = generate(tiny_model, ids, config, max_new_tokens=new)
        sizes[policy] = (result.kv_bytes_kept, result.kv_bytes_final)
    token_bytes = 2 * 2 * 8 * 4  # K and V, 2 KV heads, head dim 8, fp32: one token in one layer
    # fixed: each layer holds its B_l + w live tokens plus the one released slot the next token reuses
    assert sizes["fixed"][1] == sizes["fixed"][0] + 4 * token_bytes
    assert sizes["fixed"][0] == 20 * 4 * token_bytes  # B·L slots: budgets sum exactly here
    assert sizes["grow"][1] - sizes["grow"][0] == 4 * token_bytes * (new - 1)  # last token is not fed back


def test_multi_token_continuation_after_eviction_matches_single_steps(tiny_model):
    """A 5-token forward on layers of different lengths = five 1-token forwards (mask + positions)."""
    ids, extra = prompt(72), prompt(5, seed=7)
    config = CakeConfig(budget=20, window=6, decode_policy="grow")
    for backend in ("eager", "sdpa"):
        use_cake_attention(tiny_model, backend)
        with torch.inference_mode():
            one = prefill(tiny_model, ids, config)
            assert len(set(one.lengths)) > 1
            one.cache.policy = None
            together = (
                tiny_model(input_ids=extra, position_ids=torch.arange(72, 77)[None], cache=one.cache, cake=one.cache)
                .logits[0]
                .float()
            )
            two = prefill(tiny_model, ids, config)
            two.cache.policy = None
            steps = torch.cat(
                [forward_step(tiny_model, two.cache, extra[:, i : i + 1], 72 + i, None) for i in range(5)]
            ).float()
        torch.testing.assert_close(together, steps, atol=1e-4, rtol=0)
        # positions are the true ones, not the compressed length
        assert one.cache.layers[0].positions[0, -5:].tolist() == [72, 73, 74, 75, 76]


def test_cascade_keeps_one_shot_top_k(tiny_model):
    """Thm. 1 on a model: the cascade's kept positions = one-shot top-k of the reference indicator."""
    ids = prompt(90)
    config = CakeConfig(budget=24, window=8)
    use_cake_attention(tiny_model, "sdpa")
    state = prefill(tiny_model, ids, config)
    reference = MaskedReference(tiny_model, config)
    reference.run(ids, [])
    budgets = state.cascade.final_budgets
    for layer, budget in enumerate(budgets):
        kept = state.cache.layers[layer].positions
        for kv, scores in enumerate(reference.indicators[layer]):
            want = sorted(sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:budget]) + list(range(82, 90))
            assert kept[kv].tolist() == want, f"layer {layer} head {kv}"
    for (h, v), stats in zip(reference.stats, (row.stats for row in state.rows())):
        assert stats.dispersion == pytest.approx(h, rel=1e-5)
        assert stats.shift == pytest.approx(v, rel=1e-4)


def test_peak_memory_during_prefill_is_bounded_by_the_cascade(tiny_model):
    ids = prompt(200)
    config = CakeConfig(budget=24, window=8)
    use_cake_attention(tiny_model, "sdpa")
    state = prefill(tiny_model, ids, config)
    layers, kv, d, elem = 4, 2, 8, 4
    token_bytes = 2 * kv * d * elem  # K and V of one token in one layer
    assert state.kv_bytes == sum(state.lengths) * token_bytes
    assert 24 * layers - layers <= sum(state.lengths) <= 24 * layers
    # at most: the whole evictable total + every window + one full layer being prefilled
    bound = ((24 - 8) * layers + 8 * layers + 200) * token_bytes
    assert state.cache.full_bytes == 200 * layers * token_bytes
    assert state.peak_bytes <= bound < state.cache.full_bytes
