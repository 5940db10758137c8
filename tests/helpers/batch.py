"""The `cake batch` CLI on the tiny profile: invoking it, reading its JSON lines, test documents."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cake_cli.cli.main import app
from tests.helpers.texts import license_text

runner = CliRunner()
TINY = ["-m", "tiny-test", "-b", "64", "-n", "4"]
TIMINGS = {
    "load_seconds",
    "prefill_seconds",
    "eviction_seconds",
    "decode_seconds",
    "decode_tokens_per_second",
    "sampling_seconds",
    # how many threads ran it (a batch worker's fixed count vs a single run's idle-core choice)
    "prefill_threads",
    "decode_threads",
    "threads_reason",
}


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def untimed(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in TIMINGS}


def write_docs(folder: Path, count: int, size: int = 300) -> list[Path]:
    """`count` text documents: different slices of CPython's LICENSE.txt (each fits the tiny model)."""
    folder.mkdir(exist_ok=True)
    text = license_text()
    paths = []
    for n in range(count):
        path = folder / f"doc{n}.txt"
        path.write_text(text[n * 500 : n * 500 + size], encoding="utf-8")
        paths.append(path)
    return paths
