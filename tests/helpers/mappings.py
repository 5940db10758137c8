"""Which file, if any, backs a tensor's memory: read from /proc/self/maps (Linux)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

MAPS = Path("/proc/self/maps")
HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")  # an smaps line that opens a mapping

needs_proc_maps = pytest.mark.skipif(not MAPS.is_file(), reason="needs /proc/self/maps (Linux)")


def _mappings() -> list[tuple[int, int, str]]:
    """(start, end, path or '') of every mapping of this process."""
    out = []
    for line in MAPS.read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in fields[0].split("-"))
        out.append((start, end, fields[5] if len(fields) == 6 else ""))
    return out


def mapped_paths() -> set[Path]:
    """The resolved paths of the files this process maps now."""
    return {Path(p).resolve() for _, _, p in _mappings() if p.startswith("/")}


def file_mapping(t: torch.Tensor) -> Path | None:
    """The file whose mapping holds `t`'s first byte, or None (anonymous memory)."""
    ptr = t.data_ptr()
    for start, end, path in _mappings():
        if start <= ptr < end:
            return Path(path).resolve() if path.startswith("/") else None
    return None


def resident_bytes(path: Path) -> int:
    """Bytes of `path`'s mappings resident in this process (the sum of their Rss in /proc/self/smaps)."""
    total, inside, target = 0, False, str(path.resolve())
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if HEADER.match(line):
            inside = line.split(maxsplit=5)[5:] == [target]
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total
