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
from cake_cli.engine.cachefile import cache_from_tensors, cache_tensors, requantized
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.continuation import SavedCascade, continuation_capacity, extend
from cake_cli.engine.generate import Prefilled, decode, prefill
from tests.helpers.hadamard import rotated_reference


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


def saved_and_loaded(state: Prefilled, bits: int, recent: int, sink: int = 0, **coding) -> Prefilled:
    """The state as a .cake file of `bits` carries it: safetensors bytes and back (nothing else shared)."""
    tensors = load_tensors(save_tensors(cache_tensors(state.cache, bits, 32, recent, sink, **coding)))
    n = state.cache.layers[0].seen
    cache = cache_from_tensors(tensors, len(state.cache.layers), n, "cpu", bits=bits, group=32, **coding)
    cascade = SavedCascade(list(state.cascade.stats), state.cascade.final_budgets, state.cascade.evicting)
    return Prefilled(cache, cascade, state.logits, 0.0, cache.lengths(), cache.kv_bytes(), cache.kv_bytes())


def answer(model, state, prefix, suffix, config, logits):
    cont = extend(model, state, suffix)
    capacity = continuation_capacity(config, True, cont.lengths)
    full = torch.cat([prefix, suffix], dim=1)
    return decode(model, full, cont, config, max_new_tokens=10, capacity=capacity, step_logits=logits)


ROTATED = {"value_group": 8, "rotated": True}  # format 6's value coding: one group a head of the tiny model (d = 8)


@pytest.mark.parametrize(("bits", "sink", "coding"), [(8, 0, {}), (4, 0, {}), (2, 4, {}), (4, 4, ROTATED)])
def test_saved_quantized_cache_answers_as_the_cache_quantized_in_process(tiny_model, bits, sink, coding):
    gen = torch.Generator().manual_seed(5)
    prefix, suffix = torch.randint(0, 97, (1, 90), generator=gen), torch.randint(0, 97, (1, 6), generator=gen)
    config = CakeConfig(budget=40, window=6)
    use_cake_attention(tiny_model, "sdpa")
    state = prefill(tiny_model, prefix, config)
    here = requantized(state, bits, 32, recent=6, sink=sink, **coding)
    there = saved_and_loaded(state, bits, recent=6, sink=sink, **coding)
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


@pytest.mark.parametrize(("dim", "p"), [(1, 1), (2, 2), (12, 4), (64, 64), (80, 16), (128, 64), (256, 256)])
def test_rotate_is_the_block_hadamard_product_and_its_own_inverse(dim, p):
    x = random_kv(3, 40, dim, dim)
    got = kvquant.rotate(x, p)
    torch.testing.assert_close(got.double(), rotated_reference(x, p), rtol=1e-6, atol=1e-5)  # H symmetric: x H = H x
    torch.testing.assert_close(kvquant.rotate(got, p), x, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)  # orthonormal


@pytest.mark.parametrize(("dim", "group"), [(64, 32), (80, 64), (96, 48), (12, 8)])
def test_a_rotation_block_is_a_whole_value_group(dim, group):
    if dim % group == 0 and group & (group - 1) == 0:
        assert kvquant.rotation_block(dim, group) == group
        return
    with pytest.raises(ValueError, match="power of 2 dividing d"):
        kvquant.quantize_entry(random_kv(1, 10, dim, 0), "values", 4, group, recent=0, rotated=True)


@pytest.mark.parametrize(("dim", "coding"), [(64, (64, True)), (256, (64, True)), (8, (8, True)), (80, (32, False))])
def test_files_rotate_groups_of_64_or_the_whole_head(dim, coding):
    assert kvquant.coding_for(dim) == {"value_group": coding[0], "rotated": coding[1]}


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("group", [64, 16, 2])
def test_rotated_dequantization_is_exact_in_the_codes_and_a_function_of_each_row(bits, group):
    """s · (H c) / √G + z · √G · e_0 (the shipped dequantization) equals the float64 product of the plain dequantized
    rows with H to float32's rounding, and every row gives the same bits alone as in the whole block."""
    x = random_kv(2, 300, 64, bits + group).to(torch.bfloat16)
    parts = kvquant.quantize_entry(x, "values", bits, group, recent=0, rotated=True)
    got = torch.empty(2, 300, 64, dtype=torch.float32)
    kvquant.dequantize_values(got, parts, bits, group, rotated=True)
    plain = kvquant.dequantize(kvquant.unpack(parts["codes"], bits, 64), parts["scale"], parts["zero"], -1, group)
    ulp = float(plain.abs().max()) * 2**-23  # float32 rounding at the block's magnitude (sums may cancel)
    torch.testing.assert_close(got.double(), rotated_reference(plain, group), rtol=1e-6, atol=4 * ulp)
    for a, b in ((0, 1), (17, 18), (250, 300), (5, 129)):
        part = {k: v[:, a:b] for k, v in parts.items() if k != "recent"}
        one = torch.empty(2, b - a, 64, dtype=torch.float32)
        kvquant.dequantize_values(one, part, bits, group, rotated=True)
        assert torch.equal(one, got[:, a:b]), (a, b)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize(("dim", "group"), [(64, 64), (128, 64), (24, 8)])
def test_rotated_values_are_within_half_a_scale_in_the_rotated_space(bits, dim, group):
    """The bound holds for the rotated values; dequantizing undoes the rotation (the float64 reference), so the
    error of each value row keeps its norm."""
    x = random_kv(2, 90, dim, bits + dim).to(torch.bfloat16)  # an outlier channel: what the rotation spreads
    parts = kvquant.quantize_entry(x, "values", bits, group, recent=5, sink=4, rotated=True)
    codes = kvquant.unpack(parts["codes"], bits, dim)
    back = kvquant.dequantize(codes, parts["scale"], parts["zero"], -1, group)  # [H_kv, m, d], rotated space
    turned = kvquant.rotate(x[:, 4:85].float(), group)
    s = parts["scale"].float().repeat_interleave(group, dim=-1)[..., :dim]
    assert bool(((back - turned).abs() <= s / 2 + 1e-5 * turned.abs().clamp_min(1.0)).all())
    got = kvquant.dequantize_entry(parts, "values", bits, group, dim, rotated=True)
    want = rotated_reference(back, group).to(torch.bfloat16)  # H = H^-1
    assert torch.equal(got[:, :4], x[:, :4]) and torch.equal(got[:, 85:], x[:, 85:]), "sink and recent stay exact"
    torch.testing.assert_close(got[:, 4:85].float(), want.float(), rtol=1e-2, atol=1e-2)
    err_rows = (got[:, 4:85].float() - x[:, 4:85].float()).norm(dim=-1)
    torch.testing.assert_close(err_rows, (back - turned).norm(dim=-1), rtol=0.05, atol=0.05)  # bf16 rounding only


def test_rotation_halves_the_value_error_of_an_outlier_channel_at_the_same_bytes():
    """Why format 6 rotates: a value channel 20x the others sets every unrotated group's scale; rotated, its
    energy is spread over the block, and groups of 64 beat unrotated groups of 32 that cost more bytes."""
    x = random_kv(2, 256, 64, 9)
    plain = kvquant.quantize_entry(x, "values", 4, 32, recent=0)
    turned = kvquant.quantize_entry(x, "values", 4, 64, recent=0, rotated=True)
    errors = [
        float((kvquant.dequantize_entry(p, "values", 4, g, 64, rotated=r) - x).norm() / x.norm())
        for p, g, r in ((plain, 32, False), (turned, 64, True))
    ]
    assert kvquant.quantized_bytes(turned) < kvquant.quantized_bytes(plain)
    assert errors[1] < errors[0] / 2, errors


def test_keys_are_not_rotated():
    with pytest.raises(ValueError, match="only values"):
        kvquant.quantize_entry(random_kv(1, 10, 8, 0), "keys", 4, 8, recent=0, rotated=True)


def test_4bit_rotated_entry_bytes():
    x = random_kv(2, 256, 64, 3).to(torch.bfloat16)
    full = x.numel() * x.element_size()
    parts = kvquant.quantize_entry(x, "values", 4, 64, recent=0, rotated=True)
    # 4-bit codes (0.25 of bf16) plus a float16 scale and zero per 64 channels (0.03125 of bf16)
    assert kvquant.quantized_bytes(parts) == full * 9 // 32 == kvquant.entry_bytes(2, 256, 64, 2, "values", 4, 64, 0)
