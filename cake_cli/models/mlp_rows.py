"""A long prompt's MLP run in blocks of rows, so its intermediates stay small.

A decoder layer's dense MLP (down(act(gate(x)) · up(x))) treats every token on its own, but over a
whole prompt of n tokens it holds n × intermediate_size activations three times at once (gate, up,
their product): at 31,000 tokens of the default model in float32, 603 MB each, the largest
tensors of a prefill (attention under SDPA's causal kernel builds no n × n matrix, and CAKE's
cascade keeps the cache near its budget). Running the MLP on blocks of `ROWS` tokens and writing
each block's output into one [.., n, D] tensor bounds them to ROWS × intermediate_size. Each row's
arithmetic is unchanged: a row's product does not read the other rows (the same values up to the
kernels' blocking; tests/models/test_mlp_rows.py). A CAKE run over 31,000 tokens (float32, w8a8,
B = 256) peaked at 3,079 MiB of process memory against 4,614 MiB before, its prefill 570 s against
581 s (benchmarks/runs/prefill-memory-avx2-2026-12-04.txt).

Only dense MLPs are bounded (a module named ``mlp`` whose class name ends in ``MLP``: Llama,
Mistral, Qwen2/3, Gemma 2/3, Phi-3, …); a mixture-of-experts block returns more than one tensor
and is left as it is.
"""

from __future__ import annotations

import types

import torch
from torch import nn

ROWS = 1024  # tokens per MLP block: 1024 × 4864 float32 = 19 MiB per intermediate on the default model


def forward_in_blocks(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`mlp`'s own forward (its class's: [..., T, D] -> [..., T, D_out], position-wise) on blocks of at
    most ``mlp.cake_mlp_rows`` tokens along T, written into one output; T within it (every decode
    step) is one call."""
    forward, rows, tokens = type(mlp).forward, mlp.cake_mlp_rows, x.shape[-2]
    if tokens <= rows:
        return forward(mlp, x)
    first = forward(mlp, x[..., :rows, :])  # its shape and dtype give the output's
    out = first.new_empty(*first.shape[:-2], tokens, first.shape[-1])
    out[..., :rows, :] = first
    del first
    for start in range(rows, tokens, rows):
        out[..., start : start + rows, :] = forward(mlp, x[..., start : start + rows, :])
    return out


def dense_mlps(model: nn.Module) -> list[nn.Module]:
    """The dense MLP modules of `model`'s decoder layers (module docstring), in module order; a module
    whose forward accelerate wraps (a device map's hook) is left out."""
    return [
        m
        for name, m in model.named_modules()
        if name.split(".")[-1] == "mlp" and type(m).__name__.endswith("MLP") and not hasattr(m, "_hf_hook")
    ]


def bound_mlp_rows(model: nn.Module, rows: int = ROWS) -> int:
    """Make every dense MLP of `model` run long inputs in blocks of `rows` tokens
    (`forward_in_blocks`), on this model instance only (its class is untouched; a deep copy keeps
    it, bound to the copy). Calling it again sets the new `rows`.

    Returns:
        How many MLP modules were bounded.

    Raises:
        ValueError: rows < 1.
    """
    if rows < 1:
        raise ValueError(f"rows must be at least 1, got {rows}")
    mlps = dense_mlps(model)
    for mlp in mlps:
        mlp.cake_mlp_rows = rows
        mlp.forward = types.MethodType(forward_in_blocks, mlp)
    return len(mlps)
