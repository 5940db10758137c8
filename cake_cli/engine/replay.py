"""Record one prefill, then replay the eviction of any method and budget on it (benchmarks).

The prefill forward is the same for every method: each layer attends over the whole prompt, and
eviction only changes what earlier layers keep afterwards. So a benchmark grid can run the
model once per prompt, record every layer's full K/V and window attention (and, for H2O, the
accumulated attention of every prompt query per global layer), and replay the cascade
(`CascadePrefill.observe`, the same code the live prefill runs, layer by layer) for each
(method, budget). The replayed cache equals the live one; `tests/engine/test_replay.py` checks it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from cake_cli.engine.cache import CakeCache
from cake_cli.engine.cascade import CascadePrefill
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.continuation import clone_cache, rewound
from cake_cli.engine.families import attention_layout
from cake_cli.engine.generate import Prefilled, forward_step, prefill, sync_device
from cake_cli.engine.indicators import accumulates
from cake_cli.engine.window import window_attention


class Recorder:
    """Prefill policy that keeps every layer's window attention and evicts nothing."""

    def __init__(self, window: int):
        self.window = window
        self.attention: dict[int, torch.Tensor] = {}

    def after_attention(
        self, cache, layer_idx, query, key, scaling, probs=None, softcap=None
    ) -> None:  # EvictionPolicy
        # a prompt longer than w is scored (the forward runs at least its last w queries); local layers are not
        if key.shape[2] > self.window and query.shape[2] >= self.window and cache.layers[layer_idx].window is None:
            self.attention[layer_idx] = window_attention(query[0, :, -self.window :, :], key[0], scaling, softcap)


@dataclass
class Recording:
    """A full-cache prefill of one prompt with every layer's window attention [H, w, n]; with
    `accumulate`, the cache's global layers also hold H2O's accumulated attention (`scores`, [H_kv, n])."""

    cache: CakeCache
    attention: list[torch.Tensor | None]
    logits: torch.Tensor  # [1, V]
    window: int
    seconds: float


@torch.inference_mode()
def prefix_cache(model, prefix_ids: torch.Tensor) -> CakeCache:
    """A full cache of a prompt prefix that several recordings share (`record(prefix=...)`): the
    document block of questions asked about one document.

    Args:
        prefix_ids: [1, n] the shared first tokens of the prompts.
    """
    return prefill(model, prefix_ids, None).cache  # the full-cache baseline: nothing evicted


@torch.inference_mode()
def record(
    model, input_ids: torch.Tensor, window: int, *, accumulate: bool = True, prefix: CakeCache | None = None
) -> Recording:
    """Run the prompt once with a full cache, keeping each layer's window attention (float32).

    Args:
        accumulate: also accumulate every prompt query's attention per global layer (what H2O
            replays from; one more block-wise attention pass per layer, `window.accumulated_attention`).
        prefix: a full cache of the prompt's first n tokens (`prefix_cache`; left unchanged): only
            the rest is run, from the observation window's first position when the rest is shorter
            than w (`continuation.rewound`: the prefix's last tokens run again), so that the
            window's queries are those of the whole prompt. The prefix's keys and values do not
            depend on what follows them, so the recording equals one of the whole prompt
            (`tests/engine/test_replay.py` checks it); `seconds` then counts only this forward.

    Memory: the full KV cache plus L · H · w · n float32 values, plus L · H_kv · n with `accumulate`.

    Raises:
        ValueError: a prefix with `accumulate` (H2O scores every prompt query, the prefix's too), a
            prefix not shorter than the prompt, or a model with local (sliding-window) layers.
    """
    num_layers = model.config.num_hidden_layers
    recorder = Recorder(window)
    windows = attention_layout(model.config).windows
    start = 0
    if prefix is None:
        cache = CakeCache(num_layers, policy=recorder, windows=windows, accumulate=accumulate)
    else:
        n = prefix.layers[0].seen
        if accumulate or n >= input_ids.shape[1] or any(w is not None for w in windows):
            raise ValueError(
                "a shared prefix needs accumulate=False, a prompt longer than the prefix and no local "
                "(sliding-window) layers, whose cache no longer holds the keys the re-run window attends to"
            )
        cache, start = rewound(prefix, input_ids.shape[1], window)
        cache.policy = recorder
    sync_device(input_ids.device)
    began = time.perf_counter()
    logits = forward_step(model, cache, input_ids[:, start:], start, None)
    sync_device(input_ids.device)
    cache.policy = None
    return Recording(
        cache, [recorder.attention.get(i) for i in range(num_layers)], logits, window, time.perf_counter() - began
    )


def replay(rec: Recording, config: CakeConfig | None) -> Prefilled:
    """The state a live `prefill` with `config` would leave, from a recording (cache copied).

    Raises:
        ValueError: `config.window` differs from the recording's window, or an accumulating indicator
            (H2O) on a recording made without `accumulate`.
    """
    num_layers = len(rec.cache.layers)
    cache = clone_cache(rec.cache)
    if config is None or not accumulates(config.indicator):
        cache.accumulate(False)  # the accumulated attention goes with H2O only
    elif not cache.accumulating():
        raise ValueError(f"the {config.indicator} indicator replays a recording made with accumulate=True")
    cascade = None
    start = time.perf_counter()
    if config is not None:
        if config.window != rec.window:
            raise ValueError(f"recorded with window {rec.window}, replayed with {config.window}")
        n = rec.cache.layers[0].seen
        cascade = CascadePrefill(config, num_layers, n, windows=rec.cache.windows)
        for layer_idx, a in enumerate(rec.attention):
            cascade.observe(cache, layer_idx, a, cache.layers[layer_idx].keys.shape[1])
    cache.track_peak()
    seconds = rec.seconds + time.perf_counter() - start
    return Prefilled(cache, cascade, rec.logits.clone(), seconds, cache.lengths(), cache.kv_bytes(), cache.peak_bytes)
