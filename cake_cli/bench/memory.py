"""Resident memory of this process from /proc (Linux): now, its peak during a block (sampled), and by mapping."""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from pathlib import Path

SMAPS = Path("/proc/self/smaps")
MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")  # an smaps line that opens a mapping


def rss_bytes() -> int:
    """Resident set size of this process now, in bytes (0 where /proc is unavailable)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def resident_by_mapping() -> Counter:
    """Bytes of this process resident now per mapping name, from /proc/self/smaps: a mapped file's
    path, ``[heap]``, ``[stack]``, or ``[anon]`` for unnamed anonymous memory.

    Raises:
        OSError: no /proc/self/smaps (not Linux, or a kernel without it).
    """
    out: Counter = Counter()
    name = "[anon]"
    for line in SMAPS.read_text(encoding="utf-8", errors="replace").splitlines():
        if MAPPING.match(line):
            fields = line.split(maxsplit=5)
            name = fields[5] if len(fields) == 6 else "[anon]"
        elif line.startswith("Rss:"):
            out[name] += int(line.split()[1]) * 1024
    return out


class PeakRss:
    """Context manager: `.peak` is the largest RSS seen while inside, in bytes (sampled every
    `interval` seconds, plus at entry and exit); `.start` is the RSS at entry."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRss:
        self.start = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, rss_bytes())
