"""OpenVINO GenAI on the same checkpoint, document, threads and token count, timed: run by
`cake bench speed --openvino` inside .venv-openvino (benchmarks/openvino_env.sh). OpenVINO GenAI is
the CPU runtime with KV-cache eviction built in (`CacheEvictionConfig`), so it runs twice per
document: its full cache, and its eviction at the same budget as cake-cli's rows.

The converted checkpoint is exported once to OpenVINO IR with int8 weights (`optimum-cli export
openvino --weight-format int8`, the tokenizer converted with it) into --ir-dir, reused after. Each
row: one unmeasured warm-up generation (the document's first --warmup-tokens tokens,
--warmup-new-tokens new tokens), then --repeats timed generations of exactly --new-tokens tokens
(EOS ignored) from the token ids given (no chat template, as cake-cli's engine rows). Times come
from the pipeline's own performance metrics: TTFT (prefill and the first token) and TPOT (mean
time per later token). Prints one JSON object: "rows", each with the medians of every repeat,
"samples" per repeat, and the OpenVINO settings used.

Eviction settings: start_size = recent_size = --window tokens (the observation window of
cake-cli), max_cache_size = --budget, aggregation NORM_SUM, the pipeline's default block size;
OpenVINO evicts whole blocks only, so it may hold up to one block more than the budget.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as ov_genai


def export(model_dir: Path, ir_dir: Path) -> None:
    """The checkpoint as OpenVINO IR with int8 weights and its tokenizer (once; a finished export
    leaves openvino_model.xml, written last)."""
    if (ir_dir / "openvino_model.xml").is_file() and (ir_dir / "openvino_detokenizer.xml").is_file():
        return
    cli = Path(sys.executable).with_name("optimum-cli")
    cmd = [str(cli), "export", "openvino", "--model", str(model_dir), "--task", "text-generation-with-past"]
    cmd += ["--weight-format", "int8", str(ir_dir)]
    print(f"exporting {model_dir} to OpenVINO IR (int8 weights) in {ir_dir}", file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=sys.stderr)


def pipeline(ir_dir: Path, threads: int, budget: int | None, window: int) -> tuple:
    """(LLMPipeline on CPU with a continuous-batching scheduler, its settings); `budget` None: full cache."""
    scheduler = ov_genai.SchedulerConfig()
    scheduler.cache_size = 2  # GB of KV blocks: a 32K-token full cache of the 0.5B model fits
    settings = {"threads": threads, "cache_size_gb": scheduler.cache_size}
    if budget is not None:
        mode = ov_genai.AggregationMode.NORM_SUM
        scheduler.use_cache_eviction = True
        scheduler.cache_eviction_config = ov_genai.CacheEvictionConfig(window, window, budget, mode)
        settings |= {"start_size": window, "recent_size": window, "max_cache_size": budget, "aggregation": "NORM_SUM"}
    pipe = ov_genai.LLMPipeline(str(ir_dir), "CPU", scheduler_config=scheduler, INFERENCE_NUM_THREADS=threads)
    settings["max_num_batched_tokens"] = scheduler.max_num_batched_tokens
    return pipe, settings


def one_run(pipe, ids: list[int], new_tokens: int) -> dict:
    """One generation of exactly `new_tokens` tokens after `ids`; times from the pipeline's metrics."""
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = new_tokens
    config.min_new_tokens = new_tokens
    config.ignore_eos = True
    tokens = ov.Tensor(np.array([ids], dtype=np.int64))
    inputs = ov_genai.TokenizedInputs(tokens, ov.Tensor(np.ones((1, len(ids)), dtype=np.int64)))
    result = pipe.generate(inputs, config)
    metrics = result.perf_metrics
    ttft, tpot = metrics.get_ttft().mean / 1e3, metrics.get_tpot().mean / 1e3  # ms -> s
    steps = metrics.get_num_generated_tokens() - 1
    return {
        "prefill_seconds": ttft,
        "ttft_seconds": ttft,
        "decode_tokens_per_second": 1.0 / tpot if tpot > 0 else 0.0,
        "decode_steps": steps,
        "context_tokens": len(ids),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--ir-dir", required=True, type=Path, help="where the exported IR is kept")
    parser.add_argument("--ids", required=True, help="JSON file: the document's token ids")
    parser.add_argument("--budget", type=int, required=True, help="tokens kept per layer, as cake-cli's -b")
    parser.add_argument("--window", type=int, default=32, help="start and recent tokens always kept")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (the median is printed)")
    parser.add_argument("--warmup-tokens", type=int, default=256, help="document tokens of the unmeasured warm-up")
    parser.add_argument("--warmup-new-tokens", type=int, default=4, help="tokens the warm-up generates")
    args = parser.parse_args()
    export(args.model_dir, args.ir_dir)
    ids = json.load(open(args.ids))
    rows = []
    for budget in (None, args.budget):
        pipe, settings = pipeline(args.ir_dir, args.threads, budget, args.window)
        if args.warmup_tokens > 0:
            one_run(pipe, ids[: args.warmup_tokens], args.warmup_new_tokens)
        runs = [one_run(pipe, ids, args.new_tokens) for _ in range(args.repeats)]
        timed = ("prefill_seconds", "ttft_seconds", "decode_tokens_per_second")
        rows.append(
            {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            | {"budget": budget, "repeats": args.repeats, "settings": settings}
            | {"samples": {k: [r[k] for r in runs] for k in timed}}
        )
        del pipe
    print(json.dumps({"rows": rows, "openvino_genai": ov_genai.__version__}))


if __name__ == "__main__":
    main()
