"""Reconstruction scoring (`engine.reconstruct`, KVzip's max attention from a teacher-forced repeat of the
document, with CAKE's H_l, V_l, P_l over those rows) against an eager reference that materializes the
full attention of every reconstruction chunk with the model's own attention (`output_attentions`)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from cake_cli.engine import allocation, reconstruct
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.families import attention_layout
from cake_cli.engine.generate import prefill
from cake_cli.engine.preference import log_preference
from cake_cli.engine.reconstruct import compress_by_reconstruction, reconstruction_scores
from tests.helpers.models import cached_models, ids_of, tiny_llama

CASES = {"llama": ("llama", {}), "qwen3": ("qwen3", {}), "gemma2": ("gemma2", {})}  # gemma2: soft-cap, local layers
model = cached_models(CASES)


@torch.inference_mode()
def reference(m, prefix, repeat, target, chunk: int, window: int, tau1: float = 1.0, tau2: float = 1.0, stride=1):
    """Per global layer: (S [H_kv, n], H_l, V_l, log P_l) from the model's own eager attention weights of
    every chunk (`repeat + piece` over a copy of the prefix's plain cache), rows as the engine defines them:
    the repeat prompt's rows once (chunk 0), every target row; the statistics over rows 0, s, 2s, ... of
    them; float64 sums, torch.var."""
    m.set_attn_implementation("eager")
    cache = DynamicCache(config=m.config)
    m(prefix, cache=cache, use_cache=True)
    n, p = prefix.shape[1], repeat.shape[1]
    layers = [i for i, w in enumerate(attention_layout(m.config).windows) if w is None]
    rows = {i: [] for i in layers}
    for k, start in enumerate(range(0, target.shape[1], chunk)):
        ids = torch.cat([repeat, target[:, start : start + chunk]], dim=1)
        out = m(ids, cache=copy.deepcopy(cache), use_cache=True, output_attentions=True)
        for i in layers:
            a = out.attentions[i][0].float()  # [H, q, n + q]: the full attention of this chunk
            rows[i].append(a[:, p if k else 0 :, :n])
    num_kv = m.config.num_key_value_heads
    result = {}
    for i in layers:
        a = torch.cat(rows[i], dim=1)  # [H, R, n]
        heads, r, _ = a.shape
        score = a.reshape(num_kv, heads // num_kv * r, n).amax(dim=1)  # [H_kv, n]
        ev = a[:, ::stride, : n - window].double()
        h = float(torch.special.entr(ev).sum())
        v = float(ev.var(dim=1, unbiased=True).sum())
        result[i] = (score, h, v, log_preference(h, v, tau1, tau2))
    return result


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("chunk", [12, 100])  # three chunks; one chunk = the whole reconstruction prompt
def test_scores_equal_the_eager_reference(case, chunk):
    m, (prefix, repeat, target) = model(case), (ids_of(40, 1), ids_of(5, 2), ids_of(30, 3))
    config = CakeConfig(budget=16, window=6, tau1=0.7, tau2=1.3)
    want = reference(m, prefix, repeat, target, chunk, 6, 0.7, 1.3)
    use_cake_attention(m, "sdpa")
    state = prefill(m, prefix, None)
    keys = [layer.keys.clone() for layer in state.cache.layers]
    rec = reconstruction_scores(m, state.cache, repeat, target, config, chunk=chunk)
    assert rec.rows == 35 and rec.chunks == (3 if chunk == 12 else 1)
    assert [i for i, s in enumerate(rec.scores) if s is not None] == sorted(want)
    for i, (score, h, v, log_p) in want.items():
        torch.testing.assert_close(rec.scores[i], score, atol=2e-6, rtol=1e-5, msg=f"layer {i}")
        stats = rec.stats[i]
        assert stats.dispersion == pytest.approx(h, rel=1e-5) and stats.shift == pytest.approx(v, rel=1e-4)
        assert stats.log_preference == pytest.approx(log_p, rel=1e-4, abs=1e-4)
    for layer, before in zip(state.cache.layers, keys):  # the prefix cache is left as it was
        assert layer.seen == 40 and torch.equal(layer.keys, before)


def test_statistics_over_every_sth_row_equal_the_reference(monkeypatch):
    m, (prefix, repeat, target) = model("qwen3"), (ids_of(40, 7), ids_of(5, 8), ids_of(30, 9))
    monkeypatch.setattr(reconstruct, "STAT_ROWS", 8)  # 35 rows: every 5th is a statistic row
    assert reconstruct.stat_stride(35) == 5 and reconstruct.stat_stride(8) == 1
    config = CakeConfig(budget=16, window=6, tau1=0.7, tau2=1.3)
    want = reference(m, prefix, repeat, target, 12, 6, 0.7, 1.3, stride=5)
    use_cake_attention(m, "sdpa")
    rec = reconstruction_scores(m, prefill(m, prefix, None).cache, repeat, target, config, chunk=12)
    for i, (score, h, v, log_p) in want.items():
        torch.testing.assert_close(rec.scores[i], score, atol=2e-6, rtol=1e-5, msg=f"layer {i}")
        stats = rec.stats[i]
        assert stats.dispersion == pytest.approx(h, rel=1e-5) and stats.shift == pytest.approx(v, rel=1e-4)
        assert stats.log_preference == pytest.approx(log_p, rel=1e-4, abs=1e-4)


def test_row_blocks_do_not_change_the_scores(monkeypatch):
    m, (prefix, repeat, target) = model("llama"), (ids_of(50, 4), ids_of(4, 5), ids_of(20, 6))
    config = CakeConfig(budget=16, window=4)
    use_cake_attention(m, "sdpa")
    state = prefill(m, prefix, None)
    whole = reconstruction_scores(m, state.cache, repeat, target, config, chunk=8)
    monkeypatch.setattr(reconstruct, "MAX_BLOCK_ELEMENTS", 8 * 60)  # one row per block
    blocks = reconstruction_scores(m, state.cache, repeat, target, config, chunk=8)
    for a, b in zip(whole.scores, blocks.scores):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)
    assert [s.dispersion for s in whole.stats] == pytest.approx([s.dispersion for s in blocks.stats], rel=1e-9)


@pytest.mark.parametrize("case", ["llama", "gemma2"])
@pytest.mark.parametrize("alloc", ["cake", "uniform"])
def test_eviction_keeps_the_top_pairs_by_the_reference_scores(case, alloc):
    m, (prefix, repeat, target) = model(case), (ids_of(60, 7), ids_of(5, 8), ids_of(40, 9))
    config = CakeConfig(budget=20, window=6, allocation=alloc)
    want = reference(m, prefix, repeat, target, 16, 6)
    use_cake_attention(m, "sdpa")
    state = compress_by_reconstruction(m, prefix, repeat, target, config, chunk=16)
    layers = sorted(want)
    total = config.evictable_total(len(layers))
    if alloc == "cake":
        budgets = allocation.allocate([want[i][3] for i in layers], total, 54)
        assert len(set(budgets)) > 1, "CAKE's shares differ across layers on this model"
    else:
        budgets = allocation.uniform(len(layers), total, 54)
    assert [state.cascade.final_budgets[i] for i in layers] == budgets and state.cascade.evicting
    for i, budget in zip(layers, budgets):
        order = want[i][0][:, :54].sort(dim=-1, descending=True, stable=True).indices[:, :budget]
        expected = torch.cat([order.sort(dim=-1).values, torch.arange(54, 60).expand(order.shape[0], 6)], dim=-1)
        assert torch.equal(state.cache.layers[i].positions, expected), f"layer {i}"
        assert state.lengths[i] == budget + 6
    for i, w in enumerate(state.cache.windows):
        if w is not None:  # a local layer keeps its native window, no budget
            assert state.cascade.final_budgets[i] is None and state.lengths[i] == w - 1
    assert state.kv_bytes < state.cache.full_bytes and state.peak_bytes >= state.cache.full_bytes


def test_nothing_is_evicted_when_the_prefix_fits_and_bad_input_is_refused():
    m, prefix = model("llama"), ids_of(30, 10)
    use_cake_attention(m, "sdpa")
    state = compress_by_reconstruction(m, prefix, ids_of(3, 11), ids_of(10, 12), CakeConfig(budget=32, window=4))
    assert not state.cascade.evicting and state.lengths == [30] * 4 and state.cascade.stats[0] is not None
    with pytest.raises(ValueError, match="no room"):
        reconstruction_scores(m, state.cache, ids_of(3, 11), ids_of(0, 12), CakeConfig(budget=32, window=4))
    short = tiny_llama(layers=2)
    short.config.max_position_embeddings = 34  # the prefix and the prompt leave no position for a chunk
    use_cake_attention(short, "sdpa")
    with pytest.raises(ValueError, match="no room"):
        compress_by_reconstruction(short, prefix, ids_of(4, 11), ids_of(10, 12), CakeConfig(budget=16, window=4))
