"""Prefill time of weight formats and of w8a8's integer prefill, side by side in one process.

Loads the model once per asked (dtype, weights) pair (`load_model`, quantized weights from their
cache under CAKE_HOME), tokenizes CPython's language reference (`bench.corpus.python_docs_text`) to
each asked length, and times one CAKE prefill of it (`engine.generate.prefill`, the profile's method
cake-chunk at B = `--budget`) for every variant in turn, `--rounds` times after a short warm-up, so a
busy machine slows every variant alike. A variant is ``DTYPE:WEIGHTS``, and ``w8a8`` variants also
``DTYPE:w8a8-dequantized`` (`W8A8Linear.int8_prefill` off: the weight dequantized to the model's
dtype for prefill, as before the integer prefill). Prints one Markdown table: median prefill seconds
(min-max), tokens/s, and the median over rounds of each variant's time over the first variant's
(the ratio of two prefills of the same round).

    python benchmarks/prefill_ab.py --variants float32:w8a8-dequantized,float32:w8a8,bfloat16:int8,bfloat16:w8a8 \\
        --lengths 4096,8192 --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from cake_cli.bench.corpus import python_docs_text
from cake_cli.engine import attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import prefill
from cake_cli.models.loader import load_model
from cake_cli.models.quantize import W8A8Linear

DEQUANTIZED = "w8a8-dequantized"
WARM_TOKENS = 512


def parse_variant(text: str) -> tuple[str, str]:
    """'DTYPE:WEIGHTS' -> (dtype, weights). Raises SystemExit naming the expected form."""
    dtype, _, weights = text.partition(":")
    if not dtype or weights not in ("bf16", "int8", "int4", "w8a8", DEQUANTIZED):
        raise SystemExit(
            f"variant {text!r}: expected DTYPE:WEIGHTS, WEIGHTS one of bf16, int8, int4, w8a8, {DEQUANTIZED}"
        )
    return dtype, weights


def set_int8_prefill(model, on: bool) -> int:
    """Turn w8a8's integer prefill on or off in every `W8A8Linear` of `model`; returns how many."""
    layers = [m for m in model.modules() if isinstance(m, W8A8Linear)]
    for m in layers:
        m.int8_prefill = on
    return len(layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="profile name (default: the default model)")
    parser.add_argument(
        "--variants", default="float32:w8a8-dequantized,float32:w8a8", help="DTYPE:WEIGHTS, comma-separated"
    )
    parser.add_argument("--lengths", default="4096,8192", help="prompt lengths in tokens")
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = [parse_variant(v.strip()) for v in args.variants.split(",") if v.strip()]
    lengths = [int(n) for n in args.lengths.split(",") if n]
    models, tokenizer = {}, None
    for dtype, weights in variants:
        key = (dtype, "w8a8" if weights == DEQUANTIZED else weights)
        if key not in models:
            loaded = load_model(args.model, dtype=dtype, weights=key[1])
            attention.use_cake_attention(loaded.model, "sdpa")
            models[key], tokenizer = loaded.model, loaded.tokenizer
    ids = tokenizer(python_docs_text(), return_tensors="pt").input_ids
    config = CakeConfig(budget=args.budget, indicator="chunk")
    print(f"$ {' '.join(sys.argv)}")
    print(f"# {torch.__version__}, {torch.get_num_threads()} threads, cake-chunk B = {args.budget}")
    print("\n| tokens | variant | prefill s, median (min-max) | tokens/s | time / first variant's, median of rounds |")
    print("|---:|---|---:|---:|---:|")
    with torch.inference_mode():
        for n in lengths:
            times: dict = {v: [] for v in variants}
            for round_ in range(args.rounds + 1):
                for v in variants:
                    dtype, weights = v
                    model = models[(dtype, "w8a8" if weights == DEQUANTIZED else weights)]
                    set_int8_prefill(model, weights != DEQUANTIZED)
                    prompt = ids[:, : WARM_TOKENS if round_ == 0 else n]  # round 0 warms up
                    start = time.perf_counter()
                    prefill(model, prompt, config, collect_stats=False)
                    if round_:
                        times[v].append(time.perf_counter() - start)
                    print(
                        f"  {n} round {round_} {dtype}:{weights} {time.perf_counter() - start:.2f} s", file=sys.stderr
                    )
            first = times[variants[0]]
            for v in variants:
                t = times[v]
                ratio = statistics.median(a / b for a, b in zip(t, first, strict=True))
                print(
                    f"| {n:,} | {v[0]}:{v[1]} | {statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f}) "
                    f"| {n / statistics.median(t):.0f} | {ratio:.2f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
