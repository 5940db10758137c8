"""What a loaded model holds in resident memory before any prompt, by mapping (/proc's smaps).

Loads the model as the CLI does (`tasks.runner.load_ready`; with quantized weights, run it once
they are cached, as a second run of the CLI finds them, else it measures the first load), then
prints the process's resident size after loading, its peak during loading (VmHWM), and the
mappings holding the most resident memory:
``[heap]`` and anonymous memory (the process's own allocations) and each mapped file (a file's pages
count as long as a mapping of it lives).

    python benchmarks/load_memory.py --weights w8a8

Linux only. Results: benchmarks/runs/load-memory-avx2-2026-12-04.txt.
"""

from __future__ import annotations

import argparse

from cake_cli.bench.memory import resident_by_mapping, rss_bytes
from cake_cli.bench.speed.rss import peak_rss
from cake_cli.tasks.runner import load_ready


def main() -> None:
    """Parse the arguments, load, print the sizes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args()
    loaded = load_ready(args.model, args.dtype, "auto", weights=args.weights).loaded
    rss, peak = rss_bytes() / 2**20, peak_rss() / 2**20
    print(f"{loaded.name} {str(loaded.dtype).replace('torch.', '')}+{loaded.weights}: resident after loading "
          f"{rss:.0f} MiB, peak while loading {peak:.0f} MiB")  # fmt: skip
    for name, size in resident_by_mapping().most_common(args.top):
        print(f"  {size / 2**20:8.1f} MiB  {name}")


if __name__ == "__main__":
    main()
