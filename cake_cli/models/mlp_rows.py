"""A long prompt's MLP run in blocks of rows, so its intermediates stay small.

A decoder layer's dense MLP (down(act(gate(x)) · up(x))) treats every token on its own, but over a
whole prompt of n tokens it holds n × intermediate_size activations three times at once (gate, up,
their product): at 31,000 tokens of the default model in float32, 603 MB each, the largest
tensors of a prefill (attention under SDPA's causal kernel builds no n × n matrix, and CAKE's
cascade keeps the cache near its budget). Running the MLP on blocks of at most `ROWS` tokens and
writing each block's output into one [..., n, D] tensor bounds them to ROWS × intermediate_size. A
row's product does not read the other rows, so the outputs are the class forward's up to the
kernels' blocking (tests/models/test_mlp_rows.py). The blocks are near-equal (n split into
ceil(n / ROWS) parts, none under half of ROWS), so none is short enough for a quantized layer's
decode kernel (`quantize.DECODE_ROWS`), which rounds activations differently from prefill's
dequantized product. A CAKE run over 31,000 tokens (float32, w8a8, B = 256) peaked at 3,079 MiB of
process memory against 4,614 MiB before, its prefill 570 s against 581 s
(benchmarks/runs/prefill-memory-avx2-2026-12-04.txt). A quantized layer dequantizes its weight once
per block (~31 times per layer at 31,000 tokens: part of those 570 s).

Only the dense MLP classes of the engine's families are bounded (`DENSE_MLPS`, each position-wise
and returning one tensor), and none whose forward or any submodule's accelerate wraps (a device
map's offload hook would fetch the weights again for every block).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from cake_cli.models.quantize import DECODE_ROWS

ROWS = 1024  # tokens per MLP block at most: 1024 × 4864 float32 = 19 MiB per intermediate on the default model
DENSE_MLPS = frozenset(
    {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "Gemma2MLP", "Gemma3MLP", "Phi3MLP"}
)  # the MLP classes of `engine.families.FAMILIES`, by name (tests check every family's)


def block_bounds(tokens: int, rows: int) -> list[tuple[int, int]]:
    """[start, end) of ceil(tokens / rows) near-equal blocks covering 0..tokens, each at most `rows`
    long and, when tokens > rows, at least (rows + 1) // 2 long (sizes differ by at most one)."""
    count = -(-tokens // rows)
    size, extra = divmod(tokens, count)
    bounds, start = [], 0
    for i in range(count):
        end = start + size + (i < extra)
        bounds.append((start, end))
        start = end
    return bounds


def forward_in_blocks(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`mlp`'s class forward on near-equal blocks of at most ``mlp.cake_mlp_rows`` tokens (`block_bounds`).

    Args:
        mlp: a module of a class in `DENSE_MLPS`, bounded by `bound_mlp_rows`.
        x: [..., T, D] hidden states (T tokens along the second-to-last dimension).

    Returns:
        [..., T, D_out] in the dtype the class forward returns; for T <= rows (every decode step)
        the class forward's own output.
    """
    forward, tokens = type(mlp).forward, x.shape[-2]
    if tokens <= mlp.cake_mlp_rows:
        return forward(mlp, x)
    out = None
    for start, end in block_bounds(tokens, mlp.cake_mlp_rows):
        block = forward(mlp, x[..., start:end, :])
        if out is None:  # the first block gives the output's shape and dtype
            out = block.new_empty(*block.shape[:-2], tokens, block.shape[-1])
        out[..., start:end, :] = block
    return out


def dense_mlps(model: nn.Module) -> list[nn.Module]:
    """The modules of `model` that `bound_mlp_rows` bounds (module docstring), in module order."""
    return [
        m
        for m in model.modules()
        if type(m).__name__ in DENSE_MLPS and not any(hasattr(s, "_hf_hook") for s in m.modules())
    ]


def bound_mlp_rows(model: nn.Module, rows: int = ROWS) -> int:
    """Make every dense MLP of `model` run long inputs in blocks of at most `rows` tokens
    (`forward_in_blocks`), on this model instance only: its class is untouched, and a deep copy or a
    pickled copy keeps it, bound to the copy. Calling it again sets the new `rows`.

    Returns:
        How many MLP modules were bounded.

    Raises:
        ValueError: rows <= 2 × `quantize.DECODE_ROWS` (a block could then be short enough for a
            quantized layer's decode kernel).
    """
    if rows <= 2 * DECODE_ROWS:
        raise ValueError(f"rows must be more than {2 * DECODE_ROWS}, got {rows}")
    mlps = dense_mlps(model)
    for mlp in mlps:
        mlp.cake_mlp_rows = rows
        mlp.forward = functools.partial(forward_in_blocks, mlp)
    return len(mlps)
