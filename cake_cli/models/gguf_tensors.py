"""A GGUF's tensors under transformers' parameter names, dequantized one at a time (never all at once).

transformers reads a GGUF by dequantizing every tensor into one float32 state dict (2.5 GB for the
default model, held at once). This module uses transformers' own pieces for a model family — the
GGUF-to-transformers name map (``get_gguf_hf_weights_map``) and the family's tensor processor (the
reverse of llama.cpp's Q/K row permutation for Llama, Gemma's norm offset) — but hands out one
tensor at a time, or a block of rows of a large one, so a conversion holds one tensor's float32
copy at most. Dequantization is gguf-py's (``gguf.quants.dequantize``), the function transformers
calls, so the values are the ones a transformers load would give.

The file is read through a memory map: only the pages of the tensor being read are touched.
gguf-py's reader maps the file as an ``np.memmap``, whose every slice runs Python-level subclass
hooks; a parse slices once per metadata value (300,000 times for a 151,936-token vocabulary), so
`read_gguf` hands the reader a plain array over the same mapping (a third of the parse time).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers.modeling_gguf_pytorch_utils as gguf_utils
from gguf import GGMLQuantizationType, dequantize
from gguf.gguf_reader import ReaderTensor

# GGUF tensors that no tensor processor rewrites (processors touch attention Q/K rows, norms and
# MoE experts): safe to dequantize a block of rows at a time. These are the largest tensors of a
# small model (the default model's 151,936 x 896 embedding and output head, 545 MB each in float32).
ROW_SAFE = frozenset({"token_embd.weight", "output.weight"})
ROW_PROCESSORS = (gguf_utils.TensorProcessor, gguf_utils.LlamaTensorProcessor, gguf_utils.Gemma2TensorProcessor)


class _PlainMapping:
    """numpy as gguf-py's reader module sees it while `read_gguf` builds one reader: ``memmap``
    returns a plain read-only array over an existing mapping; every other name is numpy's."""

    def __init__(self, mapping: mmap.mmap):
        self._mapping = mapping

    def memmap(self, *_args, **_kw) -> np.ndarray:
        return np.frombuffer(self._mapping, dtype=np.uint8)

    def __getattr__(self, name: str):
        return getattr(np, name)


def read_gguf(path: os.PathLike | str, mode: str = "r") -> gguf.GGUFReader:
    """gguf-py's ``GGUFReader`` of `path`, its ``data`` a plain array over a read-only mapping of the
    file (``reader.mapping``) rather than an ``np.memmap`` (module docstring); mode ``r`` only (any
    other mode is gguf-py's own reader).

    Raises:
        OSError: the file cannot be opened. ValueError: it is empty or not a GGUF gguf-py reads.
    """
    if mode != "r":
        return _REAL_READER(path, mode)
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the mapping outlives the descriptor
    module = gguf.gguf_reader
    saved, module.np = module.np, _PlainMapping(mapping)
    try:
        reader = _REAL_READER(path, mode)
    finally:
        module.np = saved
    reader.mapping = mapping
    return reader


_REAL_READER = gguf.GGUFReader


@contextmanager
def one_parse() -> Iterator[None]:
    """Within the block, gguf-py's ``GGUFReader`` parses each file once: transformers' config,
    tokenizer and metadata readers each open the GGUF anew, and a parse builds every metadata string
    (7.5 s for the default model's 151,936-token vocabulary on the project's machine)."""
    real, readers = gguf.GGUFReader, {}
    if getattr(real, "shared_parse", False):  # already within one_parse: share the outer block's
        yield
        return

    def reader(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = read_gguf(path, mode)
        return readers[key]

    reader.shared_parse = True
    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = real


@dataclass(frozen=True)
class Blocks:
    """A tensor's bytes exactly as the GGUF stores them, one row of blocks per output row.

    ``data`` is [rows, row_bytes] uint8 (a view of the file's mapping), ``kind`` the GGML type
    name (``Q5_0``, ``Q8_0``, ``F32``, …) that ``gguf.quants.dequantize`` decodes, ``width`` the
    number of values per row.
    """

    data: np.ndarray
    kind: str
    width: int


class GgufTensors:
    """The tensors of GGUF file `path`, named as transformers names model `skeleton`'s parameters.

    Args:
        path: the GGUF file.
        skeleton: the transformers model the GGUF holds, parameters on the meta device (its
            ``state_dict`` keys drive the name map).
        config: the model's config fields (config.json's), which the family's tensor processor
            reads (head counts).

    The reader's tokenizer fields are dropped (the memory of the parsed vocabulary): within a
    `one_parse` block, read the tokenizer before constructing this.

    Raises:
        ValueError, OSError, NotImplementedError: the file is not a GGUF gguf-py reads, or its
            architecture has no name map in gguf-py.
    """

    def __init__(self, path: Path, skeleton, config: dict):
        self.path = path
        # the parse `one_parse` shares, where it is in effect
        self.reader = gguf.GGUFReader(str(path)) if getattr(gguf.GGUFReader, "shared_parse", False) else read_gguf(path)
        for key in [key for key in self.reader.fields if key.startswith("tokenizer.")]:
            del self.reader.fields[key]  # ~400 MB of parsed vocabulary for the default model, not needed here
        self.arch = str(self.reader.fields["general.architecture"].contents())
        self.processor = gguf_utils.TENSOR_PROCESSORS.get(self.arch, gguf_utils.TensorProcessor)(config=config)
        mapping = gguf_utils.get_gguf_hf_weights_map(skeleton, self.processor)
        self._by_hf: dict[str, ReaderTensor] = {}
        self.unmapped: list[str] = []
        for tensor in self.reader.tensors:
            hf = mapping.get(tensor.name)  # the supported families' processors keep names
            if hf is None:
                self.unmapped.append(tensor.name)
            else:
                self._by_hf[hf] = tensor

    def __contains__(self, hf_name: str) -> bool:
        return hf_name in self._by_hf

    def names(self) -> set[str]:
        """The transformers names of every tensor the file holds."""
        return set(self._by_hf)

    def shape(self, hf_name: str) -> tuple[int, ...]:
        """The tensor's shape in transformers' orientation ([out, in] for a weight matrix)."""
        tensor = self._by_hf[hf_name]
        return tuple(int(n) for n in reversed(tensor.shape.tolist()))

    def kind(self, hf_name: str) -> str:
        """The GGML type name the tensor is stored in (``Q4_K``, ``F32``, …)."""
        return GGMLQuantizationType(self._by_hf[hf_name].tensor_type).name

    def full(self, hf_name: str) -> torch.Tensor:
        """The whole tensor dequantized to float32 and processed as transformers would load it.

        Raises:
            KeyError: the file has no tensor of that name.
        """
        tensor = self._by_hf[hf_name]
        values = dequantize(tensor.data, tensor.tensor_type)
        values = self.processor.process(weights=values, name=tensor.name).weights
        return torch.from_numpy(_owned(values).reshape(self.shape(hf_name)))

    def row_safe(self, hf_name: str) -> bool:
        """Whether `rows` may read this tensor a block of rows at a time (see `ROW_SAFE`)."""
        tensor = self._by_hf.get(hf_name)
        return tensor is not None and tensor.name in ROW_SAFE and type(self.processor) in ROW_PROCESSORS

    def rows(self, hf_name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a 2-D `row_safe` tensor dequantized to float32: [stop - start, in].

        Raises:
            ValueError: the tensor is not row-safe (its processor may rewrite it as a whole).
        """
        if not self.row_safe(hf_name):
            raise ValueError(f"{hf_name} cannot be read a block of rows at a time")
        tensor = self._by_hf[hf_name]
        values = dequantize(tensor.data[start:stop], tensor.tensor_type)
        return torch.from_numpy(_owned(values))

    def release(self) -> None:
        """Drop the file pages read so far from this process's resident memory (they stay in the
        page cache): a conversion reads every tensor once, so its mapping need not keep them."""
        view = getattr(self.reader, "mapping", None) or getattr(self.reader.data, "_mmap", None)
        if view is not None and hasattr(mmap, "MADV_DONTNEED"):
            view.madvise(mmap.MADV_DONTNEED)

    def blocks(self, hf_name: str) -> Blocks:
        """The stored bytes of a 2-D tensor, one row of blocks per output row (`Blocks`).

        Raises:
            ValueError: a tensor that is not 2-D or whose processor rewrites it (not `row_safe`).
        """
        tensor = self._by_hf[hf_name]
        shape = self.shape(hf_name)
        if len(shape) != 2 or not self.row_safe(hf_name):
            raise ValueError(f"{hf_name} cannot be kept in its stored blocks")
        data = np.asarray(tensor.data).view(np.uint8).reshape(shape[0], -1)
        return Blocks(data, self.kind(hf_name), shape[1])


def _owned(values: np.ndarray) -> np.ndarray:
    """`values` as a writable, contiguous float32 array: an unquantized tensor dequantizes to a view of
    the read-only file mapping, which is copied; a decoded one is already the process's own."""
    if values.dtype == np.float32 and values.flags.writeable and values.flags.c_contiguous:
        return values
    return np.array(values, dtype=np.float32, order="C")
