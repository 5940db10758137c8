"""Peak resident memory of this process during a block, sampled from /proc (Linux)."""

from __future__ import annotations

import os
import threading


def rss_bytes() -> int:
    """Resident set size of this process now, in bytes (0 where /proc is unavailable)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


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
