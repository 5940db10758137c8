"""Fact survival: the kept-index arithmetic against a set-based reference, on hand-built and on
replayed evictions; the facts' token spans in a real prompt."""

from __future__ import annotations

import random

import pytest
import torch

from cake_cli.bench.survival import (
    cache_positions,
    fact_survival,
    fact_token_spans,
    survival_by_layer,
    survival_summary,
)
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.methods import with_method
from cake_cli.engine.replay import record, replay
from cake_cli.tasks.templates import build_prompt, load_template
from tests.helpers.tiny import build_tiny_tokenizer


def reference(layer_positions, spans):
    """Per layer, per fact: the mean over heads of |kept ∩ span| / |span|, with Python sets."""
    out = []
    for positions in layer_positions:
        row = []
        for start, end in spans:
            wanted = set(range(start, end))
            shares = [len(wanted & set(head)) / len(wanted) for head in positions.tolist()]
            row.append(round(sum(shares) / len(shares), 4))
        out.append(row)
    return out


def test_a_hand_built_eviction():
    layer0 = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])  # [H_kv=2, k=4]
    layer1 = torch.tensor([[9, 2, 3, 4], [3, 4, 2, 0]])  # kept in any order
    got = fact_survival([layer0, layer1, None], [(2, 5), (8, 10), None])
    assert got == [[0.5, 0.0, None], [1.0, 0.25, None], [None, None, None]]


@pytest.mark.parametrize("seed", range(5))
def test_random_evictions_against_the_reference(seed):
    rng = random.Random(seed)
    n, heads = rng.randint(20, 90), rng.randint(1, 4)
    layers = []
    for _ in range(rng.randint(1, 5)):
        k = rng.randint(1, n)
        layers.append(torch.tensor([rng.sample(range(n), k) for _ in range(heads)]))
    spans = []
    for _ in range(rng.randint(1, 4)):
        start = rng.randrange(n - 1)
        spans.append((start, rng.randint(start + 1, n)))
    assert fact_survival(layers, spans) == reference(layers, spans)


def test_on_a_replayed_eviction(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    ids = torch.randint(0, 97, (1, 80), generator=torch.Generator().manual_seed(4))
    rec = record(tiny_model, ids, window=6)
    spans = [(10, 16), (40, 43), (70, 72)]
    full = replay(rec, None)
    assert all(v == 1.0 for row in fact_survival(cache_positions(full.cache), spans) for v in row)
    for method in ("cake", "snapkv", "streamingllm"):
        state = replay(rec, with_method(CakeConfig(budget=24, window=6), method))
        positions = cache_positions(state.cache)
        got = fact_survival(positions, spans)
        assert got == reference(positions, spans)
        assert len(got) == len(state.cache.layers)
        if method == "streamingllm":  # sinks + the recent tokens only: the middle fact is gone everywhere
            assert all(row[1] == 0.0 for row in got)


def test_fact_spans_in_a_chat_prompt():
    tok = build_tiny_tokenizer()
    facts = ["The access code of the Ashwick archive is 51234.", "The keeper of the Lumgate museum is Yara Pellberg."]
    document = "Some text before. " * 30 + facts[0] + " More text here. " * 30 + facts[1] + " The end."
    offsets = [document.index(f) for f in facts]
    template = load_template("bench_needle")
    ids = list(build_prompt(tok, template, document, max_prompt_tokens=10**6, question="Who?").input_ids)
    spans = fact_token_spans(tok, ids, document, offsets, facts)
    for fact, (start, end) in zip(facts, spans):
        inner = tok.decode(ids[start:end])
        assert inner.strip() and inner.strip() in fact and len(inner) >= len(fact) - 12
    assert spans[0][1] <= spans[1][0]
    assert fact_token_spans(tok, ids[:20], document, offsets, facts) == [None, None]  # not in those tokens
    with pytest.raises(ValueError, match="offsets"):
        fact_token_spans(tok, ids, document, offsets, facts[:1])


def test_the_summaries():
    rows = [
        {"method": "cake", "budget": 64, "survival": [[1.0, 0.5], [1.0, 0.0]]},
        {"method": "cake", "budget": 64, "survival": [[1.0, None], [0.5, None]]},
        {"method": "full", "budget": None, "survival": [[1.0], [1.0]]},
        {"method": "snapkv", "budget": 64},
    ]
    table = survival_summary(rows)
    assert set(table) == {("cake", 64)}
    mean, whole = table[("cake", 64)]
    assert mean == pytest.approx((1.0 + 0.25 + 0.75) / 3) and whole == pytest.approx(1 / 3)
    assert survival_by_layer(rows, "cake", 64) == pytest.approx([2.5 / 3, 1.5 / 3])
