"""A safetensors file written one tensor at a time, so a conversion never holds the whole output.

``safetensors.torch.save_file`` takes every tensor at once (and copies each to bytes first): for a
converted model that is the whole output in memory, twice. Here the header is laid out first, from
each tensor's name, dtype and shape, and each tensor's bytes are then written at their offset
whenever they are ready, in any order. The layout is the format's documented one (the reader is
`tensor_files.entries` and safetensors itself): an 8-byte little-endian header length, the JSON
header padded with spaces, the data. Tensors of larger elements come first so that every tensor
starts at a multiple of its element size (the header is padded to `ALIGN`): each can be mapped in
place (`tensor_files.mapped`).

The file is written under a temporary name beside its destination and renamed over it only once
every tensor has been written (`finish`): an interrupted conversion never leaves a file that looks
complete.
"""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from pathlib import Path

import torch

from cake_cli.models.tensor_files import DTYPES

ALIGN = 64  # bytes: the header is padded so the data starts at a multiple of this
NAMES = {dtype: name for name, dtype in DTYPES.items()}


class TensorWriter:
    """Writes safetensors file `path` from a plan of ``{name: (dtype, shape)}``.

    Usage: ``w = TensorWriter(path, plan, metadata)``, ``w.write(name, tensor)`` once per planned
    name (any order), then ``w.finish()``; ``w.abort()`` (or leaving a ``with`` block on an error)
    removes the temporary file.

    Raises:
        OSError: the folder cannot be written (at construction) or the disk is full (on a write).
        KeyError, ValueError: `write` of a name not planned, twice, or of another dtype or shape;
            `finish` with a planned tensor unwritten.
    """

    def __init__(self, path: Path, plan: dict[str, tuple[torch.dtype, tuple[int, ...]]], metadata: dict[str, str]):
        self.path = Path(path)
        order = sorted(plan, key=lambda name: (-plan[name][0].itemsize, name))
        header: dict = {"__metadata__": dict(metadata)}
        self._spans: dict[str, tuple[int, int]] = {}
        offset = 0
        for name in order:
            dtype, shape = plan[name]
            size = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            self._spans[name] = (offset, offset + size)
            offset += size
        self._plan = plan
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(8 + len(raw)) % ALIGN)
        self._start = 8 + len(raw)
        self._todo = set(plan)
        self._written = dict.fromkeys(plan, 0)  # rows written so far (each row is written once)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self._fd, self._tmp = fd, Path(tmp)
        try:
            os.ftruncate(fd, self._start + offset)
            os.pwrite(fd, struct.pack("<Q", len(raw)) + raw, 0)
        except BaseException:
            self.abort()
            raise

    def write(self, name: str, tensor: torch.Tensor, row: int = 0) -> None:
        """Write `tensor` as planned tensor `name`, or as its rows from `row` on (a block of rows of a
        large tensor, the block's shape being the planned one but for its first dimension, each row
        written once); the name counts as written when all its rows are.

        Raises:
            KeyError: `name` is not planned or already written. ValueError: another dtype, or a
                shape that does not fit. OSError: the write failed (disk full).
        """
        if name not in self._todo:
            raise KeyError(f"{name} is not a planned tensor still to write")
        dtype, shape = self._plan[name]
        total, count = (shape[0], tensor.shape[0]) if shape and tensor.dim() else (1, 1)
        if tensor.dtype != dtype or tuple(tensor.shape[1:]) != tuple(shape[1:]) or row + count > total:
            raise ValueError(f"{name}: {tensor.dtype} {tuple(tensor.shape)} at row {row} does not fit {dtype} {shape}")
        begin = self._start + self._spans[name][0] + row * math.prod(shape[1:]) * dtype.itemsize
        data = memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
        while data:
            done = os.pwrite(self._fd, data, begin)
            data, begin = data[done:], begin + done
        self._written[name] += count
        if self._written[name] >= total:
            self._todo.discard(name)

    def finish(self) -> Path:
        """Flush, then rename the file into place; returns its path.

        Raises:
            ValueError: a planned tensor was never written. OSError: the flush or rename failed.
        """
        if self._todo:
            left = sorted(self._todo)
            self.abort()
            raise ValueError(f"{len(left)} planned tensors were never written, e.g. {left[0]}")
        try:
            os.fsync(self._fd)
            os.fchmod(self._fd, 0o666 & ~_umask())
            os.close(self._fd)
            self._fd = -1
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Close and remove the temporary file (nothing is left behind)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> TensorWriter:
        return self

    def __exit__(self, kind, *_exc) -> None:
        if kind is not None:
            self.abort()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
