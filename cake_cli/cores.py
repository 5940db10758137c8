"""The CPU cores this process may run on, and `--threads` held to them (light: no torch).

More torch threads than cores only wait for each other: every parallel region ends in a barrier
that a descheduled thread holds up (`--threads 999` on 2 cores decoded at 0.3 tok/s instead of
14.6, and the load average reached 299), so a larger `--threads` is capped with a warning.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def capped_threads(requested: int | None, cores: int | None = None) -> tuple[int | None, str | None]:
    """`--threads` held to the usable cores: (threads to use, the warning when capped, else None).

    Args:
        requested: --threads (None: automatic, left as is).
        cores: usable cores (default: `usable_cores()`).
    """
    cores = cores or usable_cores()
    if requested is None or requested <= cores:
        return requested, None
    plural = "" if cores == 1 else "s"
    return cores, (
        f"--threads {requested} is more than the {cores} usable core{plural} of this machine: using {cores} "
        "(more threads than cores only wait for each other)"
    )
