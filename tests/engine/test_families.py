"""Each supported family through the engine's oracles, on tiny random models built from a config.

Qwen3 (q/k norms), Gemma 3 (local sliding layers, q/k norms, query_pre_attn_scalar), Gemma 2
(local sliding layers, attention soft-capping), Phi-3 (fused qkv, partial rotary) and Mistral with
a sliding window on every layer: no eviction = plain transformers generation; eviction = the
masking reference at every decode step (both backends, both decode policies); true positions and
native windows after eviction; the window attention is the model's own; refusals are one line.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.cache import CakeCache
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.families import UnsupportedModelError, attention_layout, check_model
from cake_cli.engine.generate import decode, forward_step, generate, prefill
from cake_cli.engine.replay import record
from tests.helpers.models import tiny_family
from tests.helpers.oracles import check_eviction, check_no_eviction
from tests.helpers.reference import MaskedReference
from tests.helpers.tiny import family_config

# arch, config overrides: each family with the feature that matters switched on
FAMILY_CASES = {
    "qwen3": ("qwen3", {}),
    "gemma3": ("gemma3_text", {"layers": 6}),  # local, local, global, local, local, global
    "gemma2": ("gemma2", {}),  # local, global, local, global; soft-cap 1
    "phi3": ("phi3", {}),
    "mistral-sliding": ("mistral", {"sliding_window": 96}),  # every layer: exact up to 96 tokens
}
_models: dict = {}


def model(case: str):
    if case not in _models:
        arch, overrides = FAMILY_CASES[case]
        _models[case] = tiny_family(arch, **overrides)
    return _models[case]


def prompt(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def local_layers(m) -> list[int]:
    return [i for i, w in enumerate(attention_layout(m.config).windows) if w is not None]


@pytest.mark.parametrize("policy", ["fixed", "grow"])
@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_no_eviction_equals_plain_generation(case, policy):
    # 48 tokens > the Gemma windows (8): local layers really slide; Gemma 2 runs eager in transformers
    backend = check_no_eviction(model(case), prompt(48), 12, policy, "eager" if case == "gemma2" else "sdpa")
    assert backend == ("eager" if case == "gemma2" else "sdpa")  # soft-capping has no SDPA kernel


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("policy", ["fixed", "grow"])
@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_eviction_equals_masking_reference(case, backend, policy):
    m = model(case)
    result, reference = check_eviction(m, prompt(60), CakeConfig(budget=20, window=6, decode_policy=policy), 6, backend)
    local = local_layers(m)
    assert [row.layer for row in result.layers if row.budget is None] == local  # local layers get no budget
    assert sorted(reference.local_layers()) == local


@pytest.mark.parametrize("policy", ["fixed", "grow"])
def test_local_layers_keep_their_window_and_global_layers_their_true_positions(policy):
    m, n, new = model("gemma3"), 60, 5
    use_cake_attention(m, "sdpa")
    config, ids, local = CakeConfig(budget=20, window=6, decode_policy=policy), prompt(n), local_layers(m)
    state = prefill(m, ids, config)
    rows = state.rows()
    token_bytes = 2 * 2 * 8 * 4  # K and V, 2 KV heads, head dim 8, fp32: one token of one layer
    for i, row in enumerate(rows):
        positions = state.cache.layers[i].positions
        if i in local:  # the native window: the last 8 - 1 positions, no statistics, no budget
            assert (row.window, row.budget, row.stats, row.kept) == (8, None, None, 7)
            assert positions.tolist() == [list(range(n - 7, n))] * 2
        else:
            assert row.window is None and row.kept == row.budget + 6 and row.stats is not None
            assert positions[:, -6:].tolist() == [list(range(n - 6, n))] * 2  # the observation window
    global_budgets = [row.budget for row in rows if row.window is None]
    assert 2 * (20 - 6) - 2 <= sum(global_budgets) <= 2 * (20 - 6)  # (B - w) · L_global, L_global = 2
    assert state.kv_bytes == sum(row.kept for row in rows) * token_bytes  # measured from the tensors
    assert state.cache.full_bytes == (2 * n + 4 * 7) * token_bytes  # a local layer's full cache is its window
    assert state.peak_bytes >= state.kv_bytes + (n - 7) * token_bytes  # a local layer attends over all n once
    kept = [row.kept for row in rows]
    result = decode(m, ids, state, config, max_new_tokens=new)
    fed = new - 1  # the last token is not fed back
    for i, layer in enumerate(state.cache.layers):
        held = sorted(layer.positions[0].tolist())
        if i in local:  # still the last 7 true positions
            assert held == list(range(n + fed - 7, n + fed))
        else:  # the new tokens at their true positions n, n+1, ...; fixed: at capacity (+ a released slot)
            assert held[-fed:] == list(range(n, n + fed))
            assert layer.keys.shape[-2] == kept[i] + (1 if policy == "fixed" else fed)
    assert result.kv_bytes_final == state.cache.kv_bytes()


@pytest.mark.parametrize("case", ["qwen3", "gemma2", "gemma3", "phi3"])
def test_window_attention_is_the_models_own(case):
    """A_l the engine scores with = the model's own attention probabilities on its last w rows (q/k
    norms, query_pre_attn_scalar scaling, soft-capping included), on every scored layer."""
    m, ids, w = model(case), prompt(40), 6
    m.set_attn_implementation("eager")
    own = m(ids, output_attentions=True).attentions  # [L] x [1, H, n, n]
    use_cake_attention(m, "eager")
    rec = record(m, ids, w)
    scored = [i for i, a in enumerate(rec.attention) if a is not None]
    assert scored == [i for i in range(m.config.num_hidden_layers) if i not in local_layers(m)]
    for i in scored:
        torch.testing.assert_close(rec.attention[i], own[i][0, :, -w:, :].float(), atol=1e-5, rtol=0)


def test_gemma2_soft_capping_changes_the_window_attention():
    """The soft-cap bites on the tiny Gemma 2 (the test above could fail without it)."""
    m, ids, w = model("gemma2"), prompt(40), 6
    use_cake_attention(m, "eager")
    capped = record(m, ids, w).attention[1]
    m.config.attn_logit_softcapping = None
    for layer in m.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    try:
        plain = record(m, ids, w).attention[1]
    finally:
        m.config.attn_logit_softcapping = 1.0
        for layer in m.model.layers:
            layer.self_attn.attn_logit_softcapping = 1.0
    assert float((capped - plain).abs().max()) > 5e-3


def test_every_layer_sliding_limits_prompt_and_generation_to_the_window():
    m = tiny_family("mistral", layers=2, sliding_window=16)
    layout = attention_layout(m.config)
    assert layout.windows == (None, None) and layout.limit == 16
    use_cake_attention(m, "sdpa")
    with pytest.raises(ValueError, match="^the prompt has 17 tokens, past the 16-token sliding window every layer"):
        prefill(m, prompt(17), CakeConfig(budget=8, window=4))
    result = generate(m, prompt(10), CakeConfig(budget=8, window=4), max_new_tokens=20)
    assert result.stop_reason == "max_positions" and len(result.token_ids) == 6  # positions 10..15 fed
    # past the window by hand (bypassing prefill's check): the attention refuses, one line
    state = prefill(m, prompt(12), CakeConfig(budget=8, window=4))
    state.cache.policy = None
    with pytest.raises(
        UnsupportedModelError, match="^layer 0 attends over a sliding window of 16 tokens and has seen 17: past"
    ):
        with torch.inference_mode():
            forward_step(m, state.cache, prompt(5, seed=3), 12, None)


def test_a_cache_without_the_local_layers_is_refused():
    m = model("gemma3")
    use_cake_attention(m, "sdpa")
    with (
        torch.inference_mode(),
        pytest.raises(UnsupportedModelError, match="sliding window of 8 tokens and has seen 12"),
    ):
        forward_step(m, CakeCache(m.config.num_hidden_layers), prompt(12), 0, None)


def test_layouts_of_the_families():
    gemma3 = family_config("gemma3_text", layers=6)
    assert attention_layout(gemma3).windows == (8, 8, None, 8, 8, None)
    qwen = family_config("qwen2", layers=4, use_sliding_window=True, sliding_window=64, max_window_layers=2)
    assert attention_layout(qwen).windows == (None, None, 64, 64)
    phi = family_config("phi3", sliding_window=2047, max_positions=4096)
    assert attention_layout(phi).limit == 2047 and attention_layout(phi).limit_reason == "sliding window"
    ignored = family_config("phi3", sliding_window=16, layer_types=["full_attention"] * 4)  # Phi-3 modules ignore it
    assert attention_layout(ignored).windows == (None,) * 4 and attention_layout(ignored).limit == 16
    assert attention_layout(family_config("llama", sliding_window=16)).limit == 8192  # Llama passes no window
    wide = family_config("mistral", sliding_window=8192, max_positions=4096)  # a window past every position
    assert attention_layout(wide).windows == (None,) * 4 and attention_layout(wide).limit == 4096
    assert attention_layout(family_config("llama")).limit_text() == "the model's 8192-position limit"


def test_unsupported_features_are_refused_in_one_line():
    bidirectional = tiny_family("gemma3_text", layers=3, use_bidirectional_attention=True)
    with pytest.raises(UnsupportedModelError, match="^gemma3_text model with bidirectional attention"):
        use_cake_attention(bidirectional, "sdpa")
    chunked = family_config("qwen3", layers=2)
    chunked.layer_types = ["full_attention", "chunked_attention"]
    with pytest.raises(UnsupportedModelError, match="with chunked_attention layers: the CAKE engine handles"):
        attention_layout(chunked)
    sinks = tiny_family("qwen3", layers=2)
    sinks.model.layers[1].self_attn.sinks = torch.nn.Parameter(torch.zeros(8))
    with pytest.raises(UnsupportedModelError, match="^decoder layer 1: attention sinks"):
        check_model(sinks)
    for refused in (bidirectional, sinks):
        assert refused.config._attn_implementation != "cake_sdpa"  # attention left unchanged


def test_plain_cache_reference_matches_transformers_sliding_cache():
    """The reference's full cache + position masks = transformers' own sliding-window cache."""
    m, ids = model("gemma3"), prompt(30)
    m.set_attn_implementation("sdpa")
    own = m(ids, cache=DynamicCache(config=m.config)).logits[:, -1].float()
    reference = MaskedReference(m, CakeConfig(budget=64, window=6))
    torch.testing.assert_close(reference.run(ids, [])[0], own, atol=1e-4, rtol=0)


_random_models: dict = {}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arch=st.sampled_from(["gemma3_text", "gemma2", "qwen3"]),  # families with per-layer kinds
    kinds=st.lists(st.booleans(), min_size=2, max_size=3).filter(lambda k: not all(k)),  # True = local
    sliding=st.integers(2, 12),
    n=st.integers(2, 36),
    window=st.integers(1, 6),
    extra=st.integers(0, 20),
    policy=st.sampled_from(["fixed", "grow"]),
    backend=st.sampled_from(["eager", "sdpa"]),
    seed=st.integers(0, 1000),
)
@pytest.mark.slow
def test_random_families_match_the_masking_reference(arch, kinds, sliding, n, window, extra, policy, backend, seed):
    """Random layer kinds (local / global), windows, prompts and budgets: engine = reference."""
    key = (arch, tuple(kinds), sliding)
    if key not in _random_models:
        types = ["sliding_attention" if local else "full_attention" for local in kinds]
        switch = {"use_sliding_window": True} if arch == "qwen3" else {}
        _random_models[key] = tiny_family(
            arch,
            layers=len(kinds),
            heads=4,
            kv_heads=2,
            head_dim=4,
            sliding_window=sliding,
            layer_types=types,
            **switch,
        )
    m = _random_models[key]
    use_cake_attention(m, backend)
    config = CakeConfig(budget=window + extra, window=window, decode_policy=policy)
    ids = torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(seed))
    steps: list[torch.Tensor] = []
    result = generate(m, ids, config, max_new_tokens=4, step_logits=steps)
    for row, local in zip(result.layers, kinds):
        if local:
            assert row.window == sliding and row.budget is None and row.kept == min(n, sliding - 1)
    want = MaskedReference(m, config).run(ids, list(result.token_ids))
    for got, ref in zip(steps, want, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
