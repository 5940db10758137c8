"""kvpress's SnapKV press through its own pipeline, timed: run by `cake bench speed --kvpress`
inside .venv-kvpress (benchmarks/kvpress_env.sh), on the same converted checkpoint, document,
budget, threads and number of new tokens as cake-cli's rows, with the same warm-up (one unmeasured
run on the document's first --warmup-tokens tokens, --warmup-new-tokens new tokens) and --repeats
timed runs. Prints one JSON object: the median of each measurement, and under "samples" every
repeat's timings.

The pipeline prefills the context with the press (the model's forward without the LM head), then
runs the question forward and greedy decoding; the wrapper times the prefill call and each
one-token decode call, and the KV bytes are read from the cache tensors right after prefill.
kvpress's SnapKV uses its own defaults (observation window 64, max-pool kernel 5).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from kvpress import SnapKVPress
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, pipeline


def kv_bytes(cache) -> int:
    return sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in cache.layers)


def one_run(pipe, model, ids, context, args, new_tokens: int | None = None) -> dict:
    """One timed pipeline call (see the module docstring)."""
    timings = {"prefill": 0.0, "decode": [], "kv": 0, "context": 0}
    inner, outer = model.model.forward, model.forward

    def timed_inner(*a, **k):  # first call: the compressed prefill, model.model(input_ids=context, …)
        if timings["context"]:  # later calls come from model.forward (question, decoding)
            return inner(*a, **k)
        start = time.perf_counter()
        out = inner(*a, **k)
        timings["prefill"] = time.perf_counter() - start
        timings["kv"] = kv_bytes(k["past_key_values"])
        timings["context"] = k["input_ids"].shape[1]
        torch.set_num_threads(args.decode_threads)
        return out

    def timed_outer(*a, **k):  # question forward, then one call per generated token
        start = time.perf_counter()
        out = outer(*a, **k)
        if k["input_ids"].shape[1] == 1:
            timings["decode"].append(time.perf_counter() - start)
        return out

    model.model.forward, model.forward = timed_inner, timed_outer
    try:
        n = pipe.preprocess(context, [""], "", 10**9)["context_ids"].shape[1]  # with the chat template
        press = SnapKVPress(compression_ratio=max(0.0, 1.0 - args.budget / n))  # keep `budget` per layer
        start = time.perf_counter()
        new = args.new_tokens if new_tokens is None else new_tokens
        pipe(context, question="", press=press, max_new_tokens=new, cache=DynamicCache())
        total = time.perf_counter() - start
    finally:
        model.model.forward, model.forward = inner, outer
        torch.set_num_threads(args.threads)
    steps = len(timings["decode"])
    return {
        "prefill_seconds": timings["prefill"],
        "ttft_seconds": total - sum(timings["decode"]),
        "decode_tokens_per_second": steps / sum(timings["decode"]) if steps else 0.0,
        "decode_steps": steps,
        "kv_bytes_kept": timings["kv"],
        "context_tokens": timings["context"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--ids", required=True, help="JSON file: the document's token ids")
    parser.add_argument("--budget", type=int, required=True, help="tokens per layer kept, as cake-cli's -b")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--decode-threads", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (the median is printed)")
    parser.add_argument("--warmup-tokens", type=int, default=256, help="document tokens of the unmeasured warm-up")
    parser.add_argument("--warmup-new-tokens", type=int, default=4, help="tokens the warm-up generates")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=getattr(torch, args.dtype), attn_implementation="sdpa"
    )
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    ids = json.load(open(args.ids))
    context = tokenizer.decode(ids)
    if args.warmup_tokens > 0:  # as cake-cli's rows: one unmeasured run first
        warm = tokenizer.decode(ids[: args.warmup_tokens])
        one_run(pipe, model, ids, warm, args, new_tokens=args.warmup_new_tokens)
    runs = [one_run(pipe, model, ids, context, args) for _ in range(args.repeats)]
    timed = ("prefill_seconds", "ttft_seconds", "decode_tokens_per_second")
    print(
        json.dumps(
            {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            | {"repeats": args.repeats, "samples": {k: [r[k] for r in runs] for k in timed}}
        )
    )


if __name__ == "__main__":
    main()
