"""The tables, target lines and plot of a `cake bench cache --parts agnostic` run file, for the documents it
holds: a run stopped between documents (the file is saved after each one) is reported as far as it went.

    python benchmarks/agnostic_table.py benchmarks/runs/agnostic-qwen-4k8k.json [--plot FILE.png]

Prints what `cake bench cache` prints at the end of a run (`cli.runners.bench_cache.show_agnostic`), from
the same functions (`bench.agnostic.report`), on stdout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cake_cli.bench.agnostic import report
from cake_cli.cli.progress import console
from cake_cli.cli.runners.bench_cache import show_agnostic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_file", type=Path)
    parser.add_argument("--plot", type=Path, help="also draw score vs file size here (matplotlib)")
    args = parser.parse_args()
    data = json.loads(args.run_file.read_text(encoding="utf-8"))
    part = data["agnostic"]
    summary = report.summarize(part["rows"])
    lines = report.targets(summary, part["timings"]) + report.first_token_lines(part["rows"], part["timings"])
    done = ", ".join(f"{d}@{n}" for n, d in sorted({(t["length"], t["doc_id"]) for t in part["timings"]}))
    out = console(stderr=False)
    out.print(f"{data['meta']['model']} · {data['meta']['dtype']} · documents: {done}")
    show_agnostic(out, {**part, "summary": summary, "paired": report.paired(part["rows"]), "targets": lines})
    if args.plot is not None:
        report.plot(summary, args.plot, f"compress once, ask many · {data['meta']['model']}")


if __name__ == "__main__":
    main()
