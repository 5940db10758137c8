"""Decode speed from a prefix held at 16 and at 4 bits, side by side in one process.

A question-time pass evicts the prefix to B tokens a layer (the profile's method), then the fixed decode
policy evicts one token a step. The 4-bit prefix is held as a loaded `.cake` holds it (`kvmemory.QuantLayer`);
its decode runs twice: as shipped (the next token takes the released slot, `QuantLayer._write_rows`) and, for
the comparison, with the eviction before it (the released slot removed at once, every quantized part copied:
`QuantLayer.release` as it was, patched in for that case only). The cases alternate, `--rounds` times after a
warm-up, so a busy machine slows each alike; prints the median ms a decode step and tok/s of each, and whether
each 4-bit case decoded the same tokens as the shipped one (the same keys and values in another slot order:
rounding may part them).

    python benchmarks/kv_bits_decode.py --tokens 8192 --budget 1024 --steps 32 --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager, nullcontext

import torch

from cake_cli.cli.bench_options import configs_for
from cake_cli.engine.cachefile import quantized_in_memory, value_coding_of
from cake_cli.engine.config import DEFAULT_KV_GROUP, DEFAULT_KV_SINK
from cake_cli.engine.continuation import continue_prefix
from cake_cli.engine.generate import decode
from cake_cli.engine.kvmemory import QuantLayer
from cake_cli.engine.replay import record, replay
from cake_cli.tasks.runner import load_ready

QUESTION = "\n\nQuestion: What does the document say about the numbers that follow a decimal point? Explain.\nAnswer:"


@contextmanager
def removed_at_once():
    """`QuantLayer.release` as it was before slots were written in place: the slot removed now (`compact`)."""

    def release(self, slot):
        self.free = slot
        self.compact()

    shipped = QuantLayer.release
    QuantLayer.release = release
    try:
        yield
    finally:
        QuantLayer.release = shipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--tokens", type=int, default=8192, help="prefix length, tokens (Python's language reference)")
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=32, help="decode steps a case")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from pydoc_data.topics import topics  # noqa: PLC0415 - CPython's own text, on every machine

    lm = load_ready(args.model, "auto", "sdpa").loaded  # as `cake qa` loads it
    text = "\n\n".join(topics[k] for k in sorted(topics))
    prefix = lm.tokenizer(text)["input_ids"][: args.tokens]
    prompt = torch.tensor([prefix + lm.tokenizer(QUESTION)["input_ids"]])
    config = configs_for(args.model, None, [args.budget], None)[args.budget]
    began = time.perf_counter()
    whole = replay(record(lm.model, torch.tensor([prefix]), config.window, accumulate=False), None)
    print(f"{len(prefix)}-token prefix prefilled in {time.perf_counter() - began:.1f} s", flush=True)
    coding = value_coding_of(whole.cache)
    held = quantized_in_memory(whole, 4, DEFAULT_KV_GROUP, config.window, DEFAULT_KV_SINK, **coding)
    cases = {"16-bit": (whole, None), "4-bit": (held, None)}
    cases["4-bit, slot removed each step (before)"] = (held, removed_at_once)
    times, tokens = {name: [] for name in cases}, {}
    for round_ in range(args.rounds + 1):
        for name, (state, patch) in cases.items():
            cont, capacity = continue_prefix(lm.model, state, prompt, config, evict=True)
            with patch() if patch else nullcontext():
                began = time.perf_counter()
                out = decode(lm.model, prompt, cont, config, capacity=capacity, max_new_tokens=args.steps + 1,
                             stop_ids=[])  # fmt: skip
                seconds = time.perf_counter() - began
            tokens.setdefault(name, list(out.token_ids))
            if round_:  # the first round warms up
                times[name].append(1e3 * seconds / args.steps)
    print(f"\n{args.model}, {len(prefix)}-token prefix, B = {args.budget}, {args.steps} decode steps, "
          f"{args.threads} threads, median of {args.rounds} rounds (alternating)\n")  # fmt: skip
    print("| prefix held at | ms a step | tok/s | range, ms | tokens as the 4-bit case |")
    print("|---|---:|---:|---|---|")
    for name, ms in times.items():
        same = "–" if name == "16-bit" else ("same" if tokens[name] == tokens["4-bit"] else "DIFFERENT")
        print(f"| {name} | {statistics.median(ms):.1f} | {1e3 / statistics.median(ms):.1f} "
              f"| {min(ms):.1f}–{max(ms):.1f} | {same} |")  # fmt: skip


if __name__ == "__main__":
    main()
