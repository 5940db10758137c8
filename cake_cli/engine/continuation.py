"""A prompt prefix compressed once, continued many times: the task's tokens after a CAKE-evicted cache.

A long document is prefilled and evicted once (`generate.prefill`, the cascade of Sec. 4.2). Each
task then runs only its own tokens (instruction, question, the chat template's end) as one forward
at the true positions seen..seen+q-1 over a *copy* of the compressed cache, and decodes from there
(`generate.decode`). Kept tokens keep their RoPE positions and new ones are rotated at theirs
(docs/method.md §Positions); the attention functions build each layer's own mask, every cached token visible and the
q new ones causal among themselves (docs/method.md §Transformers integration), so the forward is exact for what the
cache holds.

Continuation tokens are held, not evicted: nothing is scored while they run (their queries only add
to H2O's accumulated attention, `cache.CakeLayer.scores`), and the `fixed` decode policy then keeps
every layer at its size after the continuation (`continuation_capacity`), so the question is never
cut by the document's budget; generated tokens are governed by the decode policy as after any
prefill (docs/method.md §Decoding).

Also: dropping the scoring probe after compression (`drop_from`). The cache as flat tensors for a
file: `engine.cachefile`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from cake_cli.engine.cache import CakeCache
from cake_cli.engine.cascade import CascadePrefill, LayerStats
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.families import attention_layout
from cake_cli.engine.generate import GenerationResult, Prefilled, decode, forward_step, prefill, sync_device
from cake_cli.engine.indicators import accumulates
from cake_cli.engine.kvmemory import QuantLayer


class DeferredCascade(CascadePrefill):
    """The cascade's statistics and stage budgets (Eqs. 7-10, Prop. 1 rounding) layer by layer, but
    each layer is evicted once, with its final budget, after the last layer has been scored. For a
    prefix already whole in memory the cascade's peak-memory saving is moot, and Thm. 1 says one
    eviction with the final budgets keeps the same tokens as evicting at every stage; it saves
    re-gathering every layer at every stage (L²/2 gathers down to L)."""

    def window_rows(self, layer_idx: int, key_len: int) -> int:
        """The window's w rows, when this forward scores the layer to evict it (`CakeCache.window_rows`): a
        question runs few rows over a long prefix, the window is a large share of them, and its
        probabilities, computed once, give both its output and its score (`attention.split_attention`).
        0 when nothing will be evicted: the backend then runs every row, so a prefix kept whole and
        continued answers as a prefill of the whole prompt does, token for token."""
        if not self.evicting or key_len != self.prompt_len:
            return 0
        return self.config.window

    def evict_layer(self, cache, layer_idx: int, budget: int) -> None:
        """Evict only at the last stage (`CascadePrefill.evict_layer`); earlier stages record budgets."""
        if len(self.stages) == len(self.global_layers):  # local layers keep their window and get no stage
            super().evict_layer(cache, layer_idx, budget)


@dataclass(frozen=True)
class SavedCascade:
    """What a finished cascade leaves for reports and decoding, rebuilt from a saved cache: the
    per-layer statistics (Eqs. 3-7) and final budgets B_l (Eq. 7); nothing is scored any more."""

    stats: list[LayerStats | None]
    final_budgets: list[int] | None  # None when nothing was evicted
    evicting: bool
    seconds: float = 0.0  # scoring + eviction done now: none


def clone_cache(cache: CakeCache) -> CakeCache:
    """A copy of `cache` (keys, values, positions, accumulated scores, next position, full-cache bytes), no policy.

    Raises:
        ValueError: a layer has a released slot (copy caches right after prefill or loading).
    """
    out = CakeCache(len(cache.layers), windows=cache.windows)  # local layers stay sliding
    for i, (src, dst) in enumerate(zip(cache.layers, out.layers)):
        if src.free is not None:
            raise ValueError("cannot copy a cache with a released slot; copy it before decoding")
        if isinstance(src, QuantLayer):  # held quantized in memory (`engine.kvmemory`)
            out.layers[i] = src.copy()
            continue
        dst.lazy_initialization(src.keys, src.values)
        dst.keys, dst.values = src.keys.clone(), src.values.clone()  # [1, H_kv, len, d]
        dst.positions, dst.seen = src.positions.clone(), src.seen  # [H_kv, len]
        dst.accumulates, dst.scores = src.accumulates, None if src.scores is None else src.scores.clone()
        dst.start = None if src.start is None else src.start.clone()  # a ragged layer's padding (headlengths)
    out.full_bytes = cache.full_bytes
    return out


def _layer_token_bytes(layer) -> int:
    """KV bytes one token costs in a layer: 2 · H_kv · d · bytes per element (docs/method.md §Memory accounting)."""
    return 2 * layer.keys.shape[1] * layer.keys.shape[-1] * layer.keys.element_size()


def full_cache_bytes(cache: CakeCache, n: int) -> int:
    """KV bytes the full cache of an n-token prompt holds (docs/method.md §Memory accounting): n tokens per global
    layer, at most
    its native window - 1 per local layer (what `engine.cache.SlidingLayer` stores)."""
    return sum(
        _layer_token_bytes(layer) * (n if window is None else min(n, window - 1))
        for layer, window in zip(cache.layers, cache.windows)
    )


def drop_from(cache: CakeCache, position: int) -> None:
    """Remove every entry at true position >= `position` (a scoring probe appended after the
    document) from every layer; the next token goes to `position` again. Nothing at or past
    `position` (every layer has seen at most `position` tokens): the cache is left as it is.

    Raises:
        ValueError: some KV head of a layer holds a different number of those entries (the probe
            must lie inside the observation window, which no head evicts).
    """
    if cache.layers[0].seen <= position:
        return
    for layer in cache.layers:
        if layer.start is not None:
            raise ValueError("cannot drop entries from a layer whose KV heads hold different numbers of tokens")
        before = layer.positions < position  # [H_kv, len]
        counts = before.sum(dim=-1)
        if not bool((counts == counts[0]).all()):
            raise ValueError("the entries to drop are not the same count in every KV head (probe longer than w?)")
        order = torch.argsort(layer.positions, dim=-1)  # [H_kv, len]: slots in position order
        layer.keep(order[:, : int(counts[0])])  # [1, H_kv, kept, d]
        layer.seen = position
    cache.full_bytes = full_cache_bytes(cache, position)


def window_start(prefix: int, total: int, window: int) -> int:
    """The first position a forward after a `prefix`-token cache must run for the prompt's last `window`
    positions (the observation window) to have queries: the prefix's end when the `total - prefix` new
    tokens hold the window, else the window's first position (the prefix's last tokens run again)."""
    return min(prefix, max(total - window, 0))


def rewound(prefix: CakeCache, total: int, window: int) -> tuple[CakeCache, int]:
    """A copy of `prefix` (left unchanged) ready for the rest of a `total`-token prompt: the entries from
    `window_start` on dropped, so a forward from that position has the prompt's last `window` queries.

    Returns:
        (cache, start): the copy and the first position the forward runs.
    """
    start = window_start(prefix.layers[0].seen, total, window)
    cache = clone_cache(prefix)
    drop_from(cache, start)
    return cache, start


def continuation_capacity(config: CakeConfig, evicting: bool, lengths: list[int]) -> list[int]:
    """[L] tokens per layer the `fixed` decode policy keeps after a continuation: what each layer
    holds then (B_l + w + q, the q task tokens held on top of the document's budget), and at least
    B when the prefix was not evicted (as `generate.decode_capacity` allows after a short prompt)."""
    return list(lengths) if evicting else [max(config.budget, held) for held in lengths]


@torch.inference_mode()
def extend(model, state: Prefilled, ids: torch.Tensor, *, step_logits: list | None = None) -> Prefilled:
    """Run continuation tokens after a prefilled (compressed) prompt, on a copy of its cache.

    Args:
        model: the model that filled `state`, switched to a CAKE attention function.
        state: the prefix after prefill (or `cache_from_tensors`); left unchanged.
        ids: [1, q] continuation token ids, placed at true positions seen..seen+q-1.
        step_logits: if a list, receives the [1, V] float32 next-token logits.

    Returns:
        Prefilled with the copy holding every layer's tokens plus the q new ones (nothing evicted),
        the next-token logits, the forward's seconds, and KV bytes measured from the tensors;
        `kv_bytes_full` counts the whole prompt (prefix + continuation) in a full cache.

    Raises:
        ValueError: ids not of shape [1, q > 0], or past the model's position range.
    """
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise ValueError(f"expected continuation ids of shape [1, q>0], got {tuple(ids.shape)}")
    cache = clone_cache(state.cache)
    start = cache.layers[0].seen
    layout = attention_layout(model.config)
    if layout.limit is not None and start + ids.shape[1] > layout.limit:
        raise ValueError(f"the prompt has {start + ids.shape[1]} tokens, past {layout.limit_text()}")
    sync_device(ids.device)
    began = time.perf_counter()
    logits = forward_step(model, cache, ids, start, step_logits)
    sync_device(ids.device)
    seconds = time.perf_counter() - began
    cache.full_bytes = full_cache_bytes(cache, cache.layers[0].seen)
    kept = cache.kv_bytes()
    return Prefilled(cache, state.cascade, logits, seconds, cache.lengths(), kept, max(kept, state.peak_bytes))


@torch.inference_mode()
def compress(model, prefix_ids: torch.Tensor, config: CakeConfig | None, *, probe_ids=None, on_layer=None) -> Prefilled:
    """Prefill and evict a prompt prefix for later continuations (the cascade of Sec. 4.2), with no
    question known: the observation window holds the prefix's last w tokens, or a probe.

    Args:
        prefix_ids: [1, n] the prefix.
        config: CAKE settings (None: full cache, nothing evicted).
        probe_ids: [1, g] tokens (g <= w) appended for scoring only: they fill the observation window
            while the cascade scores, then they are dropped (`drop_from`); the budget is raised by g
            meanwhile, so the prefix keeps B·L tokens in all, as without a probe.
        on_layer: progress callback (layer_idx, L).

    Returns:
        Prefilled of the n prefix tokens (the next token goes to position n).

    Raises:
        ValueError: a probe longer than the window, and those of `prefill`.
    """
    g = 0 if probe_ids is None or config is None else probe_ids.shape[1]
    ids = torch.cat([prefix_ids, probe_ids], dim=1) if g else prefix_ids  # [1, n + g]
    state = prefill(model, ids, probe_config(config, g), on_layer=on_layer)
    return without_probe(state, prefix_ids.shape[1])


def probe_config(config: CakeConfig | None, probe_len: int) -> CakeConfig | None:
    """The settings to score a prefix + a `probe_len`-token probe with: the budget raised by the probe.

    Raises:
        ValueError: a probe longer than the observation window.
    """
    if config is None or probe_len == 0:
        return config
    if probe_len > config.window:
        raise ValueError(f"a scoring probe of {probe_len} tokens does not fit the {config.window}-token window")
    return replace(config, budget=config.budget + probe_len)


def without_probe(state: Prefilled, prefix_len: int) -> Prefilled:
    """The state after prefill of a prefix + probe, with the probe dropped (`drop_from`); unchanged without one."""
    drop_from(state.cache, prefix_len)
    return replace(state, lengths=state.cache.lengths(), kv_bytes=state.cache.kv_bytes())


def continue_prefix(
    model, state: Prefilled, input_ids: torch.Tensor, config: CakeConfig | None, *, evict=False
) -> tuple[Prefilled, list[int] | None]:
    """Continue a compressed prefix with the rest of `input_ids` (on a copy), ready to decode.

    Args:
        state: the prefix (n tokens; its cascade says whether it was evicted).
        input_ids: [1, n + q] the whole prompt: the prefix's ids, then the q continuation tokens.
        config: the settings the decode policy uses (None: full cache).
        evict: the prefix was kept whole: evict it now, with this prompt's own observation window
            (`extend_and_evict`, question-aware); else `extend` holds the continuation on top.

    Returns:
        (the continued state, whose seconds are the continuation's forward; the per-layer
        decode capacity in tokens, or None for the decode policy's own, as after a prefill).
    """
    if evict and config is not None:
        return extend_and_evict(model, state, input_ids, config), None
    n = state.cache.layers[0].seen
    cont = extend(model, state, input_ids[:, n:])
    evicting = state.cascade is not None and state.cascade.evicting
    return cont, continuation_capacity(config, evicting, cont.lengths) if config is not None else None


def continue_and_decode(
    model, state: Prefilled, input_ids: torch.Tensor, config: CakeConfig | None, *, evict=False, **decode_options
) -> GenerationResult:
    """`continue_prefix`, then `generate.decode` with its keywords (max_new_tokens, sampling, ...)."""
    cont, capacity = continue_prefix(model, state, input_ids, config, evict=evict)
    return decode(model, input_ids, cont, config, capacity=capacity, **decode_options)


@torch.inference_mode()
def extend_and_evict(model, state: Prefilled, input_ids: torch.Tensor, config: CakeConfig, *, on_layer=None):
    """Question-aware CAKE on a prefix kept whole: the continuation runs with the cascade (Sec. 4.2).

    The observation window is the prompt's last w tokens, whose queries this forward must compute
    (a prefix's queries are not saved): a continuation of q >= w tokens holds the whole window, and a
    shorter one runs the prefix's last w - q tokens again with it (H2O, which scores every prompt
    query, runs the whole prompt again). Every layer is scored from that window during this one
    forward and evicted once at its end (`DeferredCascade`).
    The prefix's keys and values do not depend on what follows them, so the cache equals the one a
    prefill of the whole prompt leaves (Thm. 1 covers the order of the evictions).

    Args:
        state: a prefix of n tokens that was never evicted (a copy is used).
        input_ids: [1, n + q] the whole prompt.
        config: CAKE settings of this task (budget, window, taus).

    Returns:
        Prefilled of the whole prompt: the evicted cache, the cascade, the next-token logits, the
        forward's seconds and the peak KV bytes held meanwhile.

    Raises:
        ValueError: the prefix was evicted, or the prompt does not extend it.
    """
    n, total = state.cache.layers[0].seen, input_ids.shape[1]
    if any(layer.live() != n for layer in state.cache.layers) or total <= n:
        raise ValueError("question-aware eviction needs a prefix kept whole and a prompt longer than it")
    whole = accumulates(config.indicator)
    start = 0 if whole else window_start(n, total, config.window)
    cache = clone_cache(state.cache)
    drop_from(cache, start)
    cache.accumulate(whole)
    cascade = DeferredCascade(config, len(cache.layers), total, on_layer, windows=cache.windows)
    cache.policy = cascade
    sync_device(input_ids.device)
    began = time.perf_counter()
    logits = forward_step(model, cache, input_ids[:, start:], start, None)
    sync_device(input_ids.device)
    seconds = time.perf_counter() - began
    cache.full_bytes = full_cache_bytes(cache, total)
    return Prefilled(cache, cascade, logits, seconds, cache.lengths(), cache.kv_bytes(), cache.peak_bytes)
