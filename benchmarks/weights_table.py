"""Quantized weights against bf16 on the same quality cases: two `cake bench quality` run files,
paired case by case (task, case, length) for every method and budget both hold.

    python benchmarks/weights_table.py benchmarks/runs/genres-qwen-8k.json benchmarks/runs/genres-qwen-8k-int8.json

Prints a Markdown table (overall score x 100 of each weight format, the paired difference with its
bootstrap 95% interval, answers that differ) and issue 26's target line per budget: the quantized
overall score within 1 point of bf16's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cake_cli.bench.bootstrap import paired_interval

TARGET = 1.0  # points (score x 100)


def _by_case(rows: list[dict]) -> dict:
    return {(r["method"], r["budget"], r["task"], r["case_id"], r["length"]): r for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path, help="the bf16 run file")
    parser.add_argument("quantized", type=Path, help="the run file with --weights int8 or int4")
    args = parser.parse_args()
    ref, quant = (json.loads(p.read_text(encoding="utf-8")) for p in (args.reference, args.quantized))
    scheme = quant["meta"].get("weights", "bf16")
    a, b = _by_case(ref["rows"]), _by_case(quant["rows"])
    cells = sorted({k[:2] for k in b}, key=lambda c: (c[0] != "full", c[0], c[1] or 0))
    print(f"{quant['meta']['model']} · {quant['meta']['lengths']} tokens · bf16 vs {scheme}")
    print()
    print(f"| method | B | cases | bf16 | {scheme} | {scheme} - bf16 [95% interval] | answers that differ |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    lines = []
    for method, budget in cells:
        keys = [k for k in b if k[:2] == (method, budget) and k in a]
        x = [b[k]["score"] for k in keys]
        y = [a[k]["score"] for k in keys]
        d = paired_interval(x, y)
        differ = sum(b[k]["prediction"] != a[k]["prediction"] for k in keys)
        print(
            f"| {method} | {budget or '–'} | {len(keys)} | {100 * sum(y) / len(y):.1f} | {100 * sum(x) / len(x):.1f} "
            f"| {100 * d.mean:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}] | {differ} |"
        )
        if method != "full":
            verdict = "PASS" if abs(100 * d.mean) <= TARGET else "FAIL"
            lines.append(
                f"{verdict} {method} B={budget}: {scheme} overall {100 * sum(x) / len(x):.1f} vs bf16 "
                f"{100 * sum(y) / len(y):.1f} ({100 * d.mean:+.1f} points over {len(keys)} paired cases, 95% interval "
                f"[{100 * d.low:+.1f}, {100 * d.high:+.1f}]; target within {TARGET:.0f} point)"
            )
    print()
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
