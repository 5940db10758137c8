"""`CakeConfig.rank_layer`: the layers below R keep the tokens layer R's indicator ranks highest."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.cascade import CascadePrefill
from cake_cli.engine.config import CakeConfig, ConfigError
from cake_cli.engine.generate import prefill
from cake_cli.engine.indicators import shared_ranking
from tests.helpers.models import ids_of, kept_per_layer
from tests.helpers.oracles import check_eviction, check_replay


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_rank_layer_must_be_a_layer_index(bad):
    with pytest.raises(ConfigError) as exc:
        CakeConfig(budget=64, rank_layer=bad)
    assert exc.value.field == "rank_layer"


def test_a_rank_layer_past_the_model_is_refused():
    with pytest.raises(ValueError, match="rank_layer 4 is not a global"):
        CascadePrefill(CakeConfig(budget=16, window=4, rank_layer=4), 4, 100)
    with pytest.raises(ValueError, match="rank_layer 1 is not a global"):
        CascadePrefill(CakeConfig(budget=16, window=4, rank_layer=1), 4, 100, windows=[None, 8, None, None])


def test_shared_ranking_is_the_mean_of_each_heads_normalised_scores():
    scores = torch.tensor([[1.0, 3.0, 0.0, 4.0], [2.0, 2.0, 4.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    got = shared_ranking(scores)
    want = (torch.tensor([0.125, 0.375, 0.0, 0.5]) + torch.tensor([0.25, 0.25, 0.5, 0.0])) / 3
    assert got.shape == scores.shape
    for row in got:
        torch.testing.assert_close(row, want)


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("indicator", ["cake", "chunk"])
def test_the_prefill_and_decode_match_the_masking_reference(tiny_model, rank, indicator):
    """Slow oracle: the reference ranks the layers below R by R's heads' normalised scores (float64, pure
    Python); budgets, kept positions and every decode step's logits agree, and the kept tokens differ from
    the method without it (layers from R on keep theirs)."""
    ids = ids_of(70, 5)
    config = CakeConfig(budget=24, window=8, tau1=0.7, tau2=1.5, indicator=indicator, chunk=3, rank_layer=rank)
    check_eviction(tiny_model, ids, config, new=5, backend="sdpa")
    state = prefill(tiny_model, ids, config)
    plain = prefill(tiny_model, ids, replace(config, rank_layer=None))
    assert state.cascade.final_budgets == plain.cascade.final_budgets  # the allocation is unchanged
    assert kept_per_layer(state)[rank:] == kept_per_layer(plain)[rank:]
    assert kept_per_layer(state)[:rank] != kept_per_layer(plain)[:rank]
    for layer in kept_per_layer(state)[:rank]:
        assert all(head == layer[0] for head in layer)  # one ranking for every KV head


def test_a_replay_with_rank_layer_equals_the_live_prefill(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    ids = ids_of(80, 7)
    config = CakeConfig(budget=24, window=8, tau1=0.7, tau2=1.5, rank_layer=2)
    check_replay(tiny_model, ids, config)


def test_the_layers_below_wait_so_the_prefill_peak_grows(tiny_model):
    """The layers below R hold the whole prompt until R has attended: a higher peak, the same kept bytes."""
    use_cake_attention(tiny_model, "sdpa")
    ids = ids_of(90, 2)
    config = CakeConfig(budget=24, window=8)
    plain = prefill(tiny_model, ids, config)
    ranked = prefill(tiny_model, ids, replace(config, rank_layer=3))
    assert ranked.kv_bytes == plain.kv_bytes
    assert ranked.peak_bytes > plain.peak_bytes


def test_the_bench_names_a_ranked_variant_name_at_rank_l():
    from cake_cli.bench.suites import parse_variants
    from cake_cli.errors import UsageError

    named = parse_variants("full,cake-chunk@rank:9,cake@rank:3,cake-chunk:20@rank:5")
    assert [(v.name, v.indicator, v.chunk, v.rank_layer) for v in named] == [
        ("full", None, None, None),
        ("cake-chunk@rank:9", "chunk", None, 9),
        ("cake@rank:3", "cake", None, 3),
        ("cake-chunk:20@rank:5", "chunk", 20, 5),
    ]
    config = named[3].config(CakeConfig(budget=64))
    assert (config.indicator, config.chunk, config.rank_layer) == ("chunk", 20, 5)
    assert named[0].config(CakeConfig(budget=64)) is None
    for bad, message in (("cake@rank:x", "must be a whole number"), ("full@rank:3", "a method with a budget")):
        with pytest.raises(UsageError, match=message):
            parse_variants(bad)
