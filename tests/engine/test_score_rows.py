"""`CakeConfig.score_rows`: the prefill scores with only the observation window's last r query rows."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.cache import CakeCache
from cake_cli.engine.cascade import CascadePrefill
from cake_cli.engine.config import CakeConfig, ConfigError
from cake_cli.engine.generate import prefill
from cake_cli.engine.indicators import token_scores, top_k_sorted
from cake_cli.engine.replay import replay
from tests.helpers.models import ids_of, kept_per_layer
from tests.helpers.oracles import check_eviction, check_replay


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_score_rows_must_be_a_whole_number_at_least_0(bad):
    with pytest.raises(ConfigError) as exc:
        CakeConfig(budget=64, score_rows=bad)
    assert exc.value.field == "score_rows"


def test_scoring_rows_is_min_of_score_rows_and_w_and_w_for_0():
    assert CakeConfig(budget=64, window=32).scoring_rows == 32
    assert CakeConfig(budget=64, window=32, score_rows=12).scoring_rows == 12
    assert CakeConfig(budget=64, window=32, score_rows=32).scoring_rows == 32
    assert CakeConfig(budget=64, window=32, score_rows=500).scoring_rows == 32


@pytest.mark.parametrize("indicator", ["cake", "snapkv"])
def test_all_w_rows_or_more_is_the_papers_method_exactly(tiny_model, indicator):
    use_cake_attention(tiny_model, "sdpa")
    ids = ids_of(90, 1)
    base = CakeConfig(budget=24, window=8, tau1=0.7, tau2=1.5, indicator=indicator)
    plain = prefill(tiny_model, ids, base)
    for rows in (8, 9, 100):
        same = prefill(tiny_model, ids, replace(base, score_rows=rows))
        assert kept_per_layer(same) == kept_per_layer(plain)
        assert same.cascade.final_budgets == plain.cascade.final_budgets
        assert same.cascade.stats == plain.cascade.stats


def observed(config: CakeConfig, a: torch.Tensor, num_kv: int) -> CascadePrefill:
    """One global layer's statistics and indicator from window attention a [H, q, n] (nothing evicted yet)."""
    n = a.shape[-1]
    cache = CakeCache(1)
    cascade = CascadePrefill(config, 1, n)
    cascade.evicting = False  # statistics only; the indicator is computed below
    cascade.observe(cache, 0, a, num_kv)
    return cascade


@pytest.mark.parametrize("rows", [1, 3, 5])
def test_the_statistics_and_indicator_read_only_the_last_rows(rows):
    """Direct oracle on random attention: r rows of a w-row window = the w-row code on those r rows alone."""
    heads, kv, w, n = 4, 2, 6, 50
    a = torch.rand(heads, w, n, generator=torch.Generator().manual_seed(rows)).softmax(dim=-1)
    config = CakeConfig(budget=20, window=w, score_rows=rows)
    got = observed(config, a, kv).stats[0]
    tail = a[:, -rows:, :]  # [H, r, n]; the evictable columns stay the first n - w
    ev = tail[:, :, : n - w].double()
    entropy = float(-(ev * ev.log()).sum())
    var = ev.var(dim=1, unbiased=True) if rows > 1 else torch.zeros(heads, n - w, dtype=torch.float64)
    assert got.dispersion == pytest.approx(entropy, rel=1e-5)
    assert got.shift == pytest.approx(float(var.sum()), rel=1e-4, abs=1e-9)
    # and the indicator: the one the cake scorer gives the last r rows
    positions = torch.arange(n - w).expand(kv, n - w)
    want = token_scores("cake", tail[:, :, : n - w], positions, kv, gamma=200.0, pool=("avg", 5))
    full = token_scores("cake", a[:, :, : n - w], positions, kv, gamma=200.0, pool=("avg", 5))
    assert not torch.equal(top_k_sorted(want, 10), top_k_sorted(full, 10))  # the rows change the ranking


def test_the_prefill_keeps_the_masking_references_tokens_with_the_last_rows(tiny_model):
    """Slow oracle: the reference scores each column with the last r rows only; budgets, kept positions and
    every decode step's logits agree; and the kept tokens differ from the all-rows method's."""
    ids = ids_of(70, 3)
    config = CakeConfig(budget=24, window=8, score_rows=3)
    result, reference = check_eviction(tiny_model, ids, config, new=5, backend="sdpa")
    state = prefill(tiny_model, ids, config)
    for layer, budget in enumerate(reference.budgets):
        for head, scores in enumerate(reference.indicators[layer]):
            top = sorted(sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:budget])
            assert state.cache.layers[layer].positions[head].tolist() == top + list(range(62, 70))
    plain = prefill(tiny_model, ids, replace(config, score_rows=0))
    assert kept_per_layer(plain) != kept_per_layer(state)


def test_a_replay_with_score_rows_equals_the_live_prefill(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    ids = ids_of(80, 7)
    config = CakeConfig(budget=24, window=8, tau1=0.7, tau2=1.5, score_rows=4)
    rec, again = check_replay(tiny_model, ids, config)
    plain = replay(rec, replace(config, score_rows=0))
    assert kept_per_layer(plain) != kept_per_layer(again)  # the recording replays both
