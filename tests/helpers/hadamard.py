"""The obviously correct Hadamard rotation (`engine.kvquant.rotate`'s reference): Sylvester matrices built by
Kronecker products, applied block-diagonally as a float64 matrix product."""

from __future__ import annotations

import torch


def sylvester(p: int) -> torch.Tensor:
    """[p, p] float64 orthonormal Hadamard matrix, p a power of 2."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < p:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), h)
    return h / p**0.5


def rotated_reference(x: torch.Tensor, p: int) -> torch.Tensor:
    """x [..., d] times the block-diagonal Hadamard matrix with blocks of p channels (p dividing d), in float64 (the
    matrix is symmetric, so x H = (H x^T)^T)."""
    return x.double() @ torch.block_diag(*[sylvester(p)] * (x.shape[-1] // p))
