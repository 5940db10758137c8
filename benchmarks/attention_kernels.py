"""The prefill's causal attention through the CPU kernels torch has: SDPA and compiled FlexAttention.

At 8K-16K tokens a prefill is mostly attention (benchmarks/speed.md), so a faster prefill needs a
faster causal kernel than SDPA's CPU flash kernel. This times one causal GQA attention call of the
default model's shape (14 query heads, 2 KV heads, d = 64, bf16 unless --dtype) at each length
through `F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)` and through
`torch.compile(flex_attention)` with a causal block mask (its compile time printed apart), best of
`--repeats` after one warm-up, and prints GFLOP/s counted on the causal half (4 · n² / 2 · d · H),
with the largest difference between the two outputs.

    python benchmarks/attention_kernels.py --lengths 4096,8192 --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F


def best_seconds(fn, args: tuple, kwargs: dict, repeats: int) -> float:
    """Best wall time of `repeats` calls fn(*args, **kwargs) after one warm-up call."""
    fn(*args, **kwargs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="4096,8192")
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    compiled = torch.compile(flex_attention)
    print(f"$ {' '.join(sys.argv)}")
    print(
        f"# torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, H = {args.heads}, "
        f"KV heads = {args.kv_heads}, d = {args.head_dim}"
    )
    print("\n| tokens | kernel | seconds (best) | GFLOP/s (causal half) | compile s | max abs diff vs SDPA |")
    print("|---:|---|---:|---:|---:|---:|")
    g = torch.Generator().manual_seed(0)
    for n in [int(x) for x in args.lengths.split(",") if x]:
        q = torch.randn(1, args.heads, n, args.head_dim, generator=g).to(dtype)
        k, v = (torch.randn(1, args.kv_heads, n, args.head_dim, generator=g).to(dtype) for _ in range(2))
        flops = 4 * n * n / 2 * args.head_dim * args.heads
        sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        causal = {"is_causal": True, "enable_gqa": True}
        t = best_seconds(F.scaled_dot_product_attention, (q, k, v), causal, args.repeats)
        print(f"| {n:,} | SDPA | {t:.2f} | {flops / t / 1e9:.0f} | – | – |", flush=True)
        start = time.perf_counter()
        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device="cpu")
        out = compiled(q, k, v, block_mask=mask, enable_gqa=True)
        compile_s = time.perf_counter() - start
        t = best_seconds(compiled, (q, k, v), {"block_mask": mask, "enable_gqa": True}, args.repeats)
        diff = (out.float() - sdpa.float()).abs().max().item()
        print(
            f"| {n:,} | FlexAttention (compiled) | {t:.2f} | {flops / t / 1e9:.0f} | {compile_s:.1f} | {diff:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
