"""Keys and values held quantized in memory while answering (`engine.kvmemory`, KIVI arXiv 2402.02750).

Oracles: (1) every decode step's logits equal, bit for bit, those of the same quantized cache dequantized to full
tensors once (`cachefile.requantized`, the file's loading path before) and decoded normally, for
Llama, a GQA family and Gemma 3 (local layers), 8 and 4 bits, `fixed` and `grow` decode policies (H2O's
accumulation too); (2) a 4-bit file loaded with `in_memory` answers exactly as the same cache quantized
in process; (3) the KV bytes reported equal the bytes of the tensors held, computed here from the
layout (codes, scales, zeros, residual), and are below the model-dtype size."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from cake_cli.engine import kvquant
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.cachefile import cache_from_tensors, cache_tensors, quantized_in_memory, requantized
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.continuation import continuation_capacity, extend
from cake_cli.engine.generate import decode, prefill
from cake_cli.engine.kvmemory import KINDS, QuantLayer
from tests.helpers.hadamard import rotated_reference
from tests.helpers.models import tiny_family, tiny_llama

GROUP, WINDOW = 8, 6
ROTATED = {"value_group": 8, "rotated": True}  # format 6's value coding: one rotated group a head (d = 8)


@pytest.fixture(scope="module")
def models():
    return {
        "llama": tiny_llama(),
        "qwen2": tiny_family("qwen2", heads=6, kv_heads=3, seed=1),
        "gemma3_text": tiny_family("gemma3_text", layers=6, seed=2),
    }


def ids(seed: int, n: int) -> torch.Tensor:
    return torch.randint(3, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def answer(model, state, prefix, suffix, config, steps=8):
    logits = []
    cont = extend(model, state, suffix)
    capacity = continuation_capacity(config, True, cont.lengths) if config.decode_policy == "fixed" else None
    full = torch.cat([prefix, suffix], dim=1)
    out = decode(model, full, cont, config, max_new_tokens=steps, capacity=capacity, step_logits=logits)
    return out, logits


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3_text"])
@pytest.mark.parametrize(("bits", "sink", "coding"), [(8, 0, {}), (4, 0, {}), (4, 3, {}), (2, 3, {}), (4, 3, ROTATED)])
@pytest.mark.parametrize("policy", ["fixed", "grow"])
def test_decode_equals_the_dequantized_reference(models, arch, bits, sink, coding, policy):
    model = models[arch]
    use_cake_attention(model, "sdpa")
    prefix, suffix = ids(1, 80), ids(2, 5)
    config = CakeConfig(budget=30, window=WINDOW, decode_policy=policy)
    state = prefill(model, prefix, config)
    held = quantized_in_memory(state, bits, GROUP, recent=WINDOW, sink=sink, **coding)
    reference = requantized(state, bits, GROUP, recent=WINDOW, sink=sink, **coding)
    kinds = [type(layer) for layer in held.cache.layers]
    assert QuantLayer in kinds and (arch != "gemma3_text" or len(set(kinds)) == 2), "local layers stay unquantized"
    assert all(layer.sunk() == sink for layer in held.cache.layers if isinstance(layer, QuantLayer))
    for a, b in zip(held.cache.layers, reference.cache.layers):  # the same keys and values, bit for bit
        whole = a.whole() if isinstance(a, QuantLayer) else (a.keys, a.values)
        assert torch.equal(whole[0], b.keys) and torch.equal(whole[1], b.values)
    got, got_logits = answer(model, held, prefix, suffix, config)
    want, want_logits = answer(model, reference, prefix, suffix, config)
    assert got.token_ids == want.token_ids and len(got_logits) == len(want_logits) == 7
    for a, b in zip(got_logits, want_logits):
        assert torch.equal(a, b)  # the same keys and values in the same slots: the same logits, bit for bit
    assert held.cache.lengths() == reference.cache.lengths()


@pytest.mark.parametrize(("bits", "sink"), [(4, 0), (2, 3)])
def test_h2o_accumulation_decodes_as_the_reference(models, bits, sink):
    model = models["llama"]
    use_cake_attention(model, "eager")
    prefix, suffix = ids(3, 70), ids(4, 4)
    config = CakeConfig(budget=30, window=WINDOW, indicator="h2o")
    state = prefill(model, prefix, config)
    held, reference = (f(state, bits, GROUP, recent=WINDOW, sink=sink) for f in (quantized_in_memory, requantized))
    got, got_logits = answer(model, held, prefix, suffix, config)
    want, want_logits = answer(model, reference, prefix, suffix, config)
    assert got.token_ids == want.token_ids
    for a, b in zip(got_logits, want_logits):
        assert torch.equal(a, b)


def test_saved_4bit_file_answers_as_the_cache_quantized_in_process(models):
    model = models["gemma3_text"]
    use_cake_attention(model, "sdpa")
    prefix, suffix = ids(5, 80), ids(6, 5)
    config = CakeConfig(budget=30, window=WINDOW)
    state = prefill(model, prefix, config)
    here = quantized_in_memory(state, 4, GROUP, recent=WINDOW)
    tensors = load_tensors(save_tensors(cache_tensors(state.cache, 4, GROUP, WINDOW)))
    cache = cache_from_tensors(
        tensors, len(state.cache.layers), 80, "cpu", state.cache.windows, bits=4, group=GROUP, in_memory=True
    )
    there = type(state)(cache, here.cascade, state.logits, 0.0, cache.lengths(), cache.kv_bytes(), cache.kv_bytes())
    for a, b in zip(here.cache.layers, there.cache.layers):
        assert type(a) is type(b) and torch.equal(a.positions, b.positions)
        if isinstance(a, QuantLayer):
            assert all(torch.equal(a.parts[k][p], b.parts[k][p]) for k in a.parts for p in a.parts[k])
    got, got_logits = answer(model, here, prefix, suffix, config)
    want, want_logits = answer(model, there, prefix, suffix, config)
    assert got.token_ids == want.token_ids
    assert all(torch.equal(a, b) for a, b in zip(got_logits, want_logits))


def test_fixed_decode_writes_released_slots_and_copies_no_quantized_part(models):
    model = models["qwen2"]
    use_cake_attention(model, "sdpa")
    prefix, suffix = ids(9, 80), ids(10, 5)
    config = CakeConfig(budget=30, window=WINDOW, decode_policy="fixed")
    held = quantized_in_memory(prefill(model, prefix, config), 4, GROUP, recent=WINDOW, sink=3, **ROTATED)
    cont = extend(model, held, suffix)
    quantized = [(layer, {k: dict(e) for k, e in layer.parts.items()}) for layer in cont.cache.layers]
    quantized = [(layer, parts) for layer, parts in quantized if isinstance(layer, QuantLayer) and parts]
    before = {id(layer): layer.live() for layer, _ in quantized}
    steps = 8
    decode(model, torch.cat([prefix, suffix], dim=1), cont, config, max_new_tokens=steps,
           capacity=continuation_capacity(config, True, cont.lengths))  # fmt: skip
    assert quantized and all(layer.written is None for layer in held.cache.layers if isinstance(layer, QuantLayer))
    for layer, parts in quantized:
        assert all(layer.parts[k][p] is t for k in parts for p, t in parts[k].items())  # no quantized part copied
        slots, keys, values = layer.written  # one row a head per token written into a released slot
        assert 0 < slots.shape[1] <= steps and keys.shape == values.shape == (1, slots.shape[0], slots.shape[1], 8)
        assert layer.live() <= before[id(layer)] + 1  # the layer holds its capacity (+1 between steps), not more
        whole = layer.whole()[0][0]  # [H_kv, slots, d]: each written slot shows the row written last
        assert torch.equal(whole.gather(1, slots.unsqueeze(-1).expand(-1, -1, 8)), keys[0])
        assert layer.nbytes() == expected_bytes(layer, 4) + sum(t.numel() * t.element_size() for t in layer.written)
        keys, values = layer.whole()
        index = torch.arange(2, keys.shape[2]).expand(keys.shape[1], -1)  # [H_kv, k - 2]: a later eviction
        layer.keep(index)  # held dequantized from here: the same rows, exact
        assert layer.written is None and layer.quantized() == 0 and layer.sunk() == 0
        assert torch.equal(layer.whole()[0], keys[:, :, 2:]) and torch.equal(layer.whole()[1], values[:, :, 2:])


def expected_bytes(layer, bits: int) -> int:
    """KV bytes of one layer from its layout: codes, float16 scales and zeros, the residual (model dtype)."""
    if not isinstance(layer, QuantLayer):
        return 2 * layer.keys.numel() * layer.keys.element_size()
    heads, m = layer.parts["keys"]["codes"].shape[:2]
    d, r, size = layer.width, layer.keys.shape[2], layer.keys.element_size()
    codes = 2 * heads * m * -(-d * bits // 8)
    key_groups = 2 * heads * -(-m // GROUP) * d * 2
    value_groups = 2 * heads * m * -(-d // GROUP) * 2
    return codes + key_groups + value_groups + 2 * heads * (r + layer.sunk()) * d * size


@pytest.mark.parametrize(("bits", "sink"), [(8, 0), (4, 0), (2, 3)])
def test_memory_bytes_are_the_held_tensors_and_below_the_full_precision_size(models, bits, sink):
    model = models["llama"]
    use_cake_attention(model, "sdpa")
    state = prefill(model, ids(7, 80), CakeConfig(budget=30, window=WINDOW))
    held = quantized_in_memory(state, bits, GROUP, recent=WINDOW, sink=sink)
    assert held.kv_bytes == held.cache.kv_bytes() == sum(expected_bytes(x, bits) for x in held.cache.layers)
    reference = requantized(state, bits, GROUP, recent=WINDOW, sink=sink)
    assert held.kv_bytes < state.kv_bytes == reference.kv_bytes
    cont, plain = (extend(model, x, ids(8, 5)) for x in (held, reference))
    assert cont.kv_bytes == sum(expected_bytes(x, bits) for x in cont.cache.layers) < plain.kv_bytes


def reference_dequantized(parts, kind, bits, group, dim) -> torch.Tensor:
    """The slow, obviously correct path: unpack, `kvquant.dequantize` (scales repeated), dtype, recent tokens."""
    axis = -2 if kind == "keys" else -1
    old = kvquant.dequantize(kvquant.unpack(parts["codes"], bits, dim), parts["scale"], parts["zero"], axis, group)
    sink = parts.get("sink", parts["recent"][:, :0])
    return torch.cat([sink, old.to(parts["recent"].dtype), parts["recent"]], dim=1)


@pytest.mark.parametrize(("bits", "sink"), [(8, 0), (4, 0), (2, 0), (4, 4), (2, 4)])
@pytest.mark.parametrize(("group", "dim", "length"), [(32, 64, 2600), (7, 12, 1500), (8, 5, 40)])
def test_blockwise_dequantization_is_bit_for_bit_the_files(bits, sink, group, dim, length):
    gen = torch.Generator().manual_seed(group + dim)
    k, v = (torch.randn(3, length, dim, generator=gen).to(torch.bfloat16) * 3 for _ in range(2))
    kv = (("keys", k), ("values", v))
    parts = {kind: kvquant.quantize_entry(x, kind, bits, group, 5, sink) for kind, x in kv}
    positions = torch.arange(length).expand(3, length)
    layer = QuantLayer.from_parts({kind: dict(p) for kind, p in parts.items()}, positions, length, bits, group)
    want = [reference_dequantized(parts[kind], kind, bits, group, dim) for kind in ("keys", "values")]
    assert all(torch.equal(kvquant.dequantize_entry(parts[k], k, bits, group, dim), w) for k, w in zip(KINDS, want))
    got = layer.whole()
    assert all(torch.equal(a[0], b) for a, b in zip(got, want))
    half = length // 2 - sink  # every head keeps the sink slots and as many of the others, chosen at random
    rest = torch.stack([(torch.randperm(length - sink, generator=gen)[:half] + sink).sort().values for _ in range(3)])
    keep = torch.cat([torch.arange(sink).expand(3, -1), rest], dim=1)
    keep[:, -1] = length - 1  # every head keeps the newest (residual) slot
    layer.keep(keep)
    index = keep.unsqueeze(-1).expand(-1, -1, dim)
    got = layer.whole()
    assert all(torch.equal(a[0], b.gather(1, index)) for a, b in zip(got, want))
    assert layer.sunk() == sink and (layer.group_of is not None or layer.quantized() == 0)
    n = half // 3
    survivors = keep[:, sink : sink + n]  # groups emptied in every head lose their scales and zeros
    before = layer.parts["keys"]["scale"].shape[1]
    layer.keep(torch.cat([torch.arange(sink + n).expand(3, -1), torch.full((3, 1), keep.shape[1] - 1)], 1))
    got = layer.whole()
    kept = keep[:, : sink + n].unsqueeze(-1).expand(-1, -1, dim)
    assert all(torch.equal(a[0][:, :-1], b.gather(1, kept)) for a, b in zip(got, want))
    assert int(survivors.max()) < length - 5, "every survivor is a quantized slot"
    groups = len(set((survivors - sink).div(group, rounding_mode="floor").flatten().tolist()))  # original groups
    assert layer.parts["keys"]["scale"].shape[1] == groups <= before


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize(("group", "dim", "length"), [(64, 64, 2600), (4, 12, 300), (64, 256, 700)])
def test_rotated_values_are_bit_for_bit_the_files_after_eviction(bits, group, dim, length):
    """Format 6: a layer holding Hadamard-rotated values gives, bit for bit, what `dequantize_entry` gives the file,
    before and after an eviction moves the blocks each slot is dequantized in; both equal the float64 reference
    (plain dequantization, then the rotation matrix) to the model dtype's rounding."""
    gen = torch.Generator().manual_seed(group + bits)
    k, v = (torch.randn(2, length, dim, generator=gen).to(torch.bfloat16) * 3 for _ in range(2))
    keys = kvquant.quantize_entry(k, "keys", bits, GROUP, 5, 4)
    values = kvquant.quantize_entry(v, "values", bits, group, 5, 4, rotated=True)
    layer = QuantLayer.from_parts(
        {"keys": dict(keys), "values": dict(values)}, torch.arange(length).expand(2, length), length, bits, GROUP,
        value_group=group, rotated=True,
    )  # fmt: skip
    want = kvquant.dequantize_entry(values, "values", bits, group, dim, rotated=True)
    assert torch.equal(layer.whole()[1][0], want)
    codes = kvquant.unpack(values["codes"], bits, dim)
    middle = rotated_reference(kvquant.dequantize(codes, values["scale"], values["zero"], -1, group), group)
    torch.testing.assert_close(want[:, 4 : length - 5].double(), middle, rtol=2**-8, atol=1e-4)  # bf16 rounding
    keep = torch.stack([(torch.randperm(length - 4, generator=gen)[: length // 3] + 4).sort().values for _ in range(2)])
    keep = torch.cat([torch.arange(4).expand(2, -1), keep], dim=1)
    layer.keep(keep)
    assert torch.equal(layer.whole()[1][0], want.gather(1, keep.unsqueeze(-1).expand(-1, -1, dim)))


@pytest.mark.parametrize("bits", [4, 2])
def test_heads_keeping_different_sink_slots_hold_the_exact_dequantized_slots(bits):
    gen = torch.Generator().manual_seed(bits)
    length, dim, group, sink = 60, 8, 8, 4
    k, v = (torch.randn(2, length, dim, generator=gen).to(torch.bfloat16) for _ in range(2))
    parts = {kind: kvquant.quantize_entry(x, kind, bits, group, 5, sink) for kind, x in (("keys", k), ("values", v))}
    layer = QuantLayer.from_parts(parts, torch.arange(length).expand(2, length), length, bits, group)
    want = layer.whole()
    keep = torch.tensor([[0, 1, 2, 10, 20, 59], [0, 3, 9, 10, 30, 59]])  # 3 and 2 sink slots kept
    layer.keep(keep)
    index = keep.unsqueeze(-1).expand(-1, -1, dim)
    got = layer.whole()
    assert all(torch.equal(a[0], b[0].gather(1, index)) for a, b in zip(got, want))
    assert layer.sunk() == layer.quantized() == 0 and layer.live() == 6
    assert torch.equal(layer.positions, keep)
    layer.update(torch.ones(1, 2, 1, dim, dtype=torch.bfloat16), torch.ones(1, 2, 1, dim, dtype=torch.bfloat16))
    assert layer.live() == 7 and int(layer.positions[0, -1]) == length


@pytest.mark.parametrize(("bits", "sink"), [(4, 0), (2, 4)])
def test_attention_over_the_held_cache_equals_a_float64_reference(bits, sink):
    """Attention over a `QuantLayer` (what the model's attention gets from `update`) equals softmax(q K^T / sqrt(d)) V
    in float64 over the plain dequantization (`kvquant.dequantize`, scales repeated) of the same parts, plus the
    new tokens."""
    gen = torch.Generator().manual_seed(sink + bits)
    length, dim, group, heads, q_heads = 200, 16, 32, 2, 6
    k, v = (torch.randn(heads, length, dim, generator=gen) * 2 + 1 for _ in range(2))
    k[:, :, 3] *= 15  # an outlier key channel
    parts = {kind: kvquant.quantize_entry(x, kind, bits, group, 6, sink) for kind, x in (("keys", k), ("values", v))}
    layer = QuantLayer.from_parts(parts, torch.arange(length).expand(heads, length), length, bits, group)
    new_k, new_v = (torch.randn(1, heads, 3, dim, generator=gen) for _ in range(2))
    keys, values = layer.update(new_k, new_v)  # [1, H_kv, length + 3, d] float32
    q = torch.randn(1, q_heads, 3, dim, generator=gen)
    mask = torch.ones(3, length + 3, dtype=torch.bool).tril(length)  # the 3 new tokens see the prefix and earlier ones
    rep = q_heads // heads
    got = torch.nn.functional.scaled_dot_product_attention(
        q, keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1), attn_mask=mask
    )
    ref_k, ref_v = (
        torch.cat([reference_dequantized(parts[kind], kind, bits, group, dim), new[0]], dim=1).double()
        for kind, new in (("keys", new_k), ("values", new_v))
    )  # [H_kv, length + 3, d]
    scores = q[0].double() @ ref_k.repeat_interleave(rep, 0).transpose(1, 2) / dim**0.5  # [H, 3, length + 3]
    want = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ ref_v.repeat_interleave(rep, 0)
    torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=1e-5)
    plain = (torch.cat([k, new_k[0]], 1), torch.cat([v, new_v[0]], 1))  # unquantized: the error is real
    exact = (q[0] @ plain[0].repeat_interleave(rep, 0).transpose(1, 2) / dim**0.5).masked_fill(~mask, float("-inf"))
    assert float((exact.softmax(-1) @ plain[1].repeat_interleave(rep, 0) - got[0]).abs().max()) > 1e-4


def test_a_cache_held_quantized_saves_as_the_dequantized_one(models):
    model = models["llama"]
    use_cake_attention(model, "sdpa")
    state = prefill(model, ids(9, 60), CakeConfig(budget=30, window=WINDOW))
    held, reference = (f(state, 4, GROUP, recent=WINDOW) for f in (quantized_in_memory, requantized))
    for bits in (16, 4):
        a, b = (cache_tensors(x.cache, bits, GROUP, WINDOW) for x in (held, reference))
        assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
