"""The input embedding kept in the GGUF's own blocks, each looked-up row dequantized when read.

An embedding is a lookup, not a product: a prompt of n tokens reads n of its rows. The default
model's is 151,936 x 896, 545 MB in float32 and 93.6 MB in the GGUF (Q5_0). Kept as the GGUF stores
it (`gguf_tensors.Blocks`, mapped from the converted file: only the rows a prompt reads become
resident) and decoded by the same function that decoded the whole table before (gguf-py's
``dequantize``, blockwise, so a row decodes to the same float32 values alone as within the table),
it gives exactly the values the float32 checkpoint held, at the GGUF's size.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType, dequantize
from torch import nn


class BlockEmbedding(nn.Module):
    """``nn.Embedding`` over rows stored in GGML blocks (see the module docstring).

    Args:
        blocks: [num_embeddings, row_bytes] uint8, one row of blocks per token id.
        kind: the GGML type name of the blocks (``Q5_0``, ``Q8_0``, ``F32``, …).
        embedding_dim: values per row.
        dtype: the dtype looked-up rows are returned in (the model's compute dtype).

    Input: ids [...] int64 in [0, num_embeddings). Output: [..., embedding_dim] in `dtype`.

    Raises:
        ValueError: an unknown GGML type name, or blocks that do not decode to `embedding_dim` values.
        IndexError: an id outside the table (on lookup).
    """

    def __init__(self, blocks: torch.Tensor, kind: str, embedding_dim: int, dtype: torch.dtype):
        super().__init__()
        try:
            self.qtype = GGMLQuantizationType[kind]
        except KeyError:
            raise ValueError(f"unknown GGML type {kind!r}") from None
        self.num_embeddings, self.embedding_dim, self.kind, self.dtype = blocks.shape[0], embedding_dim, kind, dtype
        self.register_buffer("blocks", blocks)
        if blocks.shape[0] and dequantize(blocks[:1].numpy(), self.qtype).shape[-1] != embedding_dim:
            raise ValueError(f"{kind} blocks of {blocks.shape[1]} bytes do not hold {embedding_dim} values")

    @property
    def weight(self) -> torch.Tensor:
        """The stored blocks ([num_embeddings, row_bytes] uint8): what callers read a device from."""
        return self.blocks

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """[n] int64 ids -> [n, embedding_dim] float32 rows, decoded."""
        return torch.from_numpy(dequantize(self.blocks[ids].numpy(), self.qtype).copy())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """[...] ids -> [..., embedding_dim] rows in ``dtype`` (each distinct id decoded once)."""
        flat = ids.reshape(-1).cpu()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise IndexError(f"token id out of range for an embedding of {self.num_embeddings} rows")
        unique, inverse = torch.unique(flat, return_inverse=True)
        out = self.rows(unique).to(self.dtype)[inverse]
        return out.view(*ids.shape, self.embedding_dim).to(ids.device)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, blocks={self.kind}, dtype={self.dtype}"
