"""The cache as the flat tensors of a .cake file, and back: 16 bits as held, or 8, 4 or 2 bits.

`cache_tensors` gives every layer's keys, values and positions (and H2O's scores, and the padding of
layers with per-KV-head lengths) as named tensors, quantized as `engine.kvquant` codes them (keys per
channel, values per token, after KIVI; from format 6 the values Hadamard-rotated in groups of 64
channels); `cache_from_tensors` checks them and rebuilds a `CakeCache`, dequantized to the model's
dtype or, with `in_memory`, held quantized (`engine.kvmemory.QuantLayer`). `requantized` and
`quantized_in_memory` are the same round trip in process, without a file: what a loaded file of those
bits answers from (docs/method.md §Quantized KV).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from cake_cli.engine.cache import CakeCache
from cake_cli.engine.generate import Prefilled
from cake_cli.engine.headlengths import check_padding, set_padding
from cake_cli.engine.kvmemory import QuantLayer, quantizable
from cake_cli.engine.kvquant import (
    DEFAULT_GROUP,
    PARTS,
    DamagedTensorError,
    check_bits,
    coding_for,
    dequantize_entry,
    quantize_entry,
)


def value_coding_of(cache: CakeCache) -> dict:
    """How a quantized .cake file of `cache` codes its values: `kvquant.coding_for` of its KV heads' dimension d
    ({"value_group": G, "rotated": bool}; format 6)."""
    return coding_for(cache.layers[0].values.shape[-1])


def cache_tensors(
    cache: CakeCache,
    bits: int = 16,
    group: int = DEFAULT_GROUP,
    recent: int = 0,
    sink: int = 0,
    *,
    value_group: int | None = None,
    rotated: bool = False,
) -> dict[str, torch.Tensor]:
    """The cache as flat tensors, all contiguous on CPU; per layer i, `positions.i` [H_kv, len_i] true
    positions (int16 below 32768 positions, else int32: a position costs 1-2% of a token's keys and
    values) and

    - bits 16: `keys.i` and `values.i` [H_kv, len_i, d] (rotated keys, model dtype);
    - bits 8, 4 or 2: `keys.i.<part>` and `values.i.<part>` for the parts of `kvquant.quantize_entry`
      (KIVI's grouped affine codes, float16 scales and zeros, the newest `recent` tokens in the model's
      dtype, and with `sink` > 0 the first `sink` tokens in it too), keys per channel in groups of `group`
      tokens, values per token in groups of `value_group` channels (None: `group`), with `rotated`
      Hadamard-rotated first (format 6);

    and for a layer accumulating H2O's attention `scores.i` [H_kv, len_i] float32 (never quantized); for a
    layer whose KV heads hold different numbers of tokens `starts.i` [H_kv] int32, each head's first live slot
    (`engine.headlengths`: the slots before it are padding, zeros at position -1).

    Raises:
        ValueError: bits not in `kvquant.KV_BITS`, and those of `kvquant.quantize`.
    """
    check_bits(bits)
    out = {}
    index_type = torch.int16 if cache.layers[0].seen <= torch.iinfo(torch.int16).max else torch.int32
    for i, layer in enumerate(cache.layers):
        held = layer.whole() if isinstance(layer, QuantLayer) else (layer.keys, layer.values)  # dequantized
        for kind, x in zip(("keys", "values"), (held[0][0], held[1][0])):
            x = x.contiguous().cpu()  # [H_kv, len_i, d]
            if bits == 16:
                out[f"{kind}.{i}"] = x
            else:
                size, turn = (group, False) if kind == "keys" else (value_group or group, rotated)
                for part, t in quantize_entry(x, kind, bits, size, recent, sink, rotated=turn).items():
                    out[f"{kind}.{i}.{part}"] = t
        out[f"positions.{i}"] = layer.positions.to(index_type).contiguous().cpu()  # a ragged layer's padding: -1
        if layer.start is not None:
            out[f"starts.{i}"] = layer.start.to(torch.int32).contiguous().cpu()  # [H_kv] first live slot per head
        if layer.scores is not None:
            out[f"scores.{i}"] = layer.scores.contiguous().cpu()
    return out


def _parts(tensors: dict[str, torch.Tensor], kind: str, i: int) -> dict[str, torch.Tensor]:
    """Layer i's quantized `kind` parts (`kvquant.PARTS`, and "sink" when the file has it: format 5).

    Raises:
        KeyError: a part missing.
    """
    out = {p: tensors[f"{kind}.{i}.{p}"] for p in PARTS}
    if (sink := tensors.get(f"{kind}.{i}.sink")) is not None:
        out["sink"] = sink
    return out


def _layer_kv(
    tensors: dict[str, torch.Tensor], i: int, bits: int, group: int, value_group: int | None, rotated: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer i's [H_kv, len, d] keys and values from `cache_tensors` output (dequantized when bits < 16; the
    value settings as `cache_tensors`').

    Raises:
        ValueError: a tensor missing or damaged (`kvquant.dequantize_entry`).
    """
    try:
        if bits == 16:
            return tensors[f"keys.{i}"], tensors[f"values.{i}"]
        entries = [_parts(tensors, kind, i) for kind in ("keys", "values")]
    except KeyError as exc:
        raise ValueError(f"tensor {exc.args[0]} is missing") from None
    try:
        keys, values = entries
        width = keys["recent"].shape[-1]
        return (
            dequantize_entry(keys, "keys", bits, group, width),
            dequantize_entry(values, "values", bits, value_group or group, width, rotated=rotated),
        )
    except DamagedTensorError as exc:
        raise DamagedTensorError(f"layer {i}: {exc}") from None
    except (ValueError, IndexError, RuntimeError) as exc:
        raise ValueError(f"layer {i}: {exc}") from None


def cache_from_tensors(
    tensors: dict[str, torch.Tensor],
    num_layers: int,
    seen: int,
    device,
    windows: list[int | None] | None = None,
    *,
    bits: int = 16,
    group: int = DEFAULT_GROUP,
    value_group: int | None = None,
    rotated: bool = False,
    in_memory: bool = False,
) -> CakeCache:
    """Rebuild a cache from `cache_tensors` output (made with these `bits`, `group`, `value_group` and `rotated`;
    quantized tensors are dequantized to the model's dtype, or with `in_memory` held quantized, global non-ragged layers
    as `kvmemory.QuantLayer`s whose parts are the file's): the next token goes to position `seen`; `windows` as for
    `CakeCache` (local layers keep their native sliding window); a layer with `scores.i` accumulates
    H2O's attention from them on.

    Raises:
        ValueError: a tensor missing, shapes or dtypes that do not fit together, damaged quantization
            scales or zeros, positions out of [0, seen) or not increasing along each KV head.
    """
    check_bits(bits)
    cache = CakeCache(num_layers, windows=windows)
    for i, layer in enumerate(cache.layers):
        if f"positions.{i}" not in tensors:
            raise ValueError(f"tensor positions.{i} is missing")
        keys, values = _layer_kv(tensors, i, bits, group, value_group, rotated)
        positions = tensors[f"positions.{i}"]
        heads, length = positions.shape if positions.dim() == 2 else (-1, -1)
        if keys.dim() != 3 or keys.shape != values.shape or keys.shape[:2] != (heads, length) or length < 1:
            raise ValueError(
                f"layer {i}: keys {tuple(keys.shape)}, values {tuple(values.shape)} and positions "
                f"{tuple(positions.shape)} do not fit together"
            )
        positions = positions.to(torch.int64)
        start = check_padding(tensors.get(f"starts.{i}"), positions, seen, i)  # [H_kv], or None: not ragged
        bad = int(positions.min()) < 0 or int(positions.max()) >= seen or not bool((positions.diff() > 0).all())
        if start is None and bad:
            raise ValueError(f"layer {i}: positions are not increasing within [0, {seen})")
        keys, values = keys.unsqueeze(0).to(device), values.unsqueeze(0).to(device)  # [1, H_kv, len, d]
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values, layer.positions, layer.seen = keys, values, positions.to(device), seen
        if start is not None:
            set_padding(layer, start.to(device))
        if (scores := tensors.get(f"scores.{i}")) is not None:
            if scores.shape != positions.shape or scores.dtype != torch.float32 or layer.window is not None:
                raise ValueError(f"layer {i}: scores {tuple(scores.shape)} {scores.dtype} do not fit its positions")
            layer.accumulates, layer.scores = True, scores.to(device)
        if in_memory and bits != 16 and quantizable(layer):
            held = QuantLayer.from_parts(
                _parts_on(tensors, i, device), layer.positions, layer.seen, bits, group,
                value_group=value_group, rotated=rotated,
            )  # fmt: skip
            held.accumulates, held.scores = layer.accumulates, layer.scores
            cache.layers[i] = held
    return cache


def _parts_on(tensors: dict[str, torch.Tensor], i: int, device) -> dict[str, dict[str, torch.Tensor]]:
    """Layer i's file parts of keys and values (already checked by `_layer_kv`) on `device`, for a `QuantLayer`."""
    return {kind: {p: t.to(device) for p, t in _parts(tensors, kind, i).items()} for kind in ("keys", "values")}


def requantized(
    state: Prefilled,
    bits: int,
    group: int = DEFAULT_GROUP,
    recent: int = 0,
    *,
    sink: int = 0,
    value_group: int | None = None,
    rotated: bool = False,
    in_memory: bool = False,
) -> Prefilled:
    """The state as a .cake file of `bits` would give it back: its cache quantized and dequantized in
    process (`cache_tensors` then `cache_from_tensors`, no file), or with `in_memory` held quantized
    (`kvmemory.QuantLayer`, as a file loaded with `in_memory`); bits 16 returns `state` itself. `kv_bytes`
    is measured from the tensors now held.

    Raises:
        ValueError: see `cache_tensors`.
    """
    if bits == 16:
        return state
    src = state.cache
    values = dict(value_group=value_group, rotated=rotated)
    cache = cache_from_tensors(
        cache_tensors(src, bits, group, recent, sink, **values), len(src.layers), src.layers[0].seen,
        src.layers[0].keys.device, src.windows, bits=bits, group=group, in_memory=in_memory, **values,
    )  # fmt: skip
    cache.full_bytes = src.full_bytes
    return replace(state, cache=cache, lengths=cache.lengths(), kv_bytes=cache.kv_bytes())


def quantized_in_memory(
    state: Prefilled, bits: int, group: int = DEFAULT_GROUP, recent: int = 0, sink: int = 0, **coding
) -> Prefilled:
    """`requantized` with `in_memory`: global, non-ragged layers held quantized (`engine.kvmemory`), the others
    as the file gives them back (dequantized); so it answers exactly as the .cake file of `bits` loaded.
    `coding`: the values' `value_group` and `rotated`, as for `requantized`."""
    return requantized(state, bits, group, recent, sink=sink, in_memory=True, **coding)
