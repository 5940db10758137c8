"""Compress once, ask many, at several KV bit widths: real-set questions answered from one whole-prefix cache.

The protocol of `cake compress` (default `--scoring question`) then `cake qa FILE.cake Q`: each document's
prompt prefix (the `qa` template up to the question) is prefilled once with no question and kept whole; at each
bit width it is held as a .cake file of those bits holds it in memory (`tasks.saved.store.held_quantized`'s
layout: `DEFAULT_KV_GROUP`, the window's w tokens and the first `DEFAULT_KV_SINK` tokens exact, global layers
quantized, `engine.kvmemory`); every question is then asked from that one cache, its CAKE eviction run with the
question in the window at budget B (`continuation.continue_and_decode(evict=True)`), and scored as
`cake bench quality --suite real` scores it (`bench.quality.real`). File bytes are those of the .cake's tensors.

A small sample for a quick check, not the evidence the default needs (benchmarks/cache.md):

    python benchmarks/kv_bits_quality.py --documents python-shlex --questions 3 \
        -o benchmarks/runs/kv-bits-quality-smoke.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save as save_tensors

from cake_cli.bench.quality.real import _row, build_case, common_prefix
from cake_cli.bench.quality.run import Model
from cake_cli.bench.real_docs import load_set, open_documents
from cake_cli.bench.suites import REAL_TEMPLATE
from cake_cli.cli.bench_options import configs_for
from cake_cli.engine.config import DEFAULT_KV_GROUP, DEFAULT_KV_SINK
from cake_cli.engine.continuation import cache_tensors, continue_and_decode, quantized_in_memory
from cake_cli.engine.replay import record, replay
from cake_cli.tasks.runner import load_ready, prompt_limit, stop_token_ids
from cake_cli.tasks.templates import load_template


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or path (default: the embedded default)")
    parser.add_argument("--documents", default="python-shlex", help="real-set document ids, comma-separated")
    parser.add_argument("--questions", type=int, default=6, help="each document's first N questions")
    parser.add_argument(
        "--layouts",
        default="16,4,2",
        help="comma-separated BITS[/SINK[/RECENT]] (defaults: the file's sink and the window); the first is the "
        "reference of the paired comparison",
    )
    parser.add_argument("--budget", type=int, default=256, help="B, tokens per layer at question time")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("-o", "--output", type=Path, required=True, help="JSON: settings and every answer")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layouts = [layout.split("/") for layout in args.layouts.split(",")]
    lm = load_ready(args.model, "auto", "sdpa").loaded  # switched to CAKE attention, as `cake qa` runs
    model = Model(lm.model, lm.tokenizer, prompt_limit(lm, 64), stop_token_ids(lm))
    config = configs_for(args.model, None, [args.budget])[args.budget]
    window, new_tokens = config.window, load_template(REAL_TEMPLATE).max_new_tokens
    documents, missing = open_documents(load_set(), args.documents.split(","))
    if missing:
        raise SystemExit(f"error: documents not installed: {', '.join(missing)}")
    layouts = [
        (int(x[0]), int(x[1]) if len(x) > 1 else DEFAULT_KV_SINK, int(x[2]) if len(x) > 2 else window) for x in layouts
    ]  # (bits, sink, recent)
    names = [f"{b}" + ("" if (s, r) == (DEFAULT_KV_SINK, window) else f"/{s}/{r}") for b, s, r in layouts]
    meta = dict(model=lm.name, dtype=str(lm.dtype), budget=args.budget, window=window, group=DEFAULT_KV_GROUP,
                layouts=names, threads=args.threads)  # fmt: skip
    rows, files = [], {}
    for doc in documents:
        cases = [build_case(model, doc, q, 32768) for q in list(doc.questions)[: args.questions]]
        n = common_prefix([c.input_ids for c in cases])
        began = time.perf_counter()
        whole = replay(record(model.model, torch.tensor([cases[0].input_ids[:n]]), window, accumulate=False), None)
        print(f"{doc.spec.id}: {n}-token prefix prefilled in {time.perf_counter() - began:.1f} s", flush=True)
        for name, (bits, sink, recent) in zip(names, layouts):
            state = whole if bits == 16 else quantized_in_memory(whole, bits, DEFAULT_KV_GROUP, recent, sink)
            size = len(save_tensors(cache_tensors(whole.cache, bits, DEFAULT_KV_GROUP, recent, sink)))
            files[f"{doc.spec.id}/{name}"] = size
            for case in cases:
                began = time.perf_counter()
                ids = torch.tensor([case.input_ids])
                result = continue_and_decode(model.model, state, ids, config, evict=True,
                                             max_new_tokens=new_tokens, stop_ids=model.stop_ids)  # fmt: skip
                text = lm.tokenizer.decode(list(result.token_ids), skip_special_tokens=True).strip()
                row = _row(case, SimpleNamespace(name=f"file-{name}"), args.budget, config, text,
                           time.perf_counter() - began, 0.0)  # fmt: skip
                rows.append(dict(asdict(row), layout=name, bits=bits, sink=sink, recent=recent, file_bytes=size))
                print(f"  {name:>8} {case.question.id}: score {row.score:.2f} ({row.support})", flush=True)
            args.output.write_text(json.dumps(dict(meta=meta, files=files, rows=rows), indent=1) + "\n")
    print(f"\nsmall sample: {len(rows) // len(names)} questions per layout, B = {args.budget}")
    print("| layout (bits[/sink/recent]) | score | exact | vs the first: better / same / worse | file bytes / first |")
    print("|---|---:|---:|---|---:|")
    ref = {r["case_id"]: r["score"] for r in rows if r["layout"] == names[0]}
    for name in names:
        mine = [r for r in rows if r["layout"] == name]
        score = 100 * sum(r["score"] for r in mine) / len(mine)
        exact = 100 * sum(r["exact"] for r in mine) / len(mine)
        diffs = [r["score"] - ref[r["case_id"]] for r in mine]
        wtl = f"{sum(d > 0 for d in diffs)} / {sum(d == 0 for d in diffs)} / {sum(d < 0 for d in diffs)}"
        ratio = sum(files[f"{d.spec.id}/{name}"] for d in documents) / sum(
            files[f"{d.spec.id}/{names[0]}"] for d in documents
        )
        print(f"| {name} | {score:.1f} | {exact:.1f} | {wtl} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
