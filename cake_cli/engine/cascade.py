"""CAKE during prefill: per-layer statistics, cascading allocation and eviction (Sec. 4.1-4.3).

After layer m has attended over the whole prompt, its window attention gives H_m, V_m, P_m and
the indicator of its evictable tokens; then every layer 0..m is evicted to its stage-m budget
B_l^(m) (Eqs. 9-10). Re-eviction ranks the stored indicator of the tokens a layer still holds,
so the result equals one eviction with the final budgets (Thm. 1).

Local layers (a native sliding window, `families.attention_layout`) are not scored and get no
budget: the allocation runs over the global layers only, with B_total = (B - w) · L_global.

Baselines run the same path with another allocation (uniform / pyramid budgets, fixed before
prefill, so each layer is evicted once) and/or another indicator (`indicators.INDICATORS`). H2O
scores from the accumulated attention of every prompt query, which the cache accumulated block by
block while the layer attended (`cache.CakeCache(accumulate=True)`); the window attention still
gives the layer's statistics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from cake_cli.engine import allocation
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.indicators import accumulates, shared_ranking, token_scores, top_k_sorted, variance_rows
from cake_cli.engine.preference import dispersion, log_preference, shift
from cake_cli.engine.window import window_attention


@dataclass(frozen=True)
class LayerStats:
    """Statistics of one layer after prefill (Eqs. 3-7)."""

    dispersion: float  # H_l, nats
    shift: float  # V_l
    log_preference: float  # log P_l (-inf when P_l = 0)


class CascadePrefill:
    """Runs the cascade inside one prefill forward of an n-token prompt.

    Args:
        config: CAKE settings.
        num_layers: L.
        prompt_len: n, tokens in the prompt.
        on_layer: optional progress callback `(layer_idx, num_layers)` after each layer.
        collect_stats: compute H_l, V_l, P_l even when the allocation does not use them (for
            reports); the CAKE allocation always computes them.
        windows: [L] a local layer's native sliding window, None for a global layer (None: all
            global), as the CakeCache was built.

    Attributes:
        stats: [L] LayerStats (None until the layer ran, when n <= w, or for a local layer).
        stages: budgets of the global layers up to layer m after stage m (empty when nothing is
            evicted), in the order of `global_layers`.
        evicting: True when n > B (otherwise every layer keeps all tokens).
        seconds: wall time spent scoring and evicting, seconds.
    """

    def __init__(
        self,
        config: CakeConfig,
        num_layers: int,
        prompt_len: int,
        on_layer=None,
        collect_stats: bool = True,
        windows=None,
    ):
        self.config = config
        self.num_layers = num_layers
        self.windows = list(windows) if windows is not None else [None] * num_layers
        self.global_layers = [i for i, w in enumerate(self.windows) if w is None]
        self.prompt_len = prompt_len
        self.on_layer = on_layer
        self.stats: list[LayerStats | None] = [None] * num_layers
        self.stages: list[list[int]] = []
        self.indicators: list[torch.Tensor | None] = [None] * num_layers
        self.evicting = prompt_len > config.budget
        self.seconds = 0.0
        if config.allocation not in allocation.ALLOCATIONS:  # global ranks reconstruction scores (engine.reconstruct)
            raise ValueError(f"allocation {config.allocation} needs --scoring reconstruct; the cascade cannot run it")
        self.collect_stats = collect_stats or allocation.ALLOCATIONS[config.allocation].uses_stats
        rank = config.rank_layer
        if rank is not None and (rank >= num_layers or self.windows[rank] is not None):
            raise ValueError(
                f"rank_layer {rank} is not a global (full-attention) layer of this {num_layers}-layer model"
            )

    @property
    def cap(self) -> int:
        """n - w: evictable tokens per layer."""
        return max(self.prompt_len - self.config.window, 0)

    @property
    def final_budgets(self) -> list[int | None] | None:
        """[L] B_l after the last stage (evictable tokens per layer; None for a local layer), or None
        if nothing was evicted."""
        if not (self.evicting and self.global_layers and len(self.stages) == len(self.global_layers)):
            return None
        budgets = dict(zip(self.global_layers, self.stages[-1]))
        return [budgets.get(i) for i in range(self.num_layers)]

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
        """Score layer `layer_idx` from its window attention and cascade-evict the global layers
        0..layer_idx (a local layer is left as it is).

        Args:
            cache: the CakeCache being filled.
            query: [1, H, n, d] rotated prompt queries of this layer.
            key: [1, H_kv, n, d] rotated prompt keys of this layer.
            scaling: softmax scale.
            probs: [H, w, n] float32 attention of the last w queries when the attention function computed
                it (`attention.split_attention`, asked for by `window_rows`), else None: computed here.
            softcap: the layer's attention logit soft-capping, or None.
        """
        start = time.perf_counter()
        w = self.config.window
        if self.prompt_len > w and self.windows[layer_idx] is None:
            if probs is None:
                probs = window_attention(query[0, :, -w:, :], key[0], scaling, softcap)  # [H, w, n]
            self.observe(cache, layer_idx, probs, key.shape[1])
        self.seconds += time.perf_counter() - start
        if self.on_layer is not None:
            self.on_layer(layer_idx, self.num_layers)

    def observe(self, cache, layer_idx: int, a: torch.Tensor | None, num_kv: int) -> None:
        """Statistics (Eqs. 3-7), indicator (Eq. 11 or a baseline's) and cascade step for one layer.

        The statistics and the indicator read the last `config.scoring_rows` rows of `a` (all w unless
        `CakeConfig.score_rows` is set); the live prefill and `replay.replay` both come through here.

        Args:
            cache: the CakeCache being filled (layers 0..layer_idx hold their tokens).
            a: [H, w, n] float32 window attention of this layer, or None when n <= w.
            num_kv: H_kv.

        Raises:
            ValueError: an accumulating indicator (H2O) on a layer that holds no accumulated scores.
        """
        if a is None or self.windows[layer_idx] is not None:
            return
        cfg = self.config
        a_ev = a[:, -cfg.scoring_rows :, : self.cap]  # [H, r, n - w], r = w unless score_rows; not renormalised
        var = None
        if self.collect_stats:
            var = variance_rows(a_ev)  # [H, n - w], shared by V_l (Eqs. 5-6) and the indicator (Eq. 11)
            h, v = dispersion(a_ev), shift(var)
            self.stats[layer_idx] = LayerStats(h, v, log_preference(h, v, cfg.tau1, cfg.tau2))
        if self.evicting:
            positions = torch.arange(self.cap, device=a.device).expand(num_kv, self.cap)  # [H_kv, n - w]
            accumulated = None
            if accumulates(cfg.indicator):
                held = cache.layers[layer_idx].scores  # [H_kv, n]: every prompt query, in position order
                if held is None:
                    raise ValueError(f"layer {layer_idx} holds no accumulated attention for {cfg.indicator}")
                accumulated = held[:, : self.cap]  # [H_kv, n - w]
            self.indicators[layer_idx] = token_scores(
                cfg.indicator,
                a_ev,
                positions,
                num_kv,
                gamma=cfg.gamma,
                pool=(cfg.pool_kind, cfg.pool_kernel),
                column_var=var,
                accumulated=accumulated,
                chunk=cfg.chunk,
            )  # [H_kv, n - w]
            self._cascade(cache, layer_idx)

    def _cascade(self, cache, m: int) -> None:
        """Stage m: allocate over the global layers 0..m (Eq. 9) and evict each to its budget (Eq. 10).

        With `config.rank_layer` R, stages below R allocate but evict nothing, and stage R gives every layer
        below R the ranking of R's indicator (`indicators.shared_ranking`) before evicting layers 0..R."""
        seen = [i for i in self.global_layers if i <= m]
        rank = self.config.rank_layer
        logs = [self.stats[i].log_preference for i in seen] if self.collect_stats else None
        total = self.config.evictable_total(len(self.global_layers))
        budgets = allocation.stage_budgets(
            self.config.allocation,
            logs,
            len(seen),
            len(self.global_layers),
            total,
            self.cap,
            self.stages[-1] if self.stages else None,
            window=self.config.window,
        )
        self.stages.append(budgets)
        if rank is not None and m < rank:
            return  # the layers below R wait for R's ranking
        if rank is not None and m == rank:
            shared = shared_ranking(self.indicators[rank])
            for layer_idx in seen[:-1]:
                self.indicators[layer_idx] = shared
        for layer_idx, budget in zip(seen, budgets):
            self.evict_layer(cache, layer_idx, budget)
        cache.track_peak()

    def evict_layer(self, cache, layer_idx: int, budget: int) -> None:
        """Keep the top-`budget` evictable tokens of a layer by its stored indicator, plus the window."""
        indicator = self.indicators[layer_idx]  # [H_kv, held evictable]
        held = indicator.shape[-1]
        if budget >= held:
            return
        w = self.config.window
        chosen = top_k_sorted(indicator, budget)  # [H_kv, budget]
        window = torch.arange(held, held + w, device=chosen.device).expand(chosen.shape[0], w)
        cache.layers[layer_idx].keep(torch.cat([chosen, window], dim=-1))
        self.indicators[layer_idx] = indicator.gather(1, chosen)
