"""How many CPU threads torch uses for prefill and for decoding (`--threads`), and why.

Prefill runs large matrix products that scale with threads; decoding runs a small product per
layer per token, where OpenMP's barrier across threads dominates. When another process holds a
core, every parallel region waits for the descheduled thread: with one of two cores busy, 2 threads
decoded Qwen2.5-Coder-0.5B at 0.90 tok/s and 1 thread at 7.27 tok/s; on the quiet machine 2 threads
decoded at 10.93 tok/s and 1 thread at 7.75 (`benchmarks/decode_threads.py`, medians of 3 runs in
benchmarks/runs/decode-threads-busy.md and decode-threads-quiet.md). So `auto` counts the cores that are
idle right now (a 50 ms sample of /proc/stat) and prefills and starts decoding with that many
threads; while decoding, `DecodeGovernor` looks again every `CHECK_TOKENS` tokens at how much CPU
*other* processes used since the last look (the machine's busy time minus this process's) and
sets the thread count to the cores they leave free. `--threads N` uses N for both, fixed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from cake_cli.cores import usable_cores

SAMPLE_SECONDS = 0.05  # how long the idle-core sample takes
CHECK_TOKENS = 8  # decode steps between two looks at the load
T = TypeVar("T")
CHECK_SECONDS = 0.25  # at least this long between two looks (shorter intervals are noise)


@dataclass(frozen=True)
class Threads:
    """Thread counts for one run, and how they were chosen (for the report)."""

    prefill: int
    decode: int  # threads decoding starts with
    reason: str
    adaptive: bool = False  # decoding follows the load (`DecodeGovernor`); False for --threads


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
        return Threads(cores, cores, f"auto: {cores} usable cores (load unknown)")
    prefill = free_cores(cores, cores - idle)
    reason = f"auto: {idle:.1f} of {cores} cores idle; decoding follows the load"
    return Threads(prefill, prefill, reason, adaptive=cores > 1)


@contextmanager
def using(count: int | None) -> Iterator[None]:
    """Run the block with `count` torch CPU threads (0 or None: leave torch's count), then restore it."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def free_cores(cores: int, others_busy: float) -> int:
    """Threads for `cores` usable cores when other processes keep `others_busy` cores busy (>= 1)."""
    return max(1, min(cores, round(cores - others_busy)))


class DecodeGovernor:
    """Sets torch's thread count during decoding from the load other processes put on the machine.

    Call `step()` once per generated token. Every `CHECK_TOKENS` tokens (and at least
    `CHECK_SECONDS` apart) it reads the machine's busy CPU time (/proc/stat) and this process's own
    (`os.times`); their difference over the wall time is what other processes used, in cores, and
    the threads become `free_cores(cores, that)`. Without /proc/stat it never changes the count.
    """

    def __init__(self, threads: Threads, cores: int | None = None, stat: Path = Path("/proc/stat")):
        self.threads, self.cores, self.stat = threads, cores or usable_cores(), stat
        self.count, self.steps, self.used = threads.decode, 0, {threads.decode}
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.last = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        """(wall s, machine busy core-seconds, this process's core-seconds), or None."""
        times = _cpu_times(self.stat)
        if times is None:
            return None
        mine = os.times()
        return time.perf_counter(), (times[1] - times[0]) / self.tick, mine.user + mine.system

    def step(self) -> None:
        """Count one decode step; every CHECK_TOKENS steps, follow the load (see the class docstring)."""
        self.steps += 1
        if not self.threads.adaptive or self.last is None or self.steps % CHECK_TOKENS:
            return
        now = self._sample()
        if now is None or now[0] - self.last[0] < CHECK_SECONDS:
            return
        wall, busy, mine = (b - a for a, b in zip(self.last, now))
        self.last = now
        count = free_cores(self.cores, max(busy - mine, 0.0) / wall)
        if count != self.count:
            torch.set_num_threads(count)
            self.count = count
            self.used.add(count)

    def wrap(self, on_token: Callable[[int], None] | None) -> Callable[[int], None]:
        """An `on_token` callback that steps the governor, then calls `on_token` (if any)."""

        def stepped(token: int) -> None:
            self.step()
            if on_token is not None:
                on_token(token)

        return stepped


@contextmanager
def decoding(threads: Threads) -> Iterator[DecodeGovernor]:
    """Decode inside this block: `threads.decode` threads to start, then the governor's (restored after)."""
    with using(threads.decode):
        yield DecodeGovernor(threads)


def decode_following_load(threads: Threads, decode: Callable[..., T], *args, on_token=None, **kwargs) -> T:
    """`decode(*args, on_token=…, **kwargs)` (e.g. `engine.generate.decode`) inside `decoding(threads)`,
    its `on_token` callback stepping the governor once per generated token."""
    with decoding(threads) as governor:
        return decode(*args, on_token=governor.wrap(on_token), **kwargs)
