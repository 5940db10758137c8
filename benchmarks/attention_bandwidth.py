"""How far the full cache's decode attention is from reading its keys and values once.

One decode token attends over every layer's cache: two batched products per layer (scores q·Kᵀ and
the output p·V, `engine.attention.decode_attention`) read the layer's keys and values. At 8,192
tokens the default model (24 layers, 2 KV heads of 64, 7 query heads per KV head) holds 192 MiB of
float32 keys and values, more than any CPU cache, so a step can be no faster than streaming them
from memory. This times, on caches laid out like the model's (one [H_kv, n, d] tensor per layer and
side, cold: each layer's is evicted by the others before it is read again), per decode token:

- ``stream``: a sum over every key and value (the memory floor for these bytes);
- ``products``: the two float32 products of the engine's decode path (scores [H_kv, g, n]);
- ``products, hot``: the same on one layer's tensors read 24 times (cache-resident: the kernels'
  arithmetic alone);
- ``fp16 → float32``: keys and values stored as float16 (half the bytes), widened into one reused
  float32 buffer before each product (what a half-precision cache would cost on a CPU without
  half-precision products).

Cases run in turn, `--rounds` times after a warm-up round, so a slow spell falls on all alike; the
table gives each case's median ms per token and its min–max.

    python benchmarks/attention_bandwidth.py --tokens 8192 --threads 2 --rounds 7

Results: benchmarks/runs/attention-bandwidth-avx2-2026-12-04.txt.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    """Parse the arguments, time every case in turn, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192, help="cached tokens per layer (n)")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--group", type=int, default=7, help="query heads per KV head (g)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, layers, shape = args.tokens, args.layers, (args.kv_heads, args.tokens, args.head_dim)
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(shape, generator=g) for _ in range(layers)]  # [H_kv, n, d] float32, per layer
    values = [torch.randn(shape, generator=g) for _ in range(layers)]
    half_keys, half_values = [k.half() for k in keys], [v.half() for v in values]
    query = torch.randn(args.kv_heads, args.group, args.head_dim, generator=g)  # [H_kv, g, d]
    probs = torch.softmax(torch.randn(args.kv_heads, args.group, n, generator=g), dim=-1)  # [H_kv, g, n]
    wide_k, wide_v = torch.empty(shape), torch.empty(shape)

    def products(k: torch.Tensor, v: torch.Tensor) -> None:
        torch.bmm(query, k.transpose(1, 2))
        torch.bmm(probs, v)

    def widened(i: int) -> None:
        wide_k.copy_(half_keys[i])
        torch.bmm(query, wide_k.transpose(1, 2))
        wide_v.copy_(half_values[i])
        torch.bmm(probs, wide_v)

    cases = {
        "stream (sum of every key and value)": lambda i: (keys[i].sum(), values[i].sum()),
        "products (engine's decode path)": lambda i: products(keys[i], values[i]),
        "products, hot (one layer's tensors)": lambda i: products(keys[0], values[0]),
        "fp16 → float32, then products": widened,
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(args.rounds + 1):
        for name, step in cases.items():
            start = time.perf_counter()
            for i in range(layers):
                step(i)
            if round_:  # round 0 warms up
                times[name].append(time.perf_counter() - start)
    mib = 2 * layers * keys[0].numel() * 4 / 2**20
    print(f"{n} tokens, {layers} layers, float32 keys + values {mib:.0f} MiB, {args.threads} threads")
    print("| case | ms per token (median) | min–max |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        print(f"| {name} | {1e3 * statistics.median(ts):.1f} | {1e3 * min(ts):.1f}–{1e3 * max(ts):.1f} |")


if __name__ == "__main__":
    main()
