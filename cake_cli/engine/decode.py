"""Decode-time policies (spec §4): `grow` appends, `fixed` keeps each layer at its size.

`fixed` follows the authors' code: after each new token, the lowest-scoring tokens outside the
most recent w are evicted, scored by the new queries' attention (mean over the new queries,
pooled along tokens like Eq. 11's smoothing, averaged over each KV head's query heads).
"""

from __future__ import annotations

import time

import torch

from cake_cli.engine.config import CakeConfig
from cake_cli.engine.indicator import group_mean, smooth, top_k_sorted
from cake_cli.engine.window import window_attention


class FixedDecode:
    """Keeps layer l at `capacity[l]` tokens during decoding.

    Args:
        config: CAKE settings (window, pooling).
        capacity: [L] tokens per layer, e.g. B_l + w after an evicting prefill.

    Attributes:
        seconds: wall time spent scoring and evicting, seconds.
    """

    def __init__(self, config: CakeConfig, capacity: list[int]):
        self.config = config
        self.capacity = capacity
        self.seconds = 0.0

    def after_attention(self, cache, layer_idx: int, query: torch.Tensor, key: torch.Tensor, scaling: float) -> None:
        """Evict layer `layer_idx` back to its capacity after q new tokens were appended.

        Args:
            query: [1, H, q, d] rotated queries of the new tokens.
            key: [1, H_kv, k, d] all keys the layer holds (the q new ones last).
        """
        k = key.shape[-2]
        cap, w = self.capacity[layer_idx], self.config.window
        if k <= cap:
            return
        start = time.perf_counter()
        w = min(w, cap)
        a = window_attention(query[0], key[0], scaling)  # [H, q, k]
        candidates = smooth(a[:, :, : k - w].mean(dim=1), self.config.pool_kind, self.config.pool_kernel)  # [H, k-w]
        scores = group_mean(candidates, key.shape[1])  # [H_kv, k - w]
        chosen = top_k_sorted(scores, cap - w)  # [H_kv, cap - w]
        recent = torch.arange(k - w, k, device=chosen.device).expand(chosen.shape[0], w)
        cache.layers[layer_idx].keep(torch.cat([chosen, recent], dim=-1))
        self.seconds += time.perf_counter() - start


class GrowDecode:
    """Appends every new token; evicts nothing after prefill."""

    seconds = 0.0

    def after_attention(self, cache, layer_idx, query, key, scaling) -> None:  # noqa: D401 - no-op hook
        """Nothing to do."""
