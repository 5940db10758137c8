"""Grouped affine quantization of a layer's keys and values for the .cake file (KIVI, Liu et al. 2024,
arXiv 2402.02750; docs/method.md §Quantized KV).

KIVI's layout: **keys per channel** (a group is G consecutive tokens of one channel of one KV head:
key outliers sit in fixed channels, so a channel's range is narrow across tokens) and **values per
token** (a group is G consecutive channels of one token of one KV head). Each group stores a float16
scale s and zero z; a value x becomes the code c = round((x - z) / s) in 0 .. 2^b - 1 (b = 8, 4 or 2
bits; two 4-bit or four 2-bit codes share a byte along the channels) and comes back as c · s + z. A
group's last tokens or channels may be fewer than G (B_l + w need not be a multiple of G): the partial
group is its own group. The newest r tokens of every layer (r = the observation window w: the tokens
every question attends to first) stay in the model's dtype, as KIVI keeps its recent tokens in full
precision; from format 5 the first s tokens too (the attention sinks, `DEFAULT_KV_SINK` = 4: most queries
put much of their attention there, so their error weighs on every output; on the default model's real
cache `benchmarks/kv_quant_error.py` measured the window's attention error 12-19% lower with them exact,
at 8, 4 and 2 bits, for 0.001x the 16-bit file at 4K tokens).

What else that diagnostic found (benchmarks/cache.md "Quantization at 2 and 4 bits"): keys quantized per
token instead of per channel give 3-6x the attention error (Qwen's key bias puts a constant offset in some
channels, up to 140x a channel's spread), at 4 bits groups of 64 or 128 save 7-10% of the file for 19-26% more
error, bfloat16 or float32 scales change nothing, and at 2 bits the values' error (43% of their norm)
dominates.

Error bound: z is rounded down and s up to float16 so that z <= min and z + (2^b - 1) · s >= max
over the group; then every x of the group is within s / 2 of its dequantized value (plus float32
rounding), which `tests/engine/test_kvquant.py` checks.

Why not a maintained quantizer (checked with pip in this project's environment, Dec. 2025):
optimum-quanto 0.2.7 groups a tensor flattened to 2-D along axis 0 or -1 only, with a group size that
must divide the axis (our per-layer token counts are arbitrary), and keeps int4 codes in its own
tensor subclasses with their own serialization; it also needs ninja to build its kernels. hqq 0.2.8
optimizes scale and zero (half-quadratic solver), so the round-to-nearest bound above does not hold,
and it pulls accelerate, einops, termcolor and tqdm. torchao 0.18 has block-wise affine primitives that
would fit the shapes, but importing it took 10 s here and printed warnings about its compiled kernels
on this torch, and we would still write the 4-bit packing and the float16 rounding that keeps the
bound. The engine stays torch + transformers only; what is needed here is a few tensor operations.

**Rotated values** (format 6, QuaRot's rotation: Ashkboos et al. 2024, arXiv 2404.00456): before
quantizing, each value row is multiplied by an orthonormal Hadamard matrix H (Sylvester's, block diagonal over
blocks of G channels: each block is one value group, so G must be a power of 2 dividing d), and the dequantized
row is multiplied by H again (H = Hᵀ = H⁻¹). The rotation spreads a token's few large value channels over all
of them, so one group of 64 channels holds the error a group of 32 held without it: on the default model's real
cache the window's attention error was 0.0443 at 0.303x the 16-bit file, against 0.0439 at 0.319x
(benchmarks/runs/kv-quant-error-qwen.txt, `sink 4 values rotated v64 4` and `sink 4 4`). The round-to-nearest
bound above holds in the rotated space; H is orthonormal, so the error of a value row has the same Euclidean
norm after the rotation is undone.

Dequantizing a block rotates the integer codes, not the dequantized floats: with one scale s and zero z per
block, H(c · s + z · 1) = s · (H c) + z · (H 1), H c is a sum of at most G · 255 < 2^24 integers (exact in
float32 whatever order a matrix product adds them in) and H 1 = √G · e_0 (the first Sylvester row is all ones,
the others sum to 0). So each row's values are an elementwise function of its own codes: the same bits whether
a row is dequantized alone or in a block, after any eviction, in the file's path or in memory, and one small
matrix product instead of log2(G) passes.

A loaded cache keeps these parts in memory (`engine.kvmemory.QuantLayer`: global, non-ragged layers);
local and ragged layers are dequantized to the model's dtype.
"""

from __future__ import annotations

import functools

import torch

from cake_cli.engine.config import DEFAULT_KV_GROUP, DEFAULT_KV_VALUE_GROUP, KV_BITS

DEFAULT_GROUP = DEFAULT_KV_GROUP  # entries per group (KIVI's size; the file records the one used)
BLOCK = 1024  # tokens dequantized at a time (`dequantize_keys`): float32 temporaries of ~1 MiB at 2 KV heads, d = 64
CODE_BITS = (8, 4, 2)  # bits of a quantized code (16: not quantized)
PARTS = ("codes", "scale", "zero", "recent")  # tensors of one quantized keys / values entry, `<name>.<part>`


class DamagedTensorError(ValueError):
    """Quantized parts that cannot have been written by `quantize_entry` (non-finite or non-positive scales)."""


def check_bits(bits: int) -> None:
    """Raises ValueError unless `bits` is one of KV_BITS."""
    if bits not in KV_BITS:
        raise ValueError(f"KV bits must be one of {', '.join(map(str, KV_BITS))} (got {bits})")


def _down(x: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, float("-inf")))


def _up(x: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, float("inf")))


def group_params(
    lo: torch.Tensor, hi: torch.Tensor, bits: int, dtype: torch.dtype = torch.float16
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) in `dtype` (float16 in files; bfloat16 / float32 for `benchmarks/kv_quant_error.py`) of
    groups with minimum `lo` and maximum `hi` (float32, same shape), rounded so that zero <= lo,
    zero + (2^bits - 1) · scale >= hi and scale > 0 (the error bound of the module docstring).

    Raises:
        ValueError: a value beyond half of `dtype`'s range (the scale and zero could not hold it).
    """
    top = float(torch.finfo(dtype).max) / 2
    if lo.numel() and max(float(lo.abs().max()), float(hi.abs().max())) > top:
        name = str(dtype).replace("torch.", "")
        raise ValueError(f"keys or values beyond half of {name}'s range cannot be quantized")
    levels = float(2**bits - 1)
    zero = lo.to(dtype)
    zero = torch.where(zero.float() > lo, _down(zero), zero)  # zero <= lo
    scale = ((hi - zero.float()) / levels).to(dtype)
    scale = torch.where(scale.float() * levels + zero.float() < hi, _up(scale), scale)  # top level >= hi
    tiny = torch.tensor(torch.finfo(dtype).smallest_normal, dtype=dtype)
    return torch.maximum(scale, tiny), zero


def _grouped(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    """x with `dim` split into groups of `group`, the last one padded by repeating its last entry.

    Args:
        x: [..., m, ...] float32 (m = x.shape[dim] >= 1).

    Returns:
        [..., ceil(m / group), group, ...] (a view, or a padded copy).
    """
    m = x.shape[dim]
    pad = -m % group
    if pad:
        last = x.narrow(dim, m - 1, 1)
        x = torch.cat([x, last.expand(*[pad if i == dim % x.dim() else s for i, s in enumerate(last.shape)])], dim=dim)
    shape = list(x.shape)
    shape[dim : dim + 1] = [shape[dim] // group, group]
    return x.reshape(shape)


def quantize(
    x: torch.Tensor, bits: int, dim: int, group: int, scale_dtype: torch.dtype = torch.float16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grouped affine quantization along `dim` (module docstring).

    Args:
        x: [H_kv, m, d] keys (dim = -2: per channel) or values (dim = -1: per token), any float dtype, m >= 0.
        bits: 8, 4 or 2. group: G >= 1 entries per group along `dim`.
        scale_dtype: of the scales and zeros (files: float16; others for the error diagnostic).

    Returns:
        (codes [H_kv, m, d] uint8 in 0 .. 2^bits - 1, unpacked; scale and zero in `scale_dtype`, `x`'s shape
        with `dim` replaced by ceil(x.shape[dim] / G)).

    Raises:
        ValueError: bits not 8, 4 or 2, group < 1, non-finite values, values beyond `scale_dtype`'s range.
    """
    if bits not in CODE_BITS or group < 1:
        raise ValueError(f"quantize takes 8, 4 or 2 bits and a group >= 1 (got {bits} bits, group {group})")
    x = x.float()
    if not bool(torch.isfinite(x).all()):
        raise ValueError("cannot quantize non-finite keys or values")
    dim = dim % x.dim()
    if x.numel() == 0:
        shape = list(x.shape)
        shape[dim] = -(-shape[dim] // group)
        return x.to(torch.uint8), *(x.new_zeros(shape, dtype=scale_dtype) for _ in range(2))
    grouped = _grouped(x, dim, group)  # [..., groups, G, ...]
    lo, hi = grouped.amin(dim=dim + 1), grouped.amax(dim=dim + 1)  # [..., groups, ...]
    scale, zero = group_params(lo, hi, bits, scale_dtype)
    codes = (grouped - zero.float().unsqueeze(dim + 1)) / scale.float().unsqueeze(dim + 1)
    codes = codes.round_().clamp_(0, 2**bits - 1).to(torch.uint8)
    codes = codes.flatten(dim, dim + 1).narrow(dim, 0, x.shape[dim])  # [H_kv, m, d]
    return codes.contiguous(), scale, zero


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    """codes · scale + zero in float32, each group's scale and zero repeated over its G entries along `dim`: the
    plain definition (the tests' reference); `dequantize_keys` / `dequantize_values` compute the same, bit for bit,
    a block at a time without the repeated copies (what loading and decoding use).

    Args:
        codes: [H_kv, m, d] uint8 (unpacked); scale, zero: as `quantize` returns them.

    Returns:
        [H_kv, m, d] float32.
    """
    dim = dim % codes.dim()
    length = codes.shape[dim]
    s = scale.float().repeat_interleave(group, dim=dim).narrow(dim, 0, length)
    z = zero.float().repeat_interleave(group, dim=dim).narrow(dim, 0, length)
    return codes.float() * s + z


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[.., d] uint8 codes -> [.., ceil(d · bits / 8)] bytes: 8 bits as they are; 4 bits two a byte (entry 2i in
    the low nibble, 2i + 1 in the high one); 2 bits four a byte (entry 4i + j in bits 2j .. 2j + 1). A d that
    does not fill the last byte is padded with 0 codes."""
    if bits == 8:
        return codes
    per = 8 // bits  # codes per byte
    if codes.shape[-1] % per:
        codes = torch.cat([codes, codes.new_zeros(*codes.shape[:-1], per - codes.shape[-1] % per)], dim=-1)
    out = codes[..., 0::per].clone()
    for j in range(1, per):
        out |= codes[..., j::per] << (bits * j)
    return out.contiguous()


def unpack(packed: torch.Tensor, bits: int, width: int) -> torch.Tensor:
    """Inverse of `pack`: [.., width] uint8 codes."""
    if bits == 8:
        return packed
    mask = 2**bits - 1
    out = torch.stack([(packed >> (bits * j)) & mask for j in range(8 // bits)], dim=-1).flatten(-2)
    return out[..., :width]  # [.., (8 / bits) · ceil(width · bits / 8)] cut to width


def rotation_block(d: int, group: int) -> int:
    """The channels one Hadamard block spans for values of head dimension d coded in groups of `group`: the
    group itself.

    Raises:
        ValueError: `group` not a power of 2 dividing d (a block must be one whole group, module docstring).
    """
    if group < 1 or group & (group - 1) or d % group:
        raise ValueError(f"rotated values need a value group that is a power of 2 dividing d (G = {group}, d = {d})")
    return group


@functools.lru_cache(maxsize=16)
def sylvester(p: int, device: str = "cpu") -> torch.Tensor:
    """[p, p] float32 Sylvester-Hadamard matrix of ±1 entries (unnormalized: H_p / √p is orthonormal), p a power
    of 2; cached per (p, device)."""
    h = torch.ones(1, 1)
    while h.shape[0] < p:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h.to(device)


def rotate(x: torch.Tensor, p: int) -> torch.Tensor:
    """x · H over the last dimension: H the block-diagonal orthonormal Hadamard matrix with blocks of p channels
    (`sylvester(p) / √p`). H is symmetric and orthonormal, so `rotate(rotate(x, p), p)` is x up to float32
    rounding. Module docstring, "Rotated values".

    Args:
        x: [..., d] float32, p dividing d.

    Returns:
        [..., d] float32, a new tensor.
    """
    blocks = x.unflatten(-1, (x.shape[-1] // p, p))  # [..., d / p, p]
    return (blocks.reshape(-1, p) @ sylvester(p, str(x.device))).mul_(p**-0.5).view(x.shape)


def coding_for(d: int) -> dict:
    """The values' coding a quantized file uses for heads of dimension d: Hadamard-rotated groups of
    G = min(`DEFAULT_KV_VALUE_GROUP`, d) channels where G is a power of 2 dividing d (every model we ship: G = 64),
    else KIVI's unrotated groups of `DEFAULT_KV_GROUP`. {"value_group": G, "rotated": bool}."""
    try:
        return {"value_group": rotation_block(d, min(DEFAULT_KV_VALUE_GROUP, d)), "rotated": True}
    except ValueError:
        return {"value_group": DEFAULT_KV_GROUP, "rotated": False}


def quantize_entry(
    x: torch.Tensor, kind: str, bits: int, group: int, recent: int, sink: int = 0, *, rotated: bool = False
) -> dict[str, torch.Tensor]:
    """One layer's keys or values as file tensors: the parts `PARTS` (module docstring), and with `sink` > 0 the
    part "sink" too (format 5).

    Args:
        x: [H_kv, len, d] keys (`kind` "keys": per channel) or values ("values": per token), model dtype.
        bits: 8, 4 or 2. group: G entries per group.
        recent: r, the newest tokens kept in the model's dtype (min(r, len)).
        sink: s, the first tokens kept in the model's dtype (min(s, len - r)): the attention sinks, which most
            queries attend to and whose keys would widen the first key group.
        rotated: values only (format 6): quantize `rotate(x, group)` of the quantized tokens (sink and recent
            tokens stay as they are).

    Returns:
        {"codes": [H_kv, m, ceil(d · bits / 8)] uint8 (m = len - s - r), "scale" and "zero" float16 (keys:
        [H_kv, ceil(m / G), d], values: [H_kv, m, ceil(d / G)]), "recent": [H_kv, r, d], and with sink > 0
        "sink": [H_kv, s, d]}.

    Raises:
        ValueError: as `quantize`; `rotated` keys (their groups run along the tokens: a rotation of the channels
            would mix the outlier channels that per-channel groups isolate), or a group `rotation_block` refuses.
    """
    if rotated and kind == "keys":
        raise ValueError("only values are rotated before quantization")
    r = min(recent, x.shape[1])
    s = min(sink, x.shape[1] - r)
    old, new = x[:, s : x.shape[1] - r], x[:, x.shape[1] - r :]
    if rotated:
        old = rotate(old.float(), rotation_block(x.shape[-1], group))
    codes, scale, zero = quantize(old, bits, -2 if kind == "keys" else -1, group)
    out = {"codes": pack(codes, bits), "scale": scale, "zero": zero, "recent": new.contiguous()}
    if sink > 0:
        out["sink"] = x[:, :s].contiguous()
    return out


def dequantize_entry(
    parts: dict[str, torch.Tensor], kind: str, bits: int, group: int, width: int, *, rotated: bool = False
) -> torch.Tensor:
    """Inverse of `quantize_entry` (with the same `rotated`): [H_kv, len, d] in the dtype of the `recent` part
    (the "sink" part, when present, first; then the quantized tokens; then the recent ones).

    Raises:
        ValueError: a part missing or of the wrong dtype or shape, non-finite or non-positive scales,
            non-finite zeros (a damaged file), naming the part.
    """
    codes, scale, zero, recent = (parts[p] for p in PARTS)
    sink = parts.get("sink")
    heads, m = codes.shape[0], codes.shape[1] if codes.dim() == 3 else -1
    groups = (heads, -(-m // group), width) if kind == "keys" else (heads, m, -(-width // group))
    if codes.dtype != torch.uint8 or codes.shape[-1] != -(-width * bits // 8) or m < 0:
        raise ValueError(f"{kind} codes of shape {tuple(codes.shape)} and dtype {codes.dtype} do not fit")
    for name, t in (("recent", recent), ("sink", sink)):
        if t is not None and (t.dim() != 3 or t.shape[0] != heads or t.shape[2] != width or t.dtype != recent.dtype):
            raise ValueError(f"{kind} {name} tokens of shape {tuple(t.shape)} do not fit")
    for name, t in (("scale", scale), ("zero", zero)):
        if t.dtype != torch.float16 or tuple(t.shape) != groups:
            raise ValueError(f"{kind} {name}s of shape {tuple(t.shape)} ({t.dtype}) do not fit {groups}")
    if not bool(torch.isfinite(scale).all() and (scale > 0).all() and torch.isfinite(zero).all()):
        raise DamagedTensorError(f"{kind}: quantization scales or zeros are damaged (non-finite or not positive)")
    s = 0 if sink is None else sink.shape[1]
    out = recent.new_empty(heads, s + m + recent.shape[1], width)  # [H_kv, len, d]
    if sink is not None:
        out[:, :s].copy_(sink)
    if kind == "keys":
        dequantize_keys(out[:, s : s + m], parts, bits, group)  # `dequantize`
    else:
        dequantize_values(out[:, s : s + m], parts, bits, group, rotated=rotated)
    out[:, s + m :].copy_(recent)
    return out


def quantized_bytes(parts: dict[str, torch.Tensor]) -> int:
    """Bytes of one entry's file tensors."""
    return sum(t.numel() * t.element_size() for t in parts.values())


def entry_bytes(
    heads: int, length: int, dim: int, elem_bytes: int, kind: str, bits: int, group: int, recent: int, sink: int = 0
) -> int:
    """Bytes of the file tensors `quantize_entry` writes for a [heads, length, dim] entry whose elements take
    `elem_bytes`, from its shape alone (no quantizing): packed codes, float16 scales and zeros (keys: per
    channel, ceil(m / G) groups of tokens; values: per token, ceil(dim / G) groups of channels), and the recent
    and sink tokens in the model's dtype. Equals `quantized_bytes(quantize_entry(x, ...))`."""
    r = min(recent, length)
    s = min(sink, length - r)
    m = length - s - r
    groups = -(-m // group) * dim if kind == "keys" else m * -(-dim // group)
    return heads * (m * -(-dim * bits // 8) + 2 * 2 * groups + (r + s) * dim * elem_bytes)


def codes_float(packed: torch.Tensor, bits: int, width: int) -> torch.Tensor:
    """`kvquant.unpack` as float32: [.., ceil(width · bits / 8)] uint8 -> [.., width] float32 codes (the codes of
    each position in a byte written straight into their channels, no uint8 intermediate)."""
    if bits == 8:
        return packed.float()
    per, mask = 8 // bits, 2**bits - 1
    out = torch.empty(*packed.shape[:-1], per * packed.shape[-1], dtype=torch.float32, device=packed.device)
    for j in range(per):
        out[..., j::per].copy_((packed >> (bits * j)) & mask if j + 1 < per else packed >> (bits * j))
    return out[..., :width]


def _block(group: int) -> int:
    """Tokens per dequantization block: about `BLOCK`, a multiple of the key group G (blocks hold whole groups)."""
    return max(group, BLOCK // group * group)


def dequantize_keys(
    out: torch.Tensor, parts: dict[str, torch.Tensor], bits: int, group: int, group_of: torch.Tensor | None = None
) -> None:
    """out [H_kv, m, d] (model dtype) <- codes · scale + zero, per channel and key group, in float32 then the
    dtype: `kvquant.dequantize`'s arithmetic (a product, then a sum, both rounded to float32), bit for bit.

    Args:
        parts: "codes" [H_kv, m, ceil(d · bits / 8)] uint8 (packed), "scale" / "zero" [H_kv, groups, d] float16.
        group_of: [H_kv, m] int32 each slot's group, or None (slot i in group i // G).
    """
    heads, m, d = out.shape
    scale, zero = parts["scale"], parts["zero"]
    step = _block(group)
    for a in range(0, m, step):
        b = min(a + step, m)
        c = codes_float(parts["codes"][:, a:b], bits, d)  # [H_kv, n, d]
        if group_of is None:  # whole groups as [H_kv, groups, G, d], then a shorter last one
            first, whole = a // group, (b - a) // group
            if whole:
                body = c[:, : whole * group].unflatten(1, (whole, group))  # a view of c
                body.mul_(scale[:, first : first + whole, None]).add_(zero[:, first : first + whole, None])
            if whole * group < b - a:
                c[:, whole * group :].mul_(scale[:, first + whole, None]).add_(zero[:, first + whole, None])
        else:  # after an eviction: each slot's own group, looked up in float16 (exact in float32)
            rows = group_of[:, a:b].long() + torch.arange(heads, device=c.device).unsqueeze(1) * scale.shape[1]
            rows = rows.flatten()  # [H_kv · n] rows of the flattened [H_kv · groups, d] scales
            c.mul_(scale.flatten(0, 1).index_select(0, rows).view(c.shape))
            c.add_(zero.flatten(0, 1).index_select(0, rows).view(c.shape))
        out[:, a:b].copy_(c)


def dequantize_values(
    out: torch.Tensor, parts: dict[str, torch.Tensor], bits: int, group: int, *, rotated: bool = False
) -> None:
    """out [H_kv, m, d] (model dtype) <- codes · scale + zero per token and channel group (as `dequantize_keys`);
    with `rotated`, that times the Hadamard matrix, computed as s · (H c) / √G + z · √G · e_0 per group (module
    docstring, "Rotated values": exact in the codes, so each row's result depends on its own codes only).

    Args:
        parts: "codes" [H_kv, m, ceil(d · bits / 8)] uint8 (packed), "scale" / "zero" [H_kv, m, ceil(d / G)] float16.

    Raises:
        ValueError: `rotated` with a group `rotation_block` refuses.
    """
    heads, m, d = out.shape
    scale, zero = parts["scale"], parts["zero"]
    whole = d // group  # whole channel groups; a shorter last one when G does not divide d
    h = sylvester(rotation_block(d, group), str(out.device)) if rotated else None
    for a in range(0, m, BLOCK):
        b = min(a + BLOCK, m)
        c = codes_float(parts["codes"][:, a:b], bits, d)  # [H_kv, n, d]
        if h is not None:
            turned = (c.reshape(-1, group) @ h).view(heads, b - a, whole, group)  # H c: integer sums, exact
            turned.mul_(scale[:, a:b, :, None].float() * group**-0.5)
            turned[..., 0].add_(zero[:, a:b].float() * group**0.5)  # z · (H 1) = z · √G · e_0
            out[:, a:b].copy_(turned.flatten(2))
            continue
        if whole:
            body = c[..., : whole * group].unflatten(2, (whole, group))  # [H_kv, n, groups, G]
            body.mul_(scale[:, a:b, :whole, None]).add_(zero[:, a:b, :whole, None])
        if whole * group < d:
            c[..., whole * group :].mul_(scale[:, a:b, whole:]).add_(zero[:, a:b, whole:])
        out[:, a:b].copy_(c)
