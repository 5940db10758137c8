"""CAKE's peak process memory on one long document, alone in a child process, without llama.cpp.

The child is `cake bench speed --rss`'s own (`bench.speed.rss.process_peak`: the model loaded as the
CLI loads it, a CAKE prefill of the speed benchmark's document cut to each length, `--new-tokens`
greedy tokens, /proc's peak resident size with loading included), so its figure compares with
that benchmark's llama.cpp rows; this skips the benchmark's timed rounds, and llama.cpp's own child
unless asked for (`--llama`: a 31,000-token llama.cpp prefill alone takes ~15 minutes on two cores),
in which case it also prints `cake bench speed --rss`'s PASS/FAIL line for each length.

    python benchmarks/prefill_memory.py --lengths 31000 --weights w8a8 --budget 256 [--llama] [--threads N]

Prints one line per engine and length on stdout (with --llama, then the PASS/FAIL line). Results:
benchmarks/runs/prefill-memory-avx2-2026-12-04.txt, benchmarks/runs/prefill-memory-mapped-avx2-2026-12-04.txt.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import asdict
from pathlib import Path

from cake_cli.bench.corpus import python_docs_text
from cake_cli.bench.speed.llama import model_gguf
from cake_cli.bench.speed.rss import ChildRun, memory_lines, process_peak
from cake_cli.cli.bench_options import configs_for
from cake_cli.tasks.request import TaskRequest
from cake_cli.tasks.runner import ready_model
from cake_cli.tasks.threads import choose


def main() -> None:
    """Parse the arguments, run one memory child per length, print its line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--lengths", default="31000", help="document lengths (tokens), comma-separated")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--llama", action="store_true", help="also llama.cpp's child on the model's GGUF")
    parser.add_argument("--threads", type=int, default=None, help="both engines' threads (default: as the CLI picks)")
    args = parser.parse_args()
    request = TaskRequest(task="qa", document="-", model=args.model, dtype=args.dtype, weights=args.weights)
    loaded = ready_model(request).loaded
    dtype = str(loaded.dtype).replace("torch.", "")
    ids = loaded.tokenizer(python_docs_text(), add_special_tokens=False)["input_ids"]
    config = configs_for(args.model, None, [args.budget])[args.budget]
    threads = choose(args.threads)
    name = loaded.profile.name if loaded.profile else loaded.name
    embedded = loaded.profile.embedded if loaded.profile else None
    del loaded  # loaded only to resolve what the CLI would (dtype, weights, name, tokens); the child loads its own
    with tempfile.TemporaryDirectory() as tmp:
        gguf = model_gguf(args.model, embedded, Path(tmp)) if args.llama else None
        for n in (int(x) for x in args.lengths.split(",")):
            rows = []
            for engine, spec in [("cake", args.model)] + ([("llama.cpp", str(gguf))] if gguf else []):
                run = ChildRun(
                    engine, spec, dtype, args.weights, "auto", asdict(config), args.new_tokens,
                    (threads.prefill, threads.decode),
                )  # fmt: skip
                row = process_peak(run, list(ids[:n]), name)
                rows.append(row)
                peak, running = row.rss_peak / 2**20, row.run_peak / 2**20
                print(
                    f"{name} {dtype}+{args.weights} {engine} at {n} tokens, B={args.budget}, {threads.prefill} "
                    f"thread(s): peak RSS {peak:.0f} MiB "
                    f"(loading included), {running:.0f} MiB while prefilling and decoding; "
                    f"prefill {row.prefill_seconds:.1f} s",
                    flush=True,
                )
            for line in memory_lines(rows):
                print(line, flush=True)


if __name__ == "__main__":
    main()
