"""Tensors out of safetensors files, held the way a long run's memory wants them.

A tensor that safetensors hands back (``load_file``, ``safe_open(...).get_tensor``) is a view of a
memory mapping of the whole file, kept alive as long as any tensor of it is. Every page of that
file the process has touched then counts in its resident memory until the last view dies: reading
the default model's quantized-weight cache that way kept all 473 MB of it resident next to the
packed copies `W8A8Linear` builds from it (measured with /proc's smaps on the AVX2 host). So
weights read once and then transformed are *copied* out of short-lived mappings (`read_rows`,
`CopiedTensors`); a large table read a few rows at a time, the input embedding, is *mapped* privately
(`mapped`): only the rows a prompt looks up become resident, as in llama.cpp's mmap'd GGUF.

The safetensors layout read here (`header`) is the format's documented one: an 8-byte little-endian
header length, a JSON header {name: {dtype, shape, data_offsets}}, then the data.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open

CHUNK_BYTES = 32 * 2**20  # rows read per mapping: bounds the file pages resident at once

DTYPES = {  # safetensors' dtype names
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


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


class CopiedTensors(Mapping):
    """The tensors of safetensors file `path` by name, each copied out of a mapping of its own when
    looked up (in its stored dtype; the mapping closes before the lookup returns). Whoever builds a
    model from them holds one tensor's copy at a time, and no view keeps the file resident.

    Raises:
        SafetensorError, OSError: the file cannot be read (at construction or on a lookup).
        KeyError: a name the file does not hold.
    """

    def __init__(self, path: Path):
        self.path = path
        with safe_open(str(path), "pt") as f:
            self.names = tuple(f.keys())

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise KeyError(name)
        with safe_open(str(self.path), "pt") as f:
            return f.get_tensor(name).clone()

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def header(path: Path) -> tuple[int, dict]:
    """(byte offset where the data begins, the JSON header) of safetensors file `path`.

    Raises:
        OSError: unreadable file. ValueError: not a safetensors header.
    """
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path} is too short for a safetensors file")
        (size,) = struct.unpack("<Q", raw)
        if size > 100 * 2**20:
            raise ValueError(f"{path} declares a {size}-byte header: not a safetensors file")
        return 8 + size, json.loads(f.read(size))


def mapped(path: Path, name: str, dtype: torch.dtype) -> torch.Tensor | None:
    """Tensor `name` of safetensors file `path` as a private (copy-on-write) memory mapping: pages are
    read from the file when first touched and a write never reaches the file. The tensor keeps the
    mapping alive.

    Returns:
        The tensor, or None when it cannot be mapped as `dtype` without a cast (stored in another
        dtype, absent, misaligned for its element size, its extent outside the file, or a header
        this reading does not parse): the caller reads it instead (`read_rows`).

    Raises:
        OSError: the file cannot be opened.
    """
    try:
        start, meta = header(path)
    except ValueError:
        return None
    info = meta.get(name)
    if not isinstance(info, dict) or DTYPES.get(info.get("dtype")) != dtype:
        return None
    shape = tuple(info["shape"])
    begin, end = (start + offset for offset in info["data_offsets"])
    size = torch.empty((), dtype=dtype).element_size()
    if begin % size or end - begin != math.prod(shape) * size or end > path.stat().st_size or not shape:
        return None
    with open(path, "rb") as f:
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    return torch.frombuffer(view, dtype=dtype, count=math.prod(shape), offset=begin).view(shape)
