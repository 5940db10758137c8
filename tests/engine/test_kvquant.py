"""Quantized KV for the .cake file (`engine.kvquant`, KIVI's grouped affine layout): the error bound a
group implies (every value within scale / 2 of its dequantized value) on random tensors, the 4-bit
packing, damaged parts refused, and a cache written at 4 bits and read back answering exactly as the
same cache quantized in process (tiny model)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from cake_cli.engine import kvquant
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.continuation import (
    SavedCascade,
    cache_from_tensors,
    cache_tensors,
    continuation_capacity,
    extend,
    requantized,
)
from cake_cli.engine.generate import Prefilled, decode, prefill


def random_kv(heads: int, length: int, dim: int, seed: int, spread: float = 1.0, offset: float = 0.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(heads, length, dim, generator=gen) * spread + offset
    x[:, :, 0] *= 20  # an outlier channel, as keys have
    return x


@settings(max_examples=40, deadline=None)
@given(
    heads=st.integers(1, 3),
    length=st.integers(1, 70),
    dim=st.integers(1, 20),
    group=st.sampled_from([1, 3, 8, 32]),
    bits=st.sampled_from([8, 4, 2]),
    kind=st.sampled_from(["keys", "values"]),
    spread=st.sampled_from([1e-4, 1e-2, 1.0, 300.0]),
    offset=st.sampled_from([0.0, -250.0]),  # a narrow group far from 0: float16 zeros must round down
    seed=st.integers(0, 10_000),
)
def test_error_within_half_a_scale_per_group(heads, length, dim, group, bits, kind, spread, offset, seed):
    x = random_kv(heads, length, dim, seed, spread, offset)
    dim_axis = -2 if kind == "keys" else -1
    codes, scale, zero = kvquant.quantize(x, bits, dim_axis, group)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 2**bits - 1
    assert scale.dtype == zero.dtype == torch.float16 and bool((scale > 0).all())
    back = kvquant.dequantize(codes, scale, zero, dim_axis, group)
    s = scale.float().repeat_interleave(group, dim=dim_axis).narrow(dim_axis, 0, x.shape[dim_axis])
    rounding = 4 * torch.finfo(torch.float32).eps * x.abs().clamp_min(1.0)  # float32 arithmetic
    assert bool(((back - x).abs() <= s / 2 + rounding).all()), float(((back - x).abs() - s / 2).max())


def test_constant_groups_and_the_bound_is_tight():
    x = torch.full((2, 40, 4), 3.25)
    codes, scale, zero = kvquant.quantize(x, 4, -2, 32)
    torch.testing.assert_close(kvquant.dequantize(codes, scale, zero, -2, 32), x, atol=float(scale.max()) / 2, rtol=0)
    x = torch.linspace(0, 1, 64).reshape(1, 1, 64)  # one value group of 64 per token: step 1/15 at 4 bits
    codes, scale, zero = kvquant.quantize(x, 4, -1, 64)
    err = (kvquant.dequantize(codes, scale, zero, -1, 64) - x).abs().max()
    assert float(scale) >= 1 / 15 and 0.4 * float(scale) < float(err) <= float(scale) / 2 + 1e-6


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("width", [1, 3, 6, 7, 8])
def test_packing_round_trips(width, bits):
    codes = torch.randint(0, 2**bits, (3, 5, width), dtype=torch.uint8)
    packed = kvquant.pack(codes, bits)
    assert packed.shape[-1] == -(-width * bits // 8)
    assert torch.equal(kvquant.unpack(packed, bits, width), codes)
    assert torch.equal(kvquant.codes_float(packed, bits, width), codes.float())
    if bits == 2 and width == 8:  # entry 4i + j in bits 2j: the layout the file format names
        first = codes[0, 0].tolist()
        assert int(packed[0, 0, 0]) == sum(c << (2 * j) for j, c in enumerate(first[:4]))


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_entries_keep_the_newest_tokens_exact_and_refuse_damage(bits):
    x = random_kv(2, 50, 8, 1).to(torch.bfloat16)
    parts = kvquant.quantize_entry(x, "keys", bits, 32, recent=6)
    assert parts["codes"].shape == (2, 44, 8 * bits // 8) and parts["scale"].shape == (2, 2, 8)
    back = kvquant.dequantize_entry(parts, "keys", bits, 32, 8)
    assert back.dtype == torch.bfloat16 and back.shape == x.shape and torch.equal(back[:, -6:], x[:, -6:])
    values = kvquant.quantize_entry(x, "values", bits, 32, recent=6)
    assert values["scale"].shape == (2, 44, 1)
    for bad in (float("nan"), 0.0, -1.0):
        damaged = {**parts, "scale": parts["scale"].clone().index_fill_(1, torch.tensor([1]), bad)}
        with pytest.raises(ValueError, match="damaged"):
            kvquant.dequantize_entry(damaged, "keys", bits, 32, 8)
    with pytest.raises(ValueError, match="do not fit"):
        kvquant.dequantize_entry({**parts, "zero": parts["zero"][:, :1]}, "keys", bits, 32, 8)
    short = kvquant.quantize_entry(x[:, :4], "values", bits, 32, recent=6)  # all recent: nothing quantized
    assert torch.equal(kvquant.dequantize_entry(short, "values", bits, 32, 8), x[:, :4])
    with pytest.raises(ValueError, match="KV bits"):
        kvquant.check_bits(3)


@settings(max_examples=30, deadline=None)
@given(
    length=st.integers(1, 60),
    sink=st.integers(0, 6),
    recent=st.integers(0, 9),
    bits=st.sampled_from([8, 4, 2]),
    kind=st.sampled_from(["keys", "values"]),
    seed=st.integers(0, 1000),
)
def test_sink_and_recent_tokens_stay_exact_and_the_rest_within_the_bound(length, sink, recent, bits, kind, seed):
    x = random_kv(2, length, 6, seed).to(torch.bfloat16)
    parts = kvquant.quantize_entry(x, kind, bits, 8, recent, sink)
    r = min(recent, length)
    s = min(sink, length - r)
    assert ("sink" in parts) == (sink > 0) and parts["recent"].shape[1] == r
    assert parts["codes"].shape[1] == length - s - r
    back = kvquant.dequantize_entry(parts, kind, bits, 8, 6)
    assert back.shape == x.shape and back.dtype == x.dtype
    assert torch.equal(back[:, :s], x[:, :s]) and torch.equal(back[:, length - r :], x[:, length - r :])
    dim = -2 if kind == "keys" else -1
    mid = x[:, s : length - r].float()
    bound = parts["scale"].float().repeat_interleave(8, dim=dim).narrow(dim, 0, mid.shape[dim]) / 2
    # the bf16 rounding of the dequantized value adds at most half a bf16 step of that value (which may
    # be larger than the original by up to the bound)
    got = back[:, s : length - r].float()
    slack = torch.maximum(mid.abs(), got.abs()).clamp_min(1e-3) * 2**-8 + 4 * torch.finfo(torch.float32).eps
    assert bool(((got - mid).abs() <= bound + slack).all())


def test_a_sink_part_that_does_not_fit_is_refused():
    x = random_kv(2, 30, 8, 3).to(torch.bfloat16)
    parts = kvquant.quantize_entry(x, "keys", 2, 8, recent=4, sink=3)
    with pytest.raises(ValueError, match="sink tokens"):
        kvquant.dequantize_entry({**parts, "sink": parts["sink"][:, :, :5]}, "keys", 2, 8, 8)
    with pytest.raises(ValueError, match="sink tokens"):
        kvquant.dequantize_entry({**parts, "sink": parts["sink"].float()}, "keys", 2, 8, 8)


def test_2bit_entry_bytes():
    x = random_kv(2, 256, 64, 2).to(torch.bfloat16)
    full = x.numel() * x.element_size()
    parts = [kvquant.quantize_entry(x, kind, 2, 32, recent=0) for kind in ("keys", "values")]
    # 2-bit codes (0.125 of bf16) plus a float16 scale and zero per 32 entries (0.0625 of bf16): 3 bits a value
    assert [kvquant.quantized_bytes(p) for p in parts] == [full * 3 // 16] * 2


def test_4bit_entry_bytes():
    x = random_kv(2, 256, 64, 2).to(torch.bfloat16)
    full = x.numel() * x.element_size()
    parts = [kvquant.quantize_entry(x, kind, 4, 32, recent=0) for kind in ("keys", "values")]
    # 4-bit codes (0.25 of bf16) plus a float16 scale and zero per 32 entries (0.0625 of bf16)
    assert [kvquant.quantized_bytes(p) for p in parts] == [full * 5 // 16] * 2


def saved_and_loaded(state: Prefilled, bits: int, recent: int, sink: int = 0) -> Prefilled:
    """The state as a .cake file of `bits` carries it: safetensors bytes and back (nothing else shared)."""
    tensors = load_tensors(save_tensors(cache_tensors(state.cache, bits, 32, recent, sink)))
    n = state.cache.layers[0].seen
    cache = cache_from_tensors(tensors, len(state.cache.layers), n, "cpu", bits=bits, group=32)
    cascade = SavedCascade(list(state.cascade.stats), state.cascade.final_budgets, state.cascade.evicting)
    return Prefilled(cache, cascade, state.logits, 0.0, cache.lengths(), cache.kv_bytes(), cache.kv_bytes())


def answer(model, state, prefix, suffix, config, logits):
    cont = extend(model, state, suffix)
    capacity = continuation_capacity(config, True, cont.lengths)
    full = torch.cat([prefix, suffix], dim=1)
    return decode(model, full, cont, config, max_new_tokens=10, capacity=capacity, step_logits=logits)


@pytest.mark.parametrize(("bits", "sink"), [(8, 0), (4, 0), (2, 4)])
def test_saved_quantized_cache_answers_as_the_cache_quantized_in_process(tiny_model, bits, sink):
    gen = torch.Generator().manual_seed(5)
    prefix, suffix = torch.randint(0, 97, (1, 90), generator=gen), torch.randint(0, 97, (1, 6), generator=gen)
    config = CakeConfig(budget=40, window=6)
    use_cake_attention(tiny_model, "sdpa")
    state = prefill(tiny_model, prefix, config)
    here = requantized(state, bits, 32, recent=6, sink=sink)
    there = saved_and_loaded(state, bits, recent=6, sink=sink)
    for a, b, c in zip(here.cache.layers, there.cache.layers, state.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and torch.equal(a.positions, c.positions)
        assert torch.equal(a.keys[:, :, -6:], c.keys[:, :, -6:]), "the observation window is not quantized"
        assert torch.equal(a.values[:, :, :sink], c.values[:, :, :sink]), "the sink tokens are not quantized"
        assert not torch.equal(a.keys, c.keys)
    here_logits, there_logits, plain_logits = [], [], []
    got = answer(tiny_model, here, prefix, suffix, config, here_logits)
    want = answer(tiny_model, there, prefix, suffix, config, there_logits)
    answer(tiny_model, state, prefix, suffix, config, plain_logits)
    assert got.token_ids == want.token_ids and len(got.token_ids) == 10
    assert all(torch.equal(a, b) for a, b in zip(here_logits, there_logits))
    assert float((here_logits[0] - plain_logits[0]).abs().max()) > 0, "quantization changed something"
    assert requantized(state, 16) is state


@pytest.mark.parametrize("kind", ["keys", "values"])
@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize(("length", "dim", "recent", "sink"), [(70, 64, 8, 4), (5, 12, 8, 4), (33, 10, 0, 0)])
def test_entry_bytes_equals_the_quantized_tensors(kind, bits, length, dim, recent, sink):
    """The oracle: the shape-only byte count is what `quantize_entry` writes (odd dims pad the packed codes)."""
    x = torch.randn(2, length, dim, dtype=torch.bfloat16)
    parts = kvquant.quantize_entry(x, kind, bits, 32, recent, sink)
    assert kvquant.entry_bytes(2, length, dim, 2, kind, bits, 32, recent, sink) == kvquant.quantized_bytes(parts)
