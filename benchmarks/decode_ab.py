"""Decode-step time of the weight formats and attention paths, side by side in one process.

Loads the model once (bf16), makes one copy per asked weight format (`models.quantize`), fills
caches of the asked sizes with random keys/values (a step's cost does not depend on them), then
times one decode step of every case in turn, `--rounds` times after one warm-up round, so a busy
machine slows every case alike. Cases: CAKE (the fixed policy at capacity n, one eviction per step)
and the full cache at each size; the bf16 full cache also with the old attention (SDPA, before
`attention.fast_decode`). Prints one Markdown table (median ms per token and tok/s).

    python benchmarks/decode_ab.py --weights bf16,int8,int4 --cake 256 --full 8192 --rounds 5

Run with OMP_NUM_THREADS=1 (or --threads) to compare at one thread. Results:
benchmarks/runs/decode-profile-2026-12-02.md.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import cake_cli.engine.attention as attention
from cake_cli.engine.cache import CakeCache
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.decode import FixedDecode
from cake_cli.engine.generate import forward_step
from cake_cli.models.loader import load_model
from cake_cli.models.quantize import quantize_model


def filled_cache(config, n: int, cake: bool) -> CakeCache:
    """A cache of n random tokens per layer; with `cake`, the fixed policy at capacity n."""
    layers, kv = config.num_hidden_layers, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = CakeCache(layers)
    g = torch.Generator().manual_seed(0)
    for layer in cache.layers:
        keys = torch.randn(1, kv, n, dim, generator=g).bfloat16()  # [1, H_kv, n, d]
        layer.update(keys, torch.randn(1, kv, n, dim, generator=g).bfloat16())
    cache.tracking_peak = False
    if cake:
        cache.policy = FixedDecode(CakeConfig(budget=n), [n] * layers)
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--weights", default="bf16,int8,int4")
    parser.add_argument("--cake", default="256", help="CAKE capacities (tokens per layer), comma-separated")
    parser.add_argument("--full", default="8192", help="full-cache sizes (tokens), comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype="bfloat16")
    models = {}
    for scheme in args.weights.split(","):
        model = loaded.model if scheme == "bf16" else copy.deepcopy(loaded.model)
        quantize_model(model, scheme)
        attention.use_cake_attention(model, "sdpa")
        models[scheme] = model
    sizes = [(int(n), True) for n in args.cake.split(",") if n] + [(int(n), False) for n in args.full.split(",") if n]
    cases = [(n, cake, s, True) for n, cake in sizes for s in models]
    cases += [(n, False, "bf16", False) for n, cake in sizes if not cake and "bf16" in models]
    caches = {c: filled_cache(loaded.model.config, c[0], c[1]) for c in cases}
    position = {c: c[0] for c in cases}
    times: dict = {c: [] for c in cases}
    fast = attention.fast_decode
    ids = torch.tensor([[42]])
    with torch.inference_mode():
        for round_ in range(args.rounds + 1):
            for c in cases:
                attention.fast_decode = fast if c[3] else (lambda *a: False)  # the old path: the backend
                start = time.perf_counter()
                forward_step(models[c[2]], caches[c], ids, position[c], None)
                if round_:  # round 0 warms up
                    times[c].append(time.perf_counter() - start)
                position[c] += 1
    attention.fast_decode = fast
    print("| cache | weights | attention | ms/token (median) | tok/s | every round (ms) |")
    print("|---|---|---|---:|---:|---|")
    for n, cake, scheme, new in cases:
        med = statistics.median(times[(n, cake, scheme, new)])
        every = ", ".join(f"{1e3 * t:.0f}" for t in times[(n, cake, scheme, new)])
        where = f"CAKE B = {n}" if cake else f"full {n}"
        print(f"| {where} | {scheme} | {'new' if new else 'SDPA (old)'} | {1e3 * med:.1f} | {1 / med:.1f} | {every} |")


if __name__ == "__main__":
    main()
