"""KV-eviction methods as pairings of an allocation and an indicator (spec §6, paper Sec. 5.5).

An indicator maps window attention to token scores; an allocation maps layer statistics to
budgets. CAKE is one pairing (cake allocation + cake indicator); the baselines are others, and
every pairing runs through the same engine path (cascade.py, decode.py).

| method       | allocation | indicator  |
|--------------|------------|------------|
| streamingllm | uniform    | streaming  |
| h2o          | uniform    | h2o        |
| tova         | uniform    | tova       |
| snapkv       | uniform    | snapkv     |
| pyramidkv    | pyramid    | snapkv     |
| cake         | cake       | cake       |
| full         | (no eviction)           |
"""

from __future__ import annotations

from dataclasses import replace

import torch

from cake_cli.engine import allocation
from cake_cli.engine.config import ALLOCATIONS, INDICATORS, CakeConfig  # noqa: F401 - re-exported
from cake_cli.engine.indicators import group_mean, smooth
from cake_cli.engine.preference import variance_rows

METHODS: dict[str, tuple[str, str] | None] = {
    "full": None,
    "streamingllm": ("uniform", "streaming"),
    "h2o": ("uniform", "h2o"),
    "tova": ("uniform", "tova"),
    "snapkv": ("uniform", "snapkv"),
    "pyramidkv": ("pyramid", "snapkv"),
    "cake": ("cake", "cake"),
}
SINK_TOKENS = 4  # StreamingLLM's attention sinks
SNAPKV_POOL = ("max", 7)  # SnapKV's smoothing (spec §3)
PYRAMID_BETA = 20  # PyramidKV's ratio between the top and bottom layers' budgets


def token_scores(
    kind: str,
    a: torch.Tensor,
    positions: torch.Tensor,
    num_kv_heads: int,
    *,
    gamma: float,
    pool: tuple[str, int],
    column_var: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eviction indicator of candidate tokens for one layer; larger = keep.

    Args:
        kind: one of INDICATORS.
        a: [H, q, m] float32 attention of the q most recent queries (the window at prefill, the
            new tokens at decode) over the m candidate tokens, in position order.
        positions: [H_kv, m] true positions of the candidates (used by `streaming`).
        num_kv_heads: H_kv; per-query-head scores are averaged over each KV head's group.
        gamma: CAKE's variance weight (Eq. 11).
        pool: (kind, kernel) smoothing of the CAKE indicator (profile setting).
        column_var: optional precomputed Var_i a, [H, m] (saves a pass at prefill).

    Returns:
        [H_kv, m] float32 scores.
    """
    if kind == "streaming":
        pos = positions.float()
        return torch.where(pos < SINK_TOKENS, torch.full_like(pos, float("inf")), pos)  # sinks, then recency
    if kind == "cake":
        if a.shape[-2] == 1:  # one query (decode): the variance term is 0
            per_head = smooth(a[:, 0, :], *pool)
        else:
            var = column_var if column_var is not None else variance_rows(a)
            per_head = smooth(a.mean(dim=-2) + gamma * var, *pool)  # Eq. 11
    elif kind == "snapkv":
        per_head = smooth(a.mean(dim=-2), *SNAPKV_POOL)
    elif kind == "h2o":
        per_head = a.sum(dim=-2)  # accumulated attention
    elif kind == "tova":
        per_head = a[:, -1, :]  # the last query only
    else:
        raise ValueError(f"unknown indicator {kind!r}; choose one of {INDICATORS}")
    return group_mean(per_head, num_kv_heads)  # [H_kv, m]


def pyramid_weights(num_layers: int, beta: int = PYRAMID_BETA) -> list[float]:
    """PyramidKV's linear schedule: layer 0 gets the most, the last layer 1/beta of the mean.

    With mean budget c: min = c / beta, max = 2c - min, linear in between, so the weights sum to
    L · c. Returned normalised to mean 1.
    """
    if num_layers == 1:
        return [1.0]
    low = 1.0 / beta
    high = 2.0 - low
    step = (high - low) / (num_layers - 1)
    return [high - layer * step for layer in range(num_layers)]


def static_budgets(kind: str, num_layers: int, total: int, cap: int) -> list[int]:
    """Budgets known before prefill (uniform or pyramid), integers summing to the total (capped)."""
    if kind == "uniform":
        return allocation.uniform(num_layers, total, cap)
    if kind == "pyramid":
        weights = pyramid_weights(num_layers)
        return allocation.round_budgets(allocation.waterfill(weights, float(total), float(cap)), cap)
    raise ValueError(f"no static schedule for allocation {kind!r}")


def with_method(base: CakeConfig, method: str) -> CakeConfig | None:
    """`base` switched to a named method's allocation and indicator; None for "full".

    Raises:
        ValueError: unknown method name.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    pair = METHODS[method]
    return None if pair is None else replace(base, allocation=pair[0], indicator=pair[1])
