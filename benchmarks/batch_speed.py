"""`cake batch` throughput (issue 15): documents per hour with --workers 1 and 2 (threads × workers =
cores) and with --ray local, on 8 real documents, and Ray's overhead vs --workers (target ≤ 10%).

The documents are real English text that every Python ships: the public docstrings of 8 standard
library modules (argparse, subprocess, shutil, …), read with `ast` (nothing is imported or run),
each cut at a paragraph to 4,000-10,000 characters (about 1-2.5K tokens). Each configuration is a
fresh `cake batch summarize` subprocess writing a fresh output, exactly as a user runs it, so the
model loads and Ray's start-up are counted in the end-to-end time; `documents/hour` uses the
batch's own run time (from every worker ready to the last row written). Ray's overhead is given
both ways, against --workers with the same number of workers and threads.

    python benchmarks/batch_speed.py                       # the lead's numbers (quiet machine)
    python benchmarks/batch_speed.py --model smollm2 --docs 2 --max-new-tokens 8   # a quick check

A script rather than a `cake bench` command: it measures the `cake batch` command itself from the
outside (process start, model loads, Ray start-up), which an in-process benchmark cannot.
Prints a Markdown table on stdout (and JSON with --json); progress on stderr.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

MODULES = [
    "argparse.py",
    "subprocess.py",
    "shutil.py",
    "tarfile.py",
    "json/__init__.py",
    "pathlib.py",
    "datetime.py",
    "collections/__init__.py",
    "ftplib.py",
    "threading.py",
    "zipfile.py",
    "textwrap.py",
]
MIN_CHARS, MAX_CHARS = 4000, 10000
ROOT = Path(__file__).resolve().parents[1]


def docstring_document(path: Path) -> str:
    """The module's docstring, then each public class and function's, as plain paragraphs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parts = [ast.get_docstring(tree) or ""]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc:
                parts.append(f"{node.name}\n\n{doc}")
    text = "\n\n".join(p for p in parts if p)
    if len(text) > MAX_CHARS:
        text = text[: text.rfind("\n\n", 0, MAX_CHARS)]
    return text


def write_documents(folder: Path, count: int) -> list[Path]:
    """`count` documents from the standard library's docstrings (see the module doc)."""
    folder.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    written = []
    for name in MODULES:
        source = stdlib / name
        text = docstring_document(source) if source.is_file() else ""
        if len(text) >= MIN_CHARS:
            out = folder / f"{name.replace('/__init__.py', '').replace('.py', '')}.txt"
            out.write_text(f"Python standard library: {source.stem}\n\n{text}\n", encoding="utf-8")
            written.append(out)
        if len(written) == count:
            return written
    raise SystemExit(f"only {len(written)} standard library modules have {MIN_CHARS}+ characters of docstrings")


def run_config(name: str, extra: list[str], docs: Path, work: Path, common: list[str]) -> dict:
    """One `cake batch summarize` subprocess on a fresh output; its --json summary plus wall seconds."""
    out = work / f"{name}.jsonl"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "cake_cli", "batch", "summarize", str(docs), "-o", str(out), "--json", "-q"]
    print(f"[batch_speed] {name}: {' '.join(cmd[3:] + common + extra)}", file=sys.stderr, flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    done = subprocess.run(cmd + common + extra, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr}")
    summary = json.loads(done.stdout)
    summary.update(
        config=name, wall_seconds=round(wall, 2), documents_per_hour_end_to_end=summary["done"] * 3600 / wall
    )
    return summary


def overhead(ray: dict, local: dict, key: str) -> float:
    """How much slower Ray is: per-document time on Ray / per-document time locally − 1."""
    return ray[key] / local[key] - 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="cake model (default smollm2, the fast embedded one)")
    parser.add_argument("--budget", type=int, default=256, help="KV budget, tokens per layer")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per document")
    parser.add_argument("--docs", type=int, default=8, help=f"documents (at most {len(MODULES)})")
    parser.add_argument("--no-ray", action="store_true", help="skip the --ray configurations")
    parser.add_argument("--work", type=Path, help="folder for the documents and outputs (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON instead of a table")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    half = max(1, cores // 2)
    with tempfile.TemporaryDirectory(prefix="cake-batch-speed-") as tmp:
        work = args.work or Path(tmp)
        docs = work / "docs"
        write_documents(docs, args.docs)
        common = ["-m", args.model, "-b", str(args.budget), "-n", str(args.max_new_tokens)]
        configs = [
            ("workers-1", ["--workers", "1", "--threads", str(cores)]),
            ("workers-2", ["--workers", "2", "--threads", str(half)]),
        ]
        if not args.no_ray:
            configs += [
                ("ray-1", ["--ray", "local", "--workers", "1", "--threads", str(cores)]),
                ("ray-2", ["--ray", "local", "--workers", "2", "--threads", str(half)]),
            ]
        results = [run_config(name, extra, docs, work, common) for name, extra in configs]
    by_name = {r["config"]: r for r in results}
    for n in ("1", "2"):
        ray, local = by_name.get(f"ray-{n}"), by_name[f"workers-{n}"]
        if ray:
            ray["ray_overhead_run"] = overhead(ray, local, "run_seconds")
            ray["ray_overhead_end_to_end"] = overhead(ray, local, "wall_seconds")
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.docs} documents, --model {args.model} -b {args.budget} -n {args.max_new_tokens}, {cores} cores\n")
    print(
        "| config | workers × threads | startup s | run s | wall s | documents/hour (run) "
        "| documents/hour (end to end) | tokens/s | Ray overhead (run / end to end) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ray = f"{r['ray_overhead_run']:+.1%} / {r['ray_overhead_end_to_end']:+.1%}" if "ray_overhead_run" in r else ""
        print(
            f"| {r['config']} | {r['workers']} × {r['threads']} | {r['startup_seconds']:.1f} | {r['run_seconds']:.1f} "
            f"| {r['wall_seconds']:.1f} | {r['documents_per_hour']:,.0f} | {r['documents_per_hour_end_to_end']:,.0f} "
            f"| {r['tokens_per_second']:,.0f} | {ray} |"
        )


if __name__ == "__main__":
    main()
