"""First token of a question on an already-compressed document: through a running `cake serve` (model warm,
prefix in memory) against `python -m cake_cli qa FILE.cake QUESTION` end to end (process start, model load,
file read, continuation, first token); then, with --load, a bounded load on the server (no 5xx, every answer
complete and equal to the first one for its question) and the server's memory before and after (--pid).

    python benchmarks/serve_first_token.py --url http://127.0.0.1:8765 --document readme.txt \
        --cake DIR/.cake-cache/SHA.cake --model smollm2 --question "What is CAKE?" --load 40 --pid PID

Prints one line per measurement; nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def server_first_token(url: str, model: str, document: str, question: str, max_tokens: int) -> tuple[float, float, str]:
    """(seconds to the first content piece, seconds to [DONE], the text) of one streamed chat request."""
    body = {
        "model": model,
        "stream": True,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": question}],
        "cake": {"document": document},
    }
    start, first, text = time.perf_counter(), None, []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta", {}).get("content")
            if delta:
                first = first if first is not None else time.perf_counter() - start
                text.append(delta)
    return first, time.perf_counter() - start, "".join(text).strip()


def cli_first_token(cake: str, model: str, question: str, max_tokens: int) -> tuple[float, float, str]:
    """(seconds to the first byte on stdout, seconds to exit, stdout) of `python -m cake_cli qa FILE.cake Q`."""
    cmd = [sys.executable, "-m", "cake_cli", "qa", cake, question, "-m", model, "--max-new-tokens", str(max_tokens)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    first = proc.stdout.read(1)
    at = time.perf_counter() - start
    rest = proc.stdout.read()
    proc.wait()
    return at, time.perf_counter() - start, (first + rest).decode().strip()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def load(url: str, model: str, document: str, questions: list[str], n: int, at_once: int, max_tokens: int) -> dict:
    """`n` chat requests, `at_once` in flight: status codes and whether each answer equals its question's first."""

    def ask(i: int):
        q = questions[i % len(questions)]
        body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": q}]}
        r = httpx.post(f"{url}/v1/chat/completions", json={**body, "cake": {"document": document}}, timeout=600)
        return q, r.status_code, r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else None

    start = time.perf_counter()
    with ThreadPoolExecutor(at_once) as pool:
        out = list(pool.map(ask, range(n)))
    first = {}
    for q, _, text in out:
        first.setdefault(q, text)
    return {
        "requests": n,
        "concurrent": at_once,
        "status_5xx": sum(code >= 500 for _, code, _ in out),
        "non_200": sum(code != 200 for _, code, _ in out),
        "equal_to_first": sum(text == first[q] for q, _, text in out),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--document", required=True, help="the document's name in the served folder")
    p.add_argument("--cake", required=True, help="the same document's .cake file, for the CLI")
    p.add_argument("--model", required=True)
    p.add_argument("--question", default="What is CAKE?")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--load", type=int, default=0, help="requests of the load test (0: none)")
    p.add_argument("--pid", type=int, help="the server's process id, for its memory before and after the load")
    a = p.parse_args()
    print(f"# python {shlex.join(sys.argv)}  (host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")
    server_first_token(a.url, a.model, a.document, a.question, a.max_tokens)  # warm: the prefix in memory
    for name, run in (
        ("server", lambda: server_first_token(a.url, a.model, a.document, a.question, a.max_tokens)),
        ("cli", lambda: cli_first_token(a.cake, a.model, a.question, a.max_tokens)),
    ):
        runs = [run() for _ in range(a.repeats)]
        firsts, totals = [r[0] for r in runs], [r[1] for r in runs]
        print(
            f"{name}: first token median {statistics.median(firsts):.2f} s (min {min(firsts):.2f}, max "
            f"{max(firsts):.2f}); whole answer median {statistics.median(totals):.2f} s; {a.repeats} runs"
        )
        print(f"{name} answer: {runs[0][2]!r}")
    if a.load:
        before = rss_mib(a.pid) if a.pid else None
        questions = [a.question, "What does cake serve do?", "Which models are supported?", "How is memory saved?"]
        result = load(a.url, a.model, a.document, questions, a.load, 8, a.max_tokens)
        after = rss_mib(a.pid) if a.pid else None
        if before is not None:
            result.update(rss_before_mib=round(before), rss_after_mib=round(after), rss_change=round(after / before, 3))
        print("load: " + json.dumps(result))


if __name__ == "__main__":
    main()
