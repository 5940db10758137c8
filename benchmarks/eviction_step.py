"""Time the fixed policy's batched eviction step (`decode.batched_victims`) on its own.

Builds P layers of the sizes CAKE gives the default model at B = 1024 after an 8K prefill
(338-2,148 slots a layer, 24 layers, 14 query heads over 2 KV heads; the sizes spread evenly over
that range, shuffled), random attention and positions, then runs `--steps` decode steps the way
`FixedDecode` does: each step's victims take the new token (the next position) and the step's
`following` order is passed to the next. Prints the median and minimum ms per step for each
pooling asked. Only the public call is used, so the same file times older commits too:

    OMP_NUM_THREADS=1 python benchmarks/eviction_step.py --pool avg:5,max:5 --steps 40
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cake_cli.engine.config import CakeConfig
from cake_cli.engine.decode import batched_victims


def layers(count: int, smallest: int, largest: int, heads: int, kv_heads: int, seed: int):
    """Random attention [H, 1, k_l] and distinct positions [H_kv, k_l] for `count` layers."""
    g = torch.Generator().manual_seed(seed)
    sizes = [int(x) for x in torch.linspace(smallest, largest, count)]
    sizes = [sizes[i] for i in torch.randperm(count, generator=g)]
    probs = [torch.softmax(torch.randn(heads, 1, k, generator=g), dim=-1) for k in sizes]
    positions = [torch.stack([torch.randperm(k, generator=g) for _ in range(kv_heads)]) for k in sizes]
    return probs, positions, [k - 1 for k in sizes]


def time_steps(config: CakeConfig, probs, positions, capacity, steps: int) -> list[float]:
    """Seconds per step over `steps` steps after two warm-up steps; the carried order is checked used."""
    positions = [p.clone() for p in positions]
    order, next_position, times, reused = None, max(int(p.max()) for p in positions) + 1, [], 0
    for step in range(steps + 2):
        start = time.perf_counter()
        victims = batched_victims(config, probs, positions, capacity, order=order)
        if step >= 2:
            times.append(time.perf_counter() - start)
            reused += victims.reused
        for layer, slots in enumerate(victims.slots):  # [H_kv]: the new token takes each victim's slot
            positions[layer][torch.arange(slots.shape[0]), slots] = next_position
        order, next_position = victims.following, next_position + 1
    if reused != steps:
        raise SystemExit(f"the carried order was used in {reused} of {steps} steps: the timing is not the usual step")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default="avg:5,max:5", help="poolings kind:kernel, comma-separated")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--sizes", default="338:2148", help="smallest:largest slots a layer")
    parser.add_argument("--heads", default="14:2", help="query heads:KV heads")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    smallest, largest = (int(x) for x in args.sizes.split(":"))
    heads, kv_heads = (int(x) for x in args.heads.split(":"))
    probs, positions, capacity = layers(args.layers, smallest, largest, heads, kv_heads, seed=0)
    print(f"{args.layers} layers, {smallest}-{largest} slots, {heads}/{kv_heads} heads, {args.threads} thread(s)")
    with torch.inference_mode():
        for spec in args.pool.split(","):
            kind, kernel = spec.split(":")
            config = CakeConfig(budget=1024, pool_kind=kind, pool_kernel=int(kernel))
            times = time_steps(config, probs, positions, capacity, args.steps)
            print(
                f"pool {kind} k={kernel}: {1e3 * statistics.median(times):.2f} ms/step median, "
                f"{1e3 * min(times):.2f} min, {args.steps} steps"
            )


if __name__ == "__main__":
    main()
