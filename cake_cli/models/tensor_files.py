"""Tensors out of safetensors files, held the way a long run's memory wants them.

A tensor that safetensors hands back (``load_file``, ``safe_open(...).get_tensor``) is a view of a
memory mapping of the whole file, kept alive as long as any tensor of it is. Every page of that
file the process has touched then counts in its resident memory until the last view dies: after
loading the default model with w8a8 weights, 375 MiB of its 473 MiB quantized-weight cache stayed
resident next to the packed copies `W8A8Linear` builds from it (/proc's smaps on the AVX2 host,
benchmarks/runs/load-memory-avx2-2026-12-04.txt). So weights read once and then transformed are
*copied* (`read_rows`, `CopiedTensors`), and a tensor used as stored is *mapped* over its own
bytes only (`mapped`, `CopiedTensors`' ``kept``): only the pages it touches become resident, as in
llama.cpp's mmap'd GGUF, and they are file pages that processes share.

A mapping is private (copy-on-write: a write never reaches the file), but the pages not yet read
come from the file as it is then: map only files replaced by rename, never rewritten in place
(cake-cli's own converted checkpoints and weight caches, `paths.owned`).

The safetensors layout read here (`entries`) is the format's documented one: an 8-byte little-endian
header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, the data.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

CHUNK_BYTES = 32 * 2**20  # rows read per mapping: bounds the file pages resident at once
MAX_HEADER = 100_000_000  # bytes; safetensors' own limit

DTYPES = {  # safetensors' dtype names
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file: its dtype, shape and byte range in the file."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in the file
    end: int


def read_rows(path: Path, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Tensor `name` of safetensors file `path` cast to `dtype`, in the process's own memory, read
    `CHUNK_BYTES` of rows per mapping (each mapping closed before the next: the file's pages do not
    pile up in resident memory).

    Raises:
        SafetensorError, OSError: the file or the tensor cannot be read.
    """
    if not shape:
        with safe_open(str(path), "pt") as f:
            return f.get_tensor(name).to(dtype).clone()
    out = torch.empty(shape, dtype=dtype)
    row_bytes = max(1, math.prod(shape[1:]) * 4)
    step = max(1, CHUNK_BYTES // row_bytes)
    for start in range(0, shape[0], step):
        with safe_open(str(path), "pt") as f:
            out[start : start + step].copy_(f.get_slice(name)[start : start + step])
    return out


def entries(fd: int) -> tuple[dict[str, Entry], dict[str, str]]:
    """({tensor name: Entry}, the header's ``__metadata__``) of the safetensors file open as `fd`.

    Raises:
        OSError: unreadable file. ValueError: not a safetensors file this reading understands (a
            short or oversized header, bad JSON, an unknown dtype, a byte range that does not
            match its shape or lies outside the file).
    """
    raw = os.pread(fd, 8, 0)
    if len(raw) != 8:
        raise ValueError("too short for a safetensors file")
    (size,) = struct.unpack("<Q", raw)
    if size > MAX_HEADER:
        raise ValueError(f"declares a {size}-byte header: not a safetensors file")
    start, length = 8 + size, os.fstat(fd).st_size
    try:
        meta = json.loads(os.pread(fd, size, 8))
        metadata = dict(meta.pop("__metadata__", None) or {})
        out = {}
        for name, info in meta.items():
            dtype, shape = DTYPES[info["dtype"]], tuple(int(n) for n in info["shape"])
            begin, end = (start + int(o) for o in info["data_offsets"])
            if end - begin != math.prod(shape) * dtype.itemsize or begin < start or end > length:
                raise ValueError(f"tensor {name!r}: its bytes do not match its shape or lie outside the file")
            out[name] = Entry(dtype, shape, begin, end)
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable safetensors header ({type(e).__name__}: {e})") from None
    return out, metadata


def _map(fd: int, entry: Entry) -> torch.Tensor | None:
    """`entry` as a private mapping of its own bytes (from the page boundary below them), or None when
    it is empty, misaligned for its element size, or the mapping fails (e.g. no address space)."""
    if entry.end == entry.begin or entry.begin % entry.dtype.itemsize:
        return None
    base = entry.begin - entry.begin % mmap.ALLOCATIONGRANULARITY
    try:
        view = mmap.mmap(fd, entry.end - base, access=mmap.ACCESS_COPY, offset=base)
    except (OSError, ValueError, OverflowError):
        return None
    count = math.prod(entry.shape)
    return torch.frombuffer(view, dtype=entry.dtype, count=count, offset=entry.begin - base).view(entry.shape)


def _copy(fd: int, entry: Entry) -> torch.Tensor:
    """`entry` read into memory of its own (no mapping).

    Raises:
        OSError: a read error, or the file shorter than its header says.
    """
    size = entry.end - entry.begin
    if size == 0:
        return torch.empty(entry.shape, dtype=entry.dtype)
    buf = bytearray(size)
    done = 0
    while done < size:
        n = os.preadv(fd, [memoryview(buf)[done:]], entry.begin + done)
        if n == 0:
            raise OSError(f"the file ended {size - done} bytes before its tensor")
        done += n
    return torch.frombuffer(buf, dtype=entry.dtype).view(entry.shape)


def mapped(path: Path, name: str, dtype: torch.dtype) -> torch.Tensor | None:
    """Tensor `name` of safetensors file `path` as a private (copy-on-write) mapping of its bytes:
    pages are read from the file when first touched. The tensor keeps the mapping alive.

    Returns:
        The tensor, or None when it cannot be mapped as `dtype` without a cast (stored in another
        dtype, absent, empty, misaligned for its element size), the header is one this reading
        does not understand, or the mapping fails: the caller reads it instead (`read_rows`).

    Raises:
        OSError: the file cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        found = entries(fd)[0].get(name)
    except ValueError:
        found = None
    try:
        return _map(fd, found) if found is not None and found.dtype == dtype else None
    finally:
        os.close(fd)  # a mapping outlives the descriptor it was made from


class CopiedTensors(Mapping):
    """The tensors of safetensors file `path` by name, read when looked up, in their stored dtypes:
    copied into memory of their own, or mapped over their own bytes for the names in `kept` (tensors
    used as stored, e.g. `Int8Linear`'s weights). Whoever builds a model from them holds one copy at
    a time, and no mapping of the whole file keeps it resident.

    The file stays open from construction on (its descriptor closed with this object), so every
    lookup reads the file whose header was checked here, even if another is renamed over `path`.

    Attributes:
        metadata: the header's ``__metadata__`` ({} when none).

    Raises:
        OSError: the file cannot be opened or read (at construction or on a lookup).
        ValueError: not a safetensors file this reading understands (`entries`).
        KeyError: a name the file does not hold.
    """

    def __init__(self, path: Path, kept: frozenset[str] = frozenset()):
        self.path, self.kept = path, kept
        self._fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)
        self._entries, self.metadata = entries(self._fd)

    def __getitem__(self, name: str) -> torch.Tensor:
        entry = self._entries[name]
        view = _map(self._fd, entry) if name in self.kept else None
        return view if view is not None else _copy(self._fd, entry)

    def __contains__(self, name) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
