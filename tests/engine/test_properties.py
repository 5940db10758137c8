"""Property-based checks of the engine on random shapes (hypothesis), and edge cases.

Random draws: layers, query heads, GQA ratio (incl. 7 and MQA), prompt length, window, budget,
taus, gamma, decode policy. Each example builds a tiny random Llama and checks the eviction ≡
masking oracle, Thm. 1 (kept positions = one-shot top-k of the reference indicator), budget
sums, KV-head granularity and finiteness.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.cache import NonFiniteError
from cake_cli.engine.config import CakeConfig, SamplingConfig
from cake_cli.engine.generate import generate, prefill
from cake_cli.engine.indicators import variance_rows
from cake_cli.engine.preference import dispersion, log_preference, shift
from cake_cli.engine.sampling import AnswerNGrams, Sampler, repeated_tail
from cake_cli.engine.window import window_attention
from tests.helpers.models import tiny_llama
from tests.helpers.reference import MaskedReference

_models: dict = {}


def model_for(layers, kv_heads, group, seed=0):
    key = (layers, kv_heads, group)
    if key not in _models:
        _models[key] = tiny_llama(layers=layers, heads=kv_heads * group, kv_heads=kv_heads, head_dim=4, seed=seed)
    return _models[key]


shapes = st.tuples(st.integers(1, 3), st.sampled_from([(1, 1), (1, 7), (2, 1), (2, 2), (1, 4), (2, 7)]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=shapes,
    n=st.integers(2, 40),
    window=st.integers(1, 8),
    extra=st.integers(0, 30),
    tau1=st.floats(0.2, 2.0),
    tau2=st.floats(0.4, 3.0),
    gamma=st.sampled_from([0.0, 1.0, 200.0]),
    policy=st.sampled_from(["fixed", "grow"]),
    backend=st.sampled_from(["eager", "sdpa"]),
    seed=st.integers(0, 1000),
)
# exact ties among candidates (avg pooling wider than them) in a batched decode step with padded layers
@example(
    shape=(2, (1, 7)), n=8, window=2, extra=3, tau1=1.0, tau2=1.0, gamma=0.0, policy="fixed", backend="eager", seed=1
)
def test_random_shapes_match_the_masking_reference(shape, n, window, extra, tau1, tau2, gamma, policy, backend, seed):
    layers, (kv_heads, group) = shape
    model = model_for(layers, kv_heads, group)
    use_cake_attention(model, backend)
    budget = window + extra
    ids = torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(seed))
    config = CakeConfig(budget=budget, window=window, tau1=tau1, tau2=tau2, gamma=gamma, decode_policy=policy)
    steps: list[torch.Tensor] = []
    result = generate(model, ids, config, max_new_tokens=4, step_logits=steps)
    lengths = [row.kept for row in result.layers]
    assert all(length >= min(n, window) for length in lengths), "the window is always kept"
    if n <= budget:
        assert not result.evicted and lengths == [n] * layers
    else:
        budgets = [row.budget for row in result.layers]
        assert lengths == [b + window for b in budgets]
        total = (budget - window) * layers
        assert max(0, min(total, layers * (n - window)) - layers) <= sum(budgets) <= total
    assert all(torch.isfinite(x).all() for x in steps)
    reference = MaskedReference(model, config)
    want = reference.run(ids, list(result.token_ids))
    for got, ref in zip(steps, want):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_statistics_are_finite_with_zeros_and_low_precision(dtype):
    gen = torch.Generator().manual_seed(0)
    query = (torch.randn(8, 4, 16, generator=gen) * 30).to(dtype)  # sharp attention: many exact zeros
    key = (torch.randn(2, 50, 16, generator=gen) * 30).to(dtype)
    a = window_attention(query, key, 16**-0.5)
    assert a.dtype == torch.float32 and (a == 0).any()
    a_ev = a[:, :, :46]
    h, v = dispersion(a_ev), shift(variance_rows(a_ev))
    assert h >= 0 and v >= 0 and torch.isfinite(torch.tensor([h, v])).all()
    assert log_preference(0.0, v, 1.0, 1.0) == float("-inf")  # P = 0, not NaN


@pytest.mark.parametrize("sharpness", [0.5, 3.0, 30.0])
def test_dispersion_and_window_attention_equal_float64_references(sharpness):
    """Eq. 4 in float32 (`dispersion`) against -sum a log a in float64 with 0 log 0 = 0, and the window's
    probabilities against a float64 softmax of the causally masked logits (row i sees keys 0..n - w + i)."""
    gen = torch.Generator().manual_seed(int(sharpness * 10))
    query = torch.randn(6, 5, 16, generator=gen) * sharpness
    key = torch.randn(3, 400, 16, generator=gen) * sharpness
    a = window_attention(query, key, 16**-0.5)  # [6, 5, 400]
    logits = torch.einsum("hwd,hnd->hwn", query.double(), key.double().repeat_interleave(2, dim=0)) * 16**-0.5
    future = torch.arange(400)[None, :] > torch.arange(395, 400)[:, None]  # [5, 400]
    want = torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1)
    torch.testing.assert_close(a.double(), want, atol=1e-6, rtol=1e-5)
    a_ev = a[:, :, :395]
    h64 = -float(torch.where(a_ev > 0, a_ev.double() * a_ev.double().log(), 0.0).sum())
    assert dispersion(a_ev) == pytest.approx(h64, rel=1e-6)


def test_single_window_row_has_zero_shift():
    a = torch.rand(2, 1, 10)
    assert shift(variance_rows(a)) == 0.0


def test_non_finite_keys_are_refused(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    with torch.no_grad():
        saved = tiny_model.model.layers[1].self_attn.k_proj.weight.clone()
        tiny_model.model.layers[1].self_attn.k_proj.weight.fill_(float("inf"))
    try:
        with pytest.raises(NonFiniteError):
            prefill(tiny_model, torch.randint(0, 97, (1, 30)), CakeConfig(budget=16, window=4))
    finally:
        with torch.no_grad():
            tiny_model.model.layers[1].self_attn.k_proj.weight.copy_(saved)


def test_batch_larger_than_one_is_refused(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    with pytest.raises(ValueError, match="batch size 2"):
        prefill(tiny_model, torch.randint(0, 97, (2, 30)), CakeConfig(budget=16, window=4))


def test_tiny_prompts_and_budgets(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    for n, budget, window in [(1, 1, 1), (2, 1, 1), (2, 2, 1), (3, 1, 1), (5, 8, 8), (40, 9, 8)]:
        r = generate(
            tiny_model, torch.randint(0, 97, (1, n)), CakeConfig(budget=budget, window=window), max_new_tokens=3
        )
        kept = [row.kept for row in r.layers]
        assert all(k >= 1 for k in kept), (n, budget, window)
        assert len(r.token_ids) == 3


def test_generation_stops_at_the_position_limit(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    limit = tiny_model.config.max_position_embeddings
    tiny_model.config.max_position_embeddings = 40
    try:
        r = generate(tiny_model, torch.randint(0, 97, (1, 36)), CakeConfig(budget=16, window=4), max_new_tokens=10)
        assert r.stop_reason == "max_positions" and len(r.token_ids) == 4
        with pytest.raises(ValueError, match="past the model's 40-position limit"):
            prefill(tiny_model, torch.randint(0, 97, (1, 41)), CakeConfig(budget=16, window=4))
    finally:
        tiny_model.config.max_position_embeddings = limit


@pytest.mark.parametrize(
    "tokens, tail",
    [
        ([7, 1, 2] + [3, 4] * 4, 8),  # "M. M. M. M."
        ([9] * 8, 8),
        ([9] * 7, 0),  # a number's repeated digit is not a loop yet
        ([1, 0, 0, 0, 0, 5], 0),
        ([1, 2, 3] * 3, 0),
        ([8] + [1, 2, 3] * 4, 12),
        (list(range(40)), 0),
        ([], 0),
    ],
)
def test_repeated_tail_finds_loops_of_the_answer_only(tokens, tail):
    assert repeated_tail(tokens) == tail


def test_generation_stops_on_a_loop_with_its_reason(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    forced = [5, 6, 7] + [11, 12] * 10
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(3))
    looped = generate(tiny_model, ids, None, max_new_tokens=len(forced), forced_tokens=forced, stop_on_repetition=True)
    assert looped.stop_reason == "repetition" and list(looped.token_ids) == forced[:11]
    plain = generate(tiny_model, ids, None, max_new_tokens=len(forced), forced_tokens=forced)
    assert plain.stop_reason == "max_new_tokens" and list(plain.token_ids) == forced


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), max_size=40), n=st.integers(1, 4))
def test_answer_ngram_blocking_equals_transformers_on_the_answer(tokens, n):
    """Oracle: transformers' NoRepeatNGramLogitsProcessor run on the answer's tokens alone."""
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    blocker = AnswerNGrams(n)
    for t in tokens:
        blocker.add(t)
    scores = NoRepeatNGramLogitsProcessor(n)(torch.tensor([tokens], dtype=torch.long), torch.zeros(1, 6))
    assert blocker.banned() == sorted(torch.nonzero(scores[0] == float("-inf")).flatten().tolist())


def test_ngram_blocking_lets_the_answer_quote_the_prompt(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(5))
    quote = ids[0, 10:20].tolist()  # ten prompt tokens, fed as the answer
    result = generate(
        tiny_model, ids, None, max_new_tokens=10, forced_tokens=quote, sampling=SamplingConfig(no_repeat_ngram_size=2)
    )
    assert list(result.token_ids) == quote and result.sampling_seconds >= 0
    sampler = Sampler(SamplingConfig(no_repeat_ngram_size=2))
    for t in (4, 7, 4):
        sampler.record(t)
    logits = torch.zeros(1, 97)
    logits[0, 7] = 5.0  # greedy would pick 7 and repeat the bigram (4, 7)
    assert sampler(logits) != 7
