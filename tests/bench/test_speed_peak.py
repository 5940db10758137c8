"""`cake bench speed --peak`: the prefill split adds up to the measured prefill and puts a known delay in the
part it belongs to; the GEMM peak is a best-of-repeats time of the layer's shape."""

from __future__ import annotations

import json
import time

import pytest
import torch

from cake_cli.bench.speed import peak
from cake_cli.bench.speed.peak import (
    attention_flops,
    available_kinds,
    gemm_flops,
    gemm_seconds,
    peak_row,
    split_prefill,
)
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.cache import CakeCache
from cake_cli.engine.cascade import CascadePrefill
from cake_cli.engine.config import CakeConfig
from cake_cli.models.quantize import quantize_model, w8a8_available
from tests.helpers.models import ids_of, tiny_llama

DELAY = 0.15  # seconds slept by one patched module: far above what any part of a tiny 48-token prefill takes


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a thread pool on a loaded machine waits at its barriers: noise far above DELAY
    m = tiny_llama(layers=3)
    use_cake_attention(m, "sdpa")
    split_prefill(m, ids_of(48, 0), None)  # warm-up: the first forward's one-off costs land anywhere
    yield m
    torch.set_num_threads(threads)


def _slowed(module, monkeypatch):
    forward = module.forward

    def slow(*args, **kwargs):
        time.sleep(DELAY)
        return forward(*args, **kwargs)

    monkeypatch.setattr(module, "forward", slow)


@pytest.mark.parametrize("config", [None, CakeConfig(budget=16, window=4)], ids=["full", "cake"])
def test_parts_add_up_to_the_measured_prefill(model, config):
    split = split_prefill(model, ids_of(48, 1), config)
    linear, attention, rest = split.parts
    assert linear + attention + rest == pytest.approx(split.seconds, abs=1e-12)
    assert min(linear, attention, rest) > 0
    # 3 layers x (q, k, v, o, gate, up, down) at 48 rows, and the head at the last row only
    assert split.shapes[(48, 64, 64)] == 3 * 2 and split.shapes[(48, 64, 16)] == 3 * 2
    assert split.shapes[(48, 64, 256)] == 3 * 2 and split.shapes[(48, 256, 64)] == 3
    assert split.shapes[(1, 64, 97)] == 1
    assert split.attention == ((48, 48),) * 3
    assert (split.eviction_seconds > 0) == (config is not None)


@pytest.mark.parametrize(
    "where, part",
    [("linear", 0), ("attention", 1), ("rest", 2)],
)
def test_a_delay_lands_in_its_own_part(model, monkeypatch, where, part):
    layer = model.model.layers[1]
    if where == "linear":
        _slowed(layer.self_attn.k_proj, monkeypatch)  # a linear inside attention: linear's, not attention's
    elif where == "attention":  # the cache write of layer 1, inside its attention module
        update = CakeCache.update

        def slow_update(self, key, value, layer_idx, *args, **kwargs):
            if layer_idx == 1:
                time.sleep(DELAY)
            return update(self, key, value, layer_idx, *args, **kwargs)

        monkeypatch.setattr(CakeCache, "update", slow_update)
    else:
        _slowed(layer.post_attention_layernorm, monkeypatch)
    split = split_prefill(model, ids_of(48, 2), None)
    parts = split.parts
    assert parts[part] >= DELAY
    assert all(p < DELAY for i, p in enumerate(parts) if i != part), parts
    assert sum(parts) == pytest.approx(split.seconds, abs=1e-12)


def test_eviction_scoring_is_rest_not_attention(model, monkeypatch):
    after = CascadePrefill.after_attention

    def slow(self, *args, **kwargs):
        start = time.perf_counter()
        time.sleep(DELAY / 3)  # 3 layers: DELAY in all, counted by the cascade's own timer as its scoring
        self.seconds += time.perf_counter() - start
        return after(self, *args, **kwargs)

    monkeypatch.setattr(CascadePrefill, "after_attention", slow)
    split = split_prefill(model, ids_of(48, 3), CakeConfig(budget=16, window=4))
    linear, attention, rest = split.parts
    assert split.eviction_seconds >= DELAY and rest >= DELAY and attention < DELAY


def test_gemm_peak_is_the_best_of_its_repeats_and_counts_flops():
    assert gemm_flops(4, 8, 16) == 2 * 4 * 8 * 16
    # causal: query i sees i + 1 keys; 4 products per (query, key) pair per head dim
    assert attention_flops(3, 3, heads=2, head_dim=5) == 4 * 2 * 5 * (1 + 2 + 3)
    assert attention_flops(2, 5, heads=1, head_dim=1) == 4 * (2 * 3 + 3)
    for kind in available_kinds():
        seconds = gemm_seconds(64, 128, 96, kind, repeats=2)
        assert 0 < seconds < 1
    with pytest.raises(ValueError, match="unknown GEMM kind"):
        gemm_seconds(4, 4, 4, "float16")


def test_peak_row_sets_each_part_against_its_peak(model):
    row = peak_row(model, "tiny", ids_of(40, 4), None, "full", kinds=("float32",), repeats=1)
    assert row.linear_seconds + row.attention_seconds + row.rest_seconds == pytest.approx(row.prefill_seconds)
    assert row.dtype == "float32" and set(row.peaks) == {"float32"} and row.threads == torch.get_num_threads()
    assert row.linear_peak_gflops == row.peaks["float32"] > 0
    assert 0 < row.linear_of_peak and 0 < row.attention_of_peak and 0 < row.prefill_of_peak
    assert row.linear_gflops == pytest.approx(row.linear_of_peak * row.linear_peak_gflops)


@pytest.mark.skipif(not w8a8_available(), reason="torch built without the fbgemm engine (w8a8)")
def test_w8a8_integer_prefill_calls_are_set_against_the_int8_peak(monkeypatch):
    """A w8a8 model's prefill: its integer calls are counted apart (not the down projections, which stay
    int8 dequantized, nor the head's one-row call), and the linear peak sums each call at its own kind's
    time (here made 1 s a call in float32, 0.25 s in int8)."""
    m = tiny_llama(layers=3)
    quantize_model(m, "w8a8")
    use_cake_attention(m, "sdpa")
    split = split_prefill(m, ids_of(48, 5), None)
    assert split.int8_shapes == {(48, 64, 64): 6, (48, 64, 16): 6, (48, 64, 256): 6}
    assert split.shapes[(48, 256, 64)] == 3 and split.shapes[(1, 64, 97)] == 1
    monkeypatch.setattr(peak, "gemm_seconds", lambda t, i, o, kind, repeats=1: 0.25 if kind == "int8" else 1.0)
    row = peak_row(m, "tiny", ids_of(48, 5), None, "full", kinds=("float32", "int8"), repeats=1)
    flops = sum(gemm_flops(*shape) * calls for shape, calls in split.shapes.items())
    calls = sum(split.shapes.values())
    assert row.linear_peak_gflops == pytest.approx(flops / ((calls - 18) * 1.0 + 18 * 0.25) / 1e9)
    assert row.peaks["float32"] == pytest.approx(flops / calls / 1e9)
    assert row.peaks["int8"] == pytest.approx(flops / (calls * 0.25) / 1e9)


def test_bench_speed_peak_prints_the_split_and_its_json(cli_env):
    from cake_cli.cli.main import app
    from tests.helpers.cli import runner

    args = ["bench", "speed", "-m", "tiny-test", "-b", "32", "--lengths", "120", "--repeats", "1"]
    args += ["--new-tokens", "3", "--methods", "full,cake", "--cli-tasks", "", "--peak"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["peak"]
    assert [(r["tokens"], r["method"]) for r in rows] == [(120, "full"), (120, "cake")]
    for r in rows:
        parts = r["linear_seconds"] + r["attention_seconds"] + r["rest_seconds"]
        assert parts == pytest.approx(r["prefill_seconds"])
        assert r["peaks"]["float32"] > 0 and set(r["peaks"]) >= {"float32"}
        assert r["linear_of_peak"] == pytest.approx(r["linear_gflops"] / r["linear_peak_gflops"])
    assert rows[0]["eviction_seconds"] == 0 < rows[1]["eviction_seconds"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.stderr
    assert "prefill against the peak" in table.stdout and "GEMM peak at the linear layers' own shapes" in table.stdout


def test_bench_speed_select_times_the_selection_beside_the_qa_rows(cli_env):
    from cake_cli.cli.main import app
    from tests.helpers.cli import runner

    args = ["bench", "speed", "-m", "tiny-test", "-b", "32", "--lengths", "120", "--repeats", "1", "--new-tokens", "3"]
    args += ["--methods", "full,cake", "--cli-tasks", "qa", "--cli-length", "300", "--select", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    rows = [r for r in json.loads(result.stdout)["rows"] if r["group"].endswith("cli qa")]
    assert [r["method"] for r in rows] == ["full", "cake", "cake-select"]
    assert len({r["length"] for r in rows}) == 1  # the same prompt: the selection's row is paired with full's
    assert rows[2]["prefill_vs_full"] > 0 and rows[2]["kv_bytes_kept"] == rows[1]["kv_bytes_kept"]
