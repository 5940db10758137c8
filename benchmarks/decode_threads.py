"""Decode speed on 1 thread, on every core, and under the default thread policy (`tasks.threads`).

Without `--threads`, cake prefills on the idle cores, starts decoding on as many, and then follows the load
(`tasks.threads.DecodeGovernor`). This measures that choice: the same CAKE prefill (B = 256) of a
real prompt (the Python docs text the speed benchmark uses), then greedy decoding on 1 thread, on
every core (fixed) and under auto, alternating, side by side in one run, with the median tokens/s
of each. Run it alone (nothing else on the cores), then with `--busy` (a spinning process holds
one core) to see auto step down.

    python benchmarks/decode_threads.py --model qwen2.5-coder-0.5b --length 4096 [--busy]

Prints one Markdown table on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import nullcontext

from cake_cli.bench.corpus import python_docs_text
from cake_cli.bench.speed.paths import busy_core
from cake_cli.bench.speed.rows import config_for, measure
from cake_cli.engine.config import CakeConfig
from cake_cli.tasks.request import TaskRequest
from cake_cli.tasks.runner import ready_model
from cake_cli.tasks.threads import Threads, choose, usable_cores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model name or path (default: the embedded default)")
    parser.add_argument("--length", type=int, default=4096, help="prompt tokens")
    parser.add_argument("--budget", type=int, default=256, help="B, tokens per layer")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per thread count (alternating)")
    parser.add_argument("--busy", action="store_true", help="a spinning process holds one core meanwhile")
    args = parser.parse_args()
    ready = ready_model(TaskRequest(task="qa", document="-", model=args.model))
    loaded = ready.loaded
    ids = loaded.tokenizer(python_docs_text(), add_special_tokens=False)["input_ids"][: args.length]
    import torch

    prompt = torch.tensor([ids], device=loaded.device)
    config = config_for("cake", CakeConfig(budget=args.budget))
    cores = usable_cores()
    cases = {str(n): Threads(cores, n, "fixed") for n in sorted({1, cores})}
    speeds: dict[str, list[float]] = {name: [] for name in [*cases, "auto"]}
    measure(loaded.model, prompt[:, :256], config, 4, Threads(cores, 1, "warm-up"))
    with busy_core() if args.busy else nullcontext():
        for r in range(args.repeats):
            for name in speeds:
                print(f"decode threads {name}, run {r + 1}/{args.repeats}", file=sys.stderr)
                threads = cases.get(name) or choose(None)
                run = measure(loaded.model, prompt, config, args.new_tokens, threads)
                speeds[name].append(run["decode_tokens_per_second"])
    name = loaded.profile.name if loaded.profile else loaded.name
    dtype = str(loaded.dtype).replace("torch.", "")
    load = "one core busy" if args.busy else "quiet"
    tokens = f"{len(ids)}-token prompt · CAKE B = {args.budget} · {args.new_tokens} new tokens"
    print(f"{name} · {dtype} · {tokens} · {load}")
    print("\n| decode threads | tokens/s (median) | runs |\n|---:|---:|---|")
    for name, values in speeds.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {statistics.median(values):.2f} | {runs} |")


if __name__ == "__main__":
    main()
