"""Record once + replay each method's eviction == the live prefill of that method."""

from __future__ import annotations

import pytest
import torch

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.families import attention_layout
from cake_cli.engine.generate import decode, prefill
from cake_cli.engine.methods import METHODS, with_method
from cake_cli.engine.replay import prefix_cache, record, replay
from tests.helpers.models import tiny_family

_gemma: list = []


@pytest.fixture(params=["llama", "gemma3"])
def replay_model(request, tiny_model):
    """The tiny Llama, and a tiny Gemma 3 (local layers: 0, 1, 3, 4 keep their 8-token window)."""
    if request.param == "llama":
        return tiny_model
    if not _gemma:
        _gemma.append(tiny_family("gemma3_text", layers=6))
    return _gemma[0]


@pytest.mark.parametrize("method", list(METHODS))
def test_replay_equals_live_prefill_and_decode(replay_model, method):
    tiny_model = replay_model
    use_cake_attention(tiny_model, "sdpa")
    ids = torch.randint(0, 97, (1, 80), generator=torch.Generator().manual_seed(3))
    config = with_method(CakeConfig(budget=24, window=6, tau1=0.7, tau2=1.5), method)
    rec = record(tiny_model, ids, window=6)
    live = prefill(tiny_model, ids, config)
    again = replay(rec, config)
    assert again.lengths == live.lengths
    for a, b in zip(again.cache.layers, live.cache.layers):
        assert torch.equal(a.positions, b.positions)
        torch.testing.assert_close(a.keys, b.keys, atol=1e-6, rtol=0)
    if config is not None:
        assert again.cascade.final_budgets == live.cascade.final_budgets
    live_logits, replay_logits = [], []
    r1 = decode(tiny_model, ids, live, config, max_new_tokens=6, step_logits=live_logits)
    r2 = decode(tiny_model, ids, again, config, max_new_tokens=6, step_logits=replay_logits)
    assert r1.token_ids == r2.token_ids
    for x, y in zip(live_logits, replay_logits):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)
    # the recording itself is untouched by replays and decoding
    windows = attention_layout(tiny_model.config).windows
    assert rec.cache.lengths() == [80 if w is None else w - 1 for w in windows]


@pytest.mark.parametrize("method", ["cake", "snapkv", "pyramidkv"])
def test_a_recording_on_a_shared_prefix_equals_the_whole_prompts(tiny_model, method):
    use_cake_attention(tiny_model, "sdpa")
    gen = torch.Generator().manual_seed(5)
    document = torch.randint(0, 97, (1, 70), generator=gen)
    config = with_method(CakeConfig(budget=20, window=6, tau1=0.7, tau2=1.5), method)
    shared = prefix_cache(tiny_model, document)
    for question_len in (3, 11):  # shorter and longer than the window: the window spans the prefix's end
        ids = torch.cat([document, torch.randint(0, 97, (1, question_len), generator=gen)], dim=1)
        whole, part = (
            record(tiny_model, ids, 6, accumulate=False),
            record(tiny_model, ids, 6, accumulate=False, prefix=shared),
        )
        torch.testing.assert_close(part.logits, whole.logits, atol=1e-5, rtol=0)
        for a, b in zip(part.attention, whole.attention):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        x, y = replay(part, config), replay(whole, config)
        assert x.lengths == y.lengths and x.cascade.final_budgets == y.cascade.final_budgets
        for a, b in zip(x.cache.layers, y.cache.layers):
            assert torch.equal(a.positions, b.positions)
            torch.testing.assert_close(a.keys, b.keys, atol=1e-6, rtol=0)
    assert shared.lengths() == [70] * len(shared.layers)  # the shared prefix is left as it was


def test_a_shared_prefix_is_refused_where_it_would_be_wrong(tiny_model):
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(6))
    shared = prefix_cache(tiny_model, ids[:, :30])
    with pytest.raises(ValueError, match="accumulate=False"):
        record(tiny_model, ids, 6, prefix=shared)  # H2O's accumulation needs the prefix's queries
    with pytest.raises(ValueError, match="longer than the prefix"):
        record(tiny_model, ids[:, :30], 6, accumulate=False, prefix=shared)
    if not _gemma:
        _gemma.append(tiny_family("gemma3_text", layers=6))
    gemma = _gemma[0]
    with pytest.raises(ValueError, match="sliding-window"):
        record(gemma, ids, 6, accumulate=False, prefix=prefix_cache(gemma, ids[:, :30]))
