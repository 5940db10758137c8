"""The `chunk` indicator and the `cake-chunk` method: CAKE's score averaged over fixed chunks of positions."""

from __future__ import annotations

import pytest
import torch

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig, ConfigError
from cake_cli.engine.generate import prefill
from cake_cli.engine.indicators import chunk_means, token_scores, top_k_sorted
from cake_cli.engine.methods import METHODS, label, resolve, with_method
from tests.helpers.oracles import check_eviction
from tests.helpers.reference import MaskedReference
from tests.helpers.reference import chunk_means as slow_chunk_means


def window(heads: int, q: int, m: int, seed: int) -> torch.Tensor:
    """[H, q, m] rows of random attention (each row sums to 1)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(heads, q, m, generator=gen).softmax(dim=-1)


def scores_of(kind, a, positions, kv, chunk=None, pool=("avg", 5)):
    return token_scores(kind, a, positions, kv, gamma=200.0, pool=pool, chunk=chunk)


def held_positions(kv: int, m: int, seed: int, ordered: bool = True) -> torch.Tensor:
    """[H_kv, m] distinct positions with gaps, as a decoding layer holds after evictions."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(4 * m, generator=gen)[:m] for _ in range(kv)]
    rows = [r.sort().values if ordered else r for r in rows]
    return torch.stack(rows)


def slow_rows(scores: torch.Tensor, positions: torch.Tensor, chunk: int) -> torch.Tensor:
    rows = [slow_chunk_means(s.tolist(), p.tolist(), chunk) for s, p in zip(scores, positions)]
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("chunk", [2, 3, 10])
@pytest.mark.parametrize("layout", ["prefill", "decode", "unordered", "none"])
def test_chunk_means_equal_a_slow_loop(chunk, layout):
    kv, m = 3, 57
    scores = torch.rand(kv, m, generator=torch.Generator().manual_seed(chunk))
    positions = {
        "prefill": torch.arange(m).expand(kv, m),
        "decode": held_positions(kv, m, seed=chunk),
        "unordered": held_positions(kv, m, seed=chunk, ordered=False),
        "none": None,
    }[layout]
    got = chunk_means(scores, positions, chunk)
    want = slow_rows(scores.double(), torch.arange(m).expand(kv, m) if positions is None else positions, chunk)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=0)
    ids = (torch.arange(m).expand(kv, m) if positions is None else positions) // chunk
    for h in range(kv):  # every token of a chunk has the very same score
        for c in ids[h].unique():
            assert got[h, ids[h] == c].unique().numel() == 1
    assert any(got[h, ids[h] == c].numel() > 1 for h in range(kv) for c in ids[h].unique())  # chunks were shared


def test_decode_chunks_average_the_held_tokens_only():
    scores = torch.tensor([[1.0, 2.0, 4.0, 8.0, 16.0]])
    positions = torch.tensor([[0, 3, 10, 11, 25]])  # chunks of 10: {0, 3}, {10, 11}, {25}
    assert chunk_means(scores, positions, 10).tolist() == [[1.5, 1.5, 6.0, 6.0, 16.0]]


@pytest.mark.parametrize("pool", [("avg", 5), ("max", 3)])
def test_chunk_is_the_cake_indicator_then_chunk_means(pool):
    a, kv, m = window(8, 6, 90, seed=1), 2, 90
    positions = torch.arange(m).expand(kv, m)
    cake = scores_of("cake", a, positions, kv, pool=pool)
    got = scores_of("chunk", a, positions, kv, chunk=7, pool=pool)
    torch.testing.assert_close(got.double(), slow_rows(cake.double(), positions, 7), atol=1e-6, rtol=0)


@pytest.mark.parametrize("pool", [("avg", 5), ("max", 3), ("avg", 1)])
def test_chunk_of_one_is_the_cake_indicator_exactly(pool):
    a, kv = window(8, 6, 64, seed=2), 2
    positions = held_positions(kv, 64, seed=3)
    assert torch.equal(
        scores_of("chunk", a, positions, kv, chunk=1, pool=pool), scores_of("cake", a, positions, kv, pool=pool)
    )


def test_the_chunk_indicator_needs_its_size():
    a = window(2, 3, 20, seed=4)
    with pytest.raises(ValueError, match="chunk size"):
        scores_of("chunk", a, torch.arange(20).expand(1, 20), 1)
    with pytest.raises(ValueError, match="at least 1"):
        chunk_means(torch.zeros(1, 4), None, 0)


@pytest.mark.parametrize("chunk", [4, 10])
def test_prefill_keeps_whole_chunks_and_at_most_one_partial(chunk):
    kv, m = 2, 203  # the last chunk is short (203 = 20 · 10 + 3)
    a = window(8, 8, m, seed=chunk)
    positions = torch.arange(m).expand(kv, m)
    scores = scores_of("chunk", a, positions, kv, chunk=chunk)
    for k in (1, chunk - 1, chunk, 37, 100, m - 1):
        kept = top_k_sorted(scores, k)
        for h in range(kv):
            ids = positions[h, kept[h]] // chunk
            partial = [
                c for c in ids.unique().tolist() if (ids == c).sum() < min(chunk, m - c * chunk)
            ]  # kept tokens fewer than its chunk holds
            assert len(partial) <= 1, (k, h, partial)
            if partial:  # the partial chunk is the lowest-scoring kept one, cut at its earliest tokens
                c = partial[0]
                members = positions[h][positions[h] // chunk == c]
                assert positions[h, kept[h]][ids == c].tolist() == members[: int((ids == c).sum())].tolist()
                assert scores[h, c * chunk] == scores[h, kept[h]].min()


@pytest.mark.parametrize("layout", ["prefill", "decode"])
def test_selecting_from_a_kept_subset_is_the_top_k_of_the_row(layout):
    """Thm. 1 for chunk scores: top-k of a kept top-k' subset (in index order) = top-k of the full row."""
    kv, m, chunk = 2, 160, 10
    a = window(8, 8, m, seed=5)
    positions = torch.arange(m).expand(kv, m) if layout == "prefill" else held_positions(kv, m, seed=6)
    scores = scores_of("chunk", a, positions, kv, chunk=chunk)
    for k_wide in (150, 95, 64, 33):
        subset = top_k_sorted(scores, k_wide)  # [H_kv, k'] ascending, as the cascade keeps them
        for k in (k_wide, k_wide - 1, 41, 20, 5, 0):
            if k > k_wide:
                continue
            again = subset.gather(1, top_k_sorted(scores.gather(1, subset), k))
            assert torch.equal(again, top_k_sorted(scores, k)), (k_wide, k)


def prompt(n: int, vocab: int = 97, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def test_the_cascade_keeps_the_one_shot_top_k_of_the_slow_chunk_indicator(tiny_model):
    """Thm. 1 on a model: the cascade's kept positions = one-shot top-k of the masking reference's chunk scores."""
    ids = prompt(90)
    config = CakeConfig(budget=24, window=8, indicator="chunk", chunk=4)
    use_cake_attention(tiny_model, "sdpa")
    state = prefill(tiny_model, ids, config)
    reference = MaskedReference(tiny_model, config)
    reference.run(ids, [])
    budgets = state.cascade.final_budgets
    assert len(set(budgets)) > 1  # CAKE's layer budgets, not uniform
    assert sum(budgets) == config.evictable_total(len(budgets))
    for layer, budget in enumerate(budgets):
        kept = state.cache.layers[layer].positions
        for kv, scores in enumerate(reference.indicators[layer]):
            want = sorted(sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:budget]) + list(range(82, 90))
            assert kept[kv].tolist() == want, f"layer {layer} head {kv}"


def test_cake_chunk_keeps_cakes_budgets_and_chunk_one_keeps_cakes_tokens(tiny_model):
    ids = prompt(120, seed=2)
    use_cake_attention(tiny_model, "sdpa")
    cake = prefill(tiny_model, ids, CakeConfig(budget=32, window=8))
    chunked = prefill(tiny_model, ids, CakeConfig(budget=32, window=8, indicator="chunk", chunk=10))
    single = prefill(tiny_model, ids, CakeConfig(budget=32, window=8, indicator="chunk", chunk=1))
    assert chunked.cascade.final_budgets == cake.cascade.final_budgets  # Eq. 9-10 read no indicator
    for a, b in zip(single.cache.layers, cake.cache.layers):
        assert torch.equal(a.positions, b.positions)
    assert any(not torch.equal(a.positions, b.positions) for a, b in zip(chunked.cache.layers, cake.cache.layers))


@pytest.mark.parametrize("policy", ["fixed", "grow"])
def test_cake_chunk_generation_equals_the_masking_reference(tiny_model, policy):
    """Prefill and every decode step (fixed: the chunk means over the held positions) against the slow reference."""
    config = CakeConfig(budget=24, window=8, indicator="chunk", chunk=3, decode_policy=policy)
    result, _ = check_eviction(tiny_model, prompt(70, seed=3), config, new=6, backend="sdpa")
    assert result.token_ids


def test_cake_chunk_is_a_method_with_cakes_allocation():
    assert METHODS["cake-chunk"] == ("cake", "chunk")
    assert resolve("cake-chunk") == ("cake", "chunk")
    assert label("cake", "chunk") == "cake-chunk"
    config = with_method(CakeConfig(budget=64), "cake-chunk")
    assert (config.allocation, config.indicator, config.chunk) == ("cake", "chunk", 10)


@pytest.mark.parametrize("chunk", [0, -3, 2.5, True])
def test_config_rejects_a_chunk_below_one_token(chunk):
    with pytest.raises(ConfigError, match="chunk") as info:
        CakeConfig(budget=64, chunk=chunk)
    assert info.value.field == "chunk"
