"""Which file, if any, backs a tensor's memory, and how much of a file is resident: /proc (Linux)."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from cake_cli.bench.memory import SMAPS, resident_by_mapping

MAPS = Path("/proc/self/maps")

# the bounds the tests put on resident pages assume 4 KiB pages and a kernel with smaps
needs_proc_maps = pytest.mark.skipif(
    not (MAPS.is_file() and SMAPS.is_file()) or mmap.PAGESIZE != 4096, reason="needs /proc/self/smaps, 4 KiB pages"
)


def mappings() -> list[tuple[int, int, str]]:
    """(start, end, path or '') of every mapping of this process."""
    out = []
    for line in MAPS.read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in fields[0].split("-"))
        out.append((start, end, fields[5] if len(fields) == 6 else ""))
    return out


def mapped_paths() -> set[Path]:
    """The resolved paths of the files this process maps now."""
    return {Path(p).resolve() for _, _, p in mappings() if p.startswith("/")}


def file_mapping(t: torch.Tensor) -> Path | None:
    """The file whose mapping holds `t`'s first byte, or None (anonymous memory)."""
    ptr = t.data_ptr()
    for start, end, path in mappings():
        if start <= ptr < end:
            return Path(path).resolve() if path.startswith("/") else None
    return None


def mapping_size(t: torch.Tensor) -> int:
    """Bytes of address space of the mapping that holds `t`'s first byte (0: none)."""
    ptr = t.data_ptr()
    return next((end - start for start, end, _ in mappings() if start <= ptr < end), 0)


def resident_bytes(path: Path) -> int:
    """Bytes of `path`'s mappings resident in this process."""
    return resident_by_mapping().get(str(path.resolve()), 0)
