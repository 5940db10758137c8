"""`cake bench speed --rss`: the peak process memory of CAKE and of llama.cpp on the same document,
each engine alone in a fresh child process.

In the benchmark's own process both engines' models are loaded side by side, so its resident size
says nothing about either; a child process holds one engine only, as a user's would. Each child
loads its model (ours with the run's dtype, weights and CAKE settings; llama.cpp on the GGUF with a
context of the document plus the new tokens), prefills the same token ids (read from a JSON file
the parent writes), decodes `new_tokens` greedy tokens, and prints one JSON line with its peak resident set size
(`peak_rss`, /proc's VmHWM: everything the process held at its peak, interpreter, libraries,
weights, cache and buffers, loading included) and the largest size sampled while it prefilled and
decoded. One run per engine and length: memory does not vary from run to run as time does.

Run as ``python -m cake_cli.bench.speed.rss RUN_JSON IDS_JSON`` by `process_peak` only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from cake_cli.errors import CakeError

ENGINES = ("cake", "llama.cpp")
TARGET = 1.0  # CAKE's peak process memory <= this x llama.cpp's (issue 26)


@dataclass(frozen=True)
class ChildRun:
    """What a child process is asked to run (the parent's settings), passed as JSON."""

    engine: str  # one of ENGINES
    model: str | None  # our model spec (cake) or the GGUF path (llama.cpp)
    dtype: str
    weights: str
    attention: str
    config: dict  # the CakeConfig's fields (`dataclasses.asdict`)
    new_tokens: int
    threads: tuple[int, int]  # (prefill, decode)


@dataclass(frozen=True)
class MemoryRow:
    """One engine's peak process memory at one length."""

    model: str
    engine: str
    length: int
    rss_peak: int  # bytes, the child's peak RSS (`peak_rss`): loading included
    run_peak: int  # bytes, the largest RSS sampled while it prefilled and decoded (`memory.PeakRss`)
    prefill_seconds: float  # the child's one prefill (context only: the timed rows are the engine rows)


def _child(run: ChildRun, ids: list[int]) -> dict:
    """Run one engine over `ids` in this (child) process; returns prefill seconds and the peak RSS."""
    import torch  # noqa: PLC0415

    from cake_cli.bench.memory import PeakRss  # noqa: PLC0415

    sampled = PeakRss()
    if run.engine == "llama.cpp":
        from cake_cli.bench.speed.llama import open_llama, timed_decode, timed_prefill  # noqa: PLC0415

        llm = open_llama(Path(run.model), len(ids) + run.new_tokens, run.threads)
        with sampled:
            seconds, _, token = timed_prefill(llm, ids)
            timed_decode(llm, token, run.new_tokens - 1)
    else:
        from cake_cli.engine.config import CakeConfig  # noqa: PLC0415
        from cake_cli.engine.generate import generate  # noqa: PLC0415
        from cake_cli.tasks.runner import load_ready  # noqa: PLC0415

        loaded = load_ready(run.model, run.dtype, run.attention, weights=run.weights).loaded
        config = CakeConfig(**run.config)
        torch.set_num_threads(run.threads[0])
        with sampled:
            result = generate(
                loaded.model, torch.tensor([ids], device=loaded.device), config, max_new_tokens=run.new_tokens,
                collect_stats=False,
            )  # fmt: skip
        seconds = result.prefill_seconds
    return {"prefill_seconds": seconds, "rss_peak": peak_rss(), "run_peak": sampled.peak}


def peak_rss() -> int:
    """This process's peak resident set size since it was exec'd, bytes: /proc's VmHWM (ru_maxrss is
    not used: Linux carries it over from the parent through fork and exec)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def process_peak(run: ChildRun, ids: list[int], name: str) -> MemoryRow:
    """Run `run` over `ids` in a fresh Python process and return its peak memory.

    Raises:
        CakeError: the child failed (its last error line quoted).
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ids.json"
        path.write_text(json.dumps(ids), encoding="utf-8")
        spec = json.dumps(asdict(run))
        proc = subprocess.run(
            [sys.executable, "-m", "cake_cli.bench.speed.rss", spec, str(path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise CakeError(f"the {run.engine} memory run failed: {last}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return MemoryRow(
        name, run.engine, len(ids), int(out["rss_peak"]), int(out["run_peak"]), float(out["prefill_seconds"])
    )


def memory_lines(rows: list[MemoryRow]) -> list[str]:
    """'PASS/FAIL <model> at <n> tokens: CAKE's peak process memory x MiB, y x llama.cpp's (z MiB)'
    for each length both engines ran (one run each)."""
    out = []
    for cake in (r for r in rows if r.engine == "cake"):
        llama = next((r for r in rows if r.engine == "llama.cpp" and r.length == cake.length), None)
        if llama is None or llama.rss_peak <= 0:
            continue
        ratio = cake.rss_peak / llama.rss_peak
        verdict = "PASS" if ratio <= TARGET else "FAIL"
        out.append(
            f"{verdict} {cake.model} at {cake.length} tokens: CAKE's peak process memory {cake.rss_peak / 2**20:.0f} "
            f"MiB, {ratio:.2f}x llama.cpp's {llama.rss_peak / 2**20:.0f} MiB (loading included; while running "
            f"{cake.run_peak / 2**20:.0f} vs {llama.run_peak / 2**20:.0f} MiB; one run each, separate processes; "
            f"target <= {TARGET:.2f}x)"
        )
    return out


def main(argv: list[str]) -> None:
    """Child entry point: argv = [ChildRun JSON, ids JSON path]; prints one JSON line."""
    fields = json.loads(argv[0])
    fields["threads"] = tuple(fields["threads"])
    fields["config"] = {k: tuple(v) if isinstance(v, list) else v for k, v in fields["config"].items()}
    run = ChildRun(**fields)
    ids = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    sys.stdout.write(json.dumps(_child(run, ids)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
