"""Where quantized keys and values lose accuracy: per layer, the relative error of keys, values and the window's
attention output for several quantization schemes, on the default model's real KV cache of a real document.

The document (default: the first 4,096 tokens of CPython's `argparse.py`) is run through the model once (no
eviction); a forward pre-hook on every attention module records its input, from which the keys (rotated, with
Qwen's k_proj bias), the values and the last `--window` tokens' queries are computed as the model computes them.
Each scheme quantizes and dequantizes a layer's keys and values (`engine.kvquant`, grouped affine with the
bound-keeping rounding of the file) and the script reports, per layer, the relative Frobenius errors
||K' - K|| / ||K||, ||V' - V|| / ||V|| and ||O' - O|| / ||O||, O = softmax(q K^T / sqrt(d) + causal mask) V over
every prefix token for the window's queries (float32, GQA), and each scheme's file size as a
fraction of the 16-bit keys and values (codes, scales, zeros and exact tokens of this document's length).

Schemes (KIVI, Liu et al. 2024, arXiv 2402.02750: keys per channel, values per token): `kivi` the file's layout
before format 5 (keys per channel in groups of G tokens, values per token in groups of G channels, float16
scales and zeros, the last 32 tokens exact); `keys/token` keys quantized per token like values (the layout KIVI
argues against); `keys/token-bias` the same after subtracting each channel's mean over the document (kept exact:
Qwen's k_proj bias and outlier channels); `G` the group size; `sink S` the first S tokens kept exact;
`recent R` the newest R tokens exact (KIVI's residual); `scales bf16 / fp32` the scales' and zeros' format;
`values rotated` the values' channels multiplied by an orthonormal Hadamard matrix (blocks of d & -d
channels) before quantization and by its transpose after (QuaRot's rotation, Ashkboos et al. 2024;
`kvquant.rotate`; the file since format 6 rotates blocks of one value group). The `f6 ...` schemes take format 6's
layout (sink 4, values rotated in groups of 64) and add KVQuant's ways (Hooper et al. 2024, arXiv 2401.18079):
`pre-RoPE` keys quantized before the rotary embedding and rotated after, `nuq` 2^bits levels per layer fitted
by k-means to the group-normalized entries instead of uniform ones, `outliers P%` each vector's P% entries
farthest from its mean kept exact (`level_quant`). `--schemes` runs only the schemes whose names start so.

    python benchmarks/kv_quant_error.py -o benchmarks/runs/kv-quant-error-qwen.json \
        > benchmarks/runs/kv-quant-error-qwen.txt
    python benchmarks/kv_quant_error.py --bits 2,4 --schemes "sink 4 values rotated v64,f6" \
        -o benchmarks/runs/kv-quant-error-kvquant-qwen.json > benchmarks/runs/kv-quant-error-kvquant-qwen.txt
"""

from __future__ import annotations

import argparse
import json
import math
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from cake_cli.engine import kvquant
from cake_cli.models.loader import load_model


@dataclass(frozen=True)
class Scheme:
    """One way to quantize a layer: keys along `key_axis` ("channel": groups of `group` tokens per channel; "token":
    groups of `group` channels per token), values per token in groups of min(group, d) channels."""

    name: str
    bits: int
    group: int = 32
    key_axis: str = "channel"
    sink: int = 0  # first tokens kept exact
    recent: int = 32  # newest tokens kept exact
    scale_dtype: torch.dtype = torch.float16
    center_keys: bool = False  # subtract each channel's mean (stored exact) before quantizing keys
    value_group: int | None = None  # channels per value group (None: min(group, d))
    rotate_values: bool = False  # quantize V·H (H an orthonormal Hadamard matrix over the channels), then undo it
    pre_rope: bool = False  # quantize the keys before the rotary embedding, apply it after (KVQuant)
    levels: str = "uniform"  # "kmeans": 2^bits levels per layer fitted to the normalized entries (KVQuant's nuq)
    outliers: float = 0.0  # this fraction of each vector's entries farthest from its mean kept exact (sparse)

    def file_ratio(self, n: int, d: int) -> float:
        """Bytes of keys + values as a fraction of 16-bit ones, for one KV head of n tokens, head dim d."""
        exact = min(self.sink + self.recent, n)
        m = n - exact
        sbits = torch.finfo(self.scale_dtype).bits
        vg = self.value_group or min(self.group, d)
        key_groups = math.ceil(m / self.group) * d if self.key_axis == "channel" else m * math.ceil(d / self.group)
        val_groups = m * math.ceil(d / vg)
        bits = 2 * m * math.ceil(d * self.bits / 8) * 8 + 2 * sbits * (key_groups + val_groups) + 2 * 16 * exact * d
        bits += 16 * d if self.center_keys else 0
        bits += 2 * round(self.outliers * m * d) * (16 + 16)  # each outlier: its 16-bit value and a 16-bit index
        return bits / (2 * 16 * n * d)


def fake_quant(x: torch.Tensor, scheme: Scheme, kind: str) -> torch.Tensor:
    """x [H_kv, n, d] float32 -> its dequantized copy under `scheme` (exact sink and recent tokens)."""
    n, d = x.shape[1], x.shape[2]
    lo, hi = min(scheme.sink, n), max(n - scheme.recent, min(scheme.sink, n))
    out = x.clone()
    mid = x[:, lo:hi]
    if mid.shape[1] == 0:
        return out
    shift = torch.zeros(1, 1, d)
    if kind == "keys" and scheme.center_keys:
        shift = x.mean(dim=1, keepdim=True)
    rotated = kind == "values" and scheme.rotate_values
    if rotated:
        mid = kvquant.rotate(mid, d & -d)  # outlier channels spread over a block (QuaRot, Ashkboos et al. 2024)
    by_channel = kind == "keys" and scheme.key_axis == "channel"
    group = scheme.group if kind == "keys" else (scheme.value_group or min(scheme.group, d))
    dim = -2 if by_channel else -1
    if scheme.levels != "uniform" or scheme.outliers:
        back = level_quant(mid - shift, scheme, dim, group) + shift
    else:
        codes, scale, zero = kvquant.quantize(mid - shift, scheme.bits, dim, group, scheme.scale_dtype)
        back = kvquant.dequantize(codes, scale, zero, dim, group) + shift
    out[:, lo:hi] = kvquant.rotate(back, d & -d) if rotated else back  # H = H^T = H^-1
    return out


def level_quant(x: torch.Tensor, scheme: Scheme, dim: int, group: int) -> torch.Tensor:
    """x [H_kv, m, d] -> its dequantized copy: groups of `group` entries along `dim`, each mapped to [0, 1] by its
    own min and max (in `scheme.scale_dtype`) and rounded to the nearest of 2^bits levels, uniform or fitted by
    1-D k-means to this tensor's normalized entries (KVQuant's non-uniform datatype, Hooper et al. 2024,
    arXiv 2401.18079, fitted here per layer without its sensitivity weights); with `scheme.outliers` the entries of
    each vector along `dim` farthest from its mean are kept exact and left out of their group's range (KVQuant's
    dense-and-sparse split)."""
    y = x.movedim(dim, -1)  # [H_kv, a, L]: groups along the last dimension
    length = y.shape[-1]
    pad = -length % group
    y = torch.cat([y, y[..., -1:].expand(*y.shape[:-1], pad)], -1) if pad else y
    exact = torch.zeros_like(y, dtype=torch.bool)
    if scheme.outliers:
        far = (y[..., :length] - y[..., :length].mean(-1, keepdim=True)).abs()
        count = round(scheme.outliers * length)
        if count:
            cut = far.kthvalue(length - count + 1, dim=-1, keepdim=True).values
            exact[..., :length] = far >= cut
    g = y.unflatten(-1, (-1, group))  # [H_kv, a, L / G, G]
    e = exact.unflatten(-1, (-1, group))
    lo = g.masked_fill(e, float("inf")).amin(-1, keepdim=True)
    hi = g.masked_fill(e, float("-inf")).amax(-1, keepdim=True)
    lo, hi = torch.where(torch.isinf(lo), g[..., :1], lo), torch.where(torch.isinf(hi), g[..., :1], hi)
    lo = lo.to(scheme.scale_dtype).float()
    span = (hi - lo).to(scheme.scale_dtype).float().clamp_min(1e-12)
    u = ((g - lo) / span).clamp(0, 1)
    count = 2**scheme.bits
    levels = torch.linspace(0, 1, count)
    if scheme.levels == "kmeans":
        data = u[~e]
        for _ in range(25):  # Lloyd's iterations from the uniform levels
            nearest = (data[:, None] - levels[None, :]).abs().argmin(-1)
            sums = torch.zeros(count).index_add_(0, nearest, data)
            sizes = torch.zeros(count).index_add_(0, nearest, torch.ones_like(data))
            levels = torch.where(sizes > 0, sums / sizes.clamp_min(1), levels).sort().values
    code = (u.unsqueeze(-1) - levels).abs().argmin(-1)
    back = torch.where(e, g, lo + levels[code] * span).flatten(-2)[..., :length]
    return back.movedim(-1, dim)


def rope(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """k [H_kv, n, d] before the rotary embedding -> after it (cos, sin [n, d]), as the model applies it."""
    half = k.shape[-1] // 2
    return k * cos + torch.cat([-k[..., half:], k[..., :half]], -1) * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [H, w, d] (the last w positions), k, v [H_kv, n, d] -> [H, w, d] float32, causal; query head h reads KV
    head h // (H / H_kv) (GQA). float32: its rounding (~1e-6 relative) is far below the errors measured."""
    heads, w, d = q.shape
    kv, n = k.shape[0], k.shape[1]
    grouped = q.float().reshape(kv, heads // kv * w, d)  # [H_kv, rep · w, d]: a KV head's query heads together
    scores = grouped @ k.float().transpose(1, 2) / math.sqrt(d)  # [H_kv, rep · w, n]
    future = torch.arange(n)[None, :] > (n - w + torch.arange(w))[:, None]  # [w, n]
    scores = scores.view(kv, heads // kv, w, n).masked_fill_(future, float("-inf")).flatten(1, 2)
    return (scores.softmax(-1) @ v.float()).view(heads, w, d)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def capture(model, ids: torch.Tensor, window: int) -> list[dict[str, torch.Tensor]]:
    """Per layer: keys, values [H_kv, n, d] float32 as the cache holds them, queries of the last `window` tokens
    [H, w, d], and the pre-RoPE key bias [H_kv, d] (zeros without one)."""
    layers: list[dict[str, torch.Tensor]] = []

    def hook(module, args, kwargs):
        hs = kwargs.get("hidden_states", args[0] if args else None)
        cos, sin = kwargs["position_embeddings"]
        shape = (*hs.shape[:-1], -1, module.head_dim)
        q = module.q_proj(hs[:, -window:]).view(1, hs[:, -window:].shape[1], -1, module.head_dim).transpose(1, 2)
        k = module.k_proj(hs).view(shape).transpose(1, 2)
        v = module.v_proj(hs).view(shape).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos[:, -window:], sin[:, -window:])
        pre = k
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
        bias = module.k_proj.bias
        bias = torch.zeros(k.shape[1], k.shape[-1]) if bias is None else bias.float().view(k.shape[1], -1)
        layers.append({"q": q[0].float(), "k": k[0].float(), "v": v[0].float(), "bias": bias.detach(),
                       "k_pre": pre[0].float(), "cos": cos[0].float(), "sin": sin[0].float()})  # fmt: skip

    handles = [layer.self_attn.register_forward_pre_hook(hook, with_kwargs=True) for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return layers


def schemes(bits_list: list[int]) -> list[Scheme]:
    out = []
    for bits in bits_list:
        out += [
            Scheme(f"kivi {bits}", bits),
            Scheme(f"keys/token {bits}", bits, key_axis="token"),
            Scheme(f"keys/token-bias {bits}", bits, key_axis="token", center_keys=True),
            Scheme(f"recent 0 {bits}", bits, recent=0),
            Scheme(f"recent 128 {bits}", bits, recent=128),
            Scheme(f"sink 4 {bits}", bits, sink=4),
            Scheme(f"G64 {bits}", bits, group=64),
            Scheme(f"G128/v32 {bits}", bits, group=128, value_group=32),
            Scheme(f"G128/v32 sink 4 {bits}", bits, group=128, value_group=32, sink=4),
            Scheme(f"sink 4 recent 128 {bits}", bits, sink=4, recent=128),
            Scheme(f"sink 4 v16 {bits}", bits, sink=4, value_group=16),
            Scheme(f"sink 4 recent 128 v16 {bits}", bits, sink=4, recent=128, value_group=16),
            Scheme(f"sink 4 values rotated {bits}", bits, sink=4, rotate_values=True),
            Scheme(f"sink 4 values rotated v64 {bits}", bits, sink=4, rotate_values=True, value_group=64),
            Scheme(f"scales bf16 {bits}", bits, scale_dtype=torch.bfloat16),
            Scheme(f"scales fp32 {bits}", bits, scale_dtype=torch.float32),
        ]
        f6 = dict(sink=4, rotate_values=True, value_group=64)  # the file's layout since format 6
        out += [
            Scheme(f"f6 pre-RoPE {bits}", bits, **f6, pre_rope=True),
            Scheme(f"f6 nuq {bits}", bits, **f6, levels="kmeans"),
            Scheme(f"f6 outliers 0.5% {bits}", bits, **f6, outliers=0.005),
            Scheme(f"f6 pre-RoPE nuq {bits}", bits, **f6, pre_rope=True, levels="kmeans"),
            Scheme(f"f6 pre-RoPE outliers 0.5% {bits}", bits, **f6, pre_rope=True, outliers=0.005),
            Scheme(f"f6 pre-RoPE nuq outliers 0.5% {bits}", bits, **f6, pre_rope=True, levels="kmeans", outliers=0.005),
            Scheme(f"f6 pre-RoPE nuq outliers 1% {bits}", bits, **f6, pre_rope=True, levels="kmeans", outliers=0.01),
        ]
    return out


def outliers(layer: dict[str, torch.Tensor]) -> dict[str, float]:
    """The keys' channel structure: the largest channel mean over the median channel spread, the bias's share of
    the key norm, and the first token's key and value norms over the median token's."""
    k, v = layer["k"], layer["v"]
    mean, spread = k.mean(1).abs(), k.std(1)  # [H_kv, d]
    norms_k, norms_v = k.norm(dim=-1), v.norm(dim=-1)  # [H_kv, n]
    return {
        "channel_mean_over_median_std": float((mean.amax(1) / spread.median(1).values).max()),
        "channel_std_max_over_median": float((spread.amax(1) / spread.median(1).values).max()),
        "bias_norm_over_key_rms": float(layer["bias"].norm() / k.pow(2).sum(-1).mean().sqrt() / math.sqrt(k.shape[0])),
        "sink_key_norm_over_median": float((norms_k[:, 0] / norms_k.median(1).values).max()),
        "sink_value_norm_over_median": float((norms_v[:, 0] / norms_v.median(1).values).max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or path (default: the embedded default)")
    parser.add_argument("--text", type=Path, default=Path(sysconfig.get_paths()["stdlib"]) / "argparse.py")
    parser.add_argument("--tokens", type=int, default=4096, help="the text's first N tokens")
    parser.add_argument("--window", type=int, default=32, help="queries of the last N tokens")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bits", default="4,2,8", help="bit widths of the schemes, comma-separated")
    parser.add_argument("--schemes", default="", help="only the schemes whose names start with one of these "
                        "(comma-separated; default: all)")  # fmt: skip
    parser.add_argument("-o", "--output", type=Path, default=None, help="JSON with every layer's numbers")
    args = parser.parse_args()
    args.bits = [int(b) for b in args.bits.split(",")]
    torch.set_num_threads(args.threads)
    lm = load_model(args.model)
    ids = lm.tokenizer(args.text.read_text(encoding="utf-8"), return_tensors="pt").input_ids[:, : args.tokens]
    began = time.perf_counter()
    layers = capture(lm.model, ids, args.window)
    n, d = layers[0]["k"].shape[1], layers[0]["k"].shape[2]
    print(f"model {lm.name} ({lm.dtype}), {args.text}: first {n} tokens, window {args.window}, head dim {d}")
    print(f"forward {time.perf_counter() - began:.1f} s\n")
    print("key structure per layer (max over KV heads):")
    print("| layer | channel mean / median std | max channel std / median | bias / key rms | sink key | sink value |")
    print("|---:|---:|---:|---:|---:|---:|")
    stats = [outliers(layer) for layer in layers]
    for i, s in enumerate(stats):
        print(f"| {i} | " + " | ".join(f"{v:.2f}" for v in s.values()) + " |")
    refs = [attention(layer["q"], layer["k"], layer["v"]) for layer in layers]
    print("\nrelative error, mean (max) over layers; file = keys + values bytes / 16-bit ones at this length:")
    print("| scheme | file | keys | values | attention output | attention, keys only |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)
    rows = []
    wanted = tuple(w for w in args.schemes.split(",") if w)
    for scheme in [s for s in schemes(args.bits) if not wanted or s.name.startswith(wanted)]:
        per = []
        for layer, ref in zip(layers, refs):
            if scheme.pre_rope:
                k = rope(fake_quant(layer["k_pre"], scheme, "keys"), layer["cos"], layer["sin"])
            else:
                k = fake_quant(layer["k"], scheme, "keys")
            v = fake_quant(layer["v"], scheme, "values")
            per.append(
                {
                    "keys": rel(k, layer["k"]),
                    "values": rel(v, layer["v"]),
                    "attention": rel(attention(layer["q"], k, v), ref),
                    "attention_keys_only": rel(attention(layer["q"], k, layer["v"]), ref),
                }
            )
        row = {"scheme": scheme.name, "bits": scheme.bits, "file_ratio": scheme.file_ratio(n, d), "layers": per}
        rows.append(row)
        cells = []
        for key in ("keys", "values", "attention", "attention_keys_only"):
            vals = [p[key] for p in row["layers"]]
            cells.append(f"{sum(vals) / len(vals):.4f} ({max(vals):.4f})")
        print(f"| {row['scheme']} | {row['file_ratio']:.3f} | " + " | ".join(cells) + " |", flush=True)
        if args.output:
            meta = {"model": lm.name, "text": str(args.text), "tokens": n, "window": args.window, "head_dim": d}
            args.output.write_text(json.dumps({"meta": meta, "key_structure": stats, "schemes": rows}, indent=1) + "\n")
    print("\nattention output error per layer (selected schemes):")
    chosen = [r for r in rows if r["scheme"].rsplit(" ", 1)[0] in ("kivi", "sink 4", "recent 128") and r["bits"] < 8]
    print("| layer | " + " | ".join(r["scheme"] for r in chosen) + " |")
    print("|---:|" + "---:|" * len(chosen))
    for i in range(len(layers)):
        print(f"| {i} | " + " | ".join(f"{r['layers'][i]['attention']:.4f}" for r in chosen) + " |")


if __name__ == "__main__":
    main()
