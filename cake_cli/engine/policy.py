"""The engine's contracts, named once: what a cache calls after a layer attends, and what a
finished cascade offers the reports.

- `EvictionPolicy`: the hook a `CakeCache` calls once layer `layer_idx` has attended. The prefill
  cascade (`cascade.CascadePrefill`, and `continuation.DeferredCascade`), the decode policies
  (`decode.FixedDecode`, `decode.GrowDecode`) and the benchmark recorder (`replay.Recorder`)
  implement it. A policy that scores a single decode query from the probabilities the attention
  function already computed also implements `needs_probs` (`ScoresDecodeQuery`).
- `AttentionHook`: what the attention functions of `engine.attention` call on the `cake=` object
  they receive, i.e. `cache.CakeCache`, which forwards to its policy.
- `CascadeView`: what reports and decoding read of a finished cascade: per-layer statistics
  (H_l, V_l, P_l; paper Eqs. 3-7), the final budgets B_l and whether anything was evicted.
  `CascadePrefill` offers it live; `continuation.SavedCascade` rebuilds it from a saved cache.

Only typing here (no torch at import), so the CLI can import the names cheaply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from cake_cli.engine.cascade import LayerStats


@runtime_checkable
class EvictionPolicy(Protocol):
    """Called by the cache after layer `layer_idx` attended over its keys."""

    def after_attention(
        self,
        cache,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        scaling: float,
        probs: torch.Tensor | None = None,
        softcap: float | None = None,
    ) -> None:
        """Score and evict (or record) layer `layer_idx`.

        Args:
            cache: the `CakeCache` being filled or decoded.
            layer_idx: 0-based layer index.
            query: [1, H, q, d] rotated queries of the q tokens just run (q = n at prefill).
            key: [1, H_kv, k, d] rotated keys the layer attended over (cached + new).
            scaling: the softmax scale (1/sqrt(d) unless the family sets its own).
            probs: [H, 1, k] float32 probabilities of a single decode query when the attention
                function computed them (see `ScoresDecodeQuery`), else None.
            softcap: the layer's attention-logit soft-capping (Gemma 2), or None.
        """
        ...


@runtime_checkable
class ScoresDecodeQuery(Protocol):
    """A policy that can reuse a single decode query's probabilities for its eviction score."""

    def needs_probs(self, layer_idx: int, key_len: int) -> bool:
        """True when layer `layer_idx`, now holding `key_len` slots, will evict at this step."""
        ...


@runtime_checkable
class AttentionHook(Protocol):
    """The `cake=` object the attention functions call (a `CakeCache`)."""

    def after_attention(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        scaling: float,
        probs: torch.Tensor | None = None,
        softcap: float | None = None,
    ) -> None:
        """See `EvictionPolicy.after_attention` (the cache passes itself to its policy)."""
        ...

    def needs_probs(self, layer_idx: int, key_len: int) -> bool:
        """See `ScoresDecodeQuery.needs_probs` (False for local layers and policies without it)."""
        ...


@runtime_checkable
class CascadeView(Protocol):
    """What a finished cascade offers reports and decoding."""

    @property
    def stats(self) -> list[LayerStats | None]:
        """[L] per-layer dispersion, shift and preference (None for a local layer or n <= w)."""
        ...

    @property
    def final_budgets(self) -> list[int | None] | None:
        """[L] final B_l in tokens (None for a local layer), or None when nothing was evicted."""
        ...

    @property
    def evicting(self) -> bool:
        """True when the prompt was longer than the budget and tokens were evicted."""
        ...

    @property
    def seconds(self) -> float:
        """Wall time spent scoring and evicting, seconds."""
        ...
