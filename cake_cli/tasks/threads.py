"""How many CPU threads torch uses for prefill and for decoding (`--threads`), and why.

Prefill runs large matrix products that scale with threads; decoding runs a small product per
layer per token, where OpenMP's barrier across threads dominates. When another process holds a
core, every parallel region waits for the descheduled thread: measured here with one of two cores
busy, 2 threads decoded Qwen2.5-0.5B at 1.3 tok/s and 1 thread at 7.0 tok/s, and 2-thread
prefill took twice as long as 1-thread prefill. So `auto` counts the cores that are idle right
now (a 50 ms sample of /proc/stat) and prefills with that many threads, and decodes with one
thread (see `DECODE_THREADS`). `--threads N` uses N for both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

SAMPLE_SECONDS = 0.05  # how long the idle-core sample takes
DECODE_THREADS = 1  # decoding threads under `auto` (measured in benchmarks/speed.md)


@dataclass(frozen=True)
class Threads:
    """Thread counts for one run, and how they were chosen (for the report)."""

    prefill: int
    decode: int
    reason: str


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_times(stat: Path) -> tuple[int, int] | None:
    """(idle + iowait, total) jiffies of all CPUs from /proc/stat, or None where unreadable."""
    try:
        fields = stat.read_text(encoding="ascii").split("\n", 1)[0].split()[1:]
    except (OSError, IndexError):
        return None
    values = [int(v) for v in fields]
    return values[3] + (values[4] if len(values) > 4 else 0), sum(values)


def idle_cores(stat: Path = Path("/proc/stat"), sample: float = SAMPLE_SECONDS) -> float | None:
    """Cores idle over a short sample (0 .. machine cores), or None where /proc/stat is missing."""
    first = _cpu_times(stat)
    time.sleep(sample)
    second = _cpu_times(stat)
    if first is None or second is None or second[1] <= first[1]:
        return None
    share = (second[0] - first[0]) / (second[1] - first[1])
    return share * (os.cpu_count() or 1)


def choose(requested: int | None, idle: float | None = None, cores: int | None = None) -> Threads:
    """The threads of a run: `requested` for both phases, else `auto` (see the module docstring).

    Args:
        requested: --threads (>= 1), or None for auto.
        idle: idle cores now (default: `idle_cores()`).
        cores: usable cores (default: `usable_cores()`).

    Raises:
        ValueError: requested < 1.
    """
    cores = cores or usable_cores()
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be at least 1, got {requested}")
        return Threads(requested, requested, "--threads")
    idle = idle_cores() if idle is None else idle
    if idle is None:
        return Threads(cores, DECODE_THREADS, f"auto: {cores} usable cores (load unknown)")
    prefill = max(1, min(cores, round(idle)))
    return Threads(prefill, min(DECODE_THREADS, cores), f"auto: {idle:.1f} of {cores} cores idle")


@contextmanager
def using(count: int) -> Iterator[None]:
    """Run the block with `count` torch CPU threads, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
