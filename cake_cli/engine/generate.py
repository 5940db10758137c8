"""Prefill with the CAKE cascade, then decode token by token at true positions (docs/method.md §Cascade, §Positions,
§Decoding)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from cake_cli.engine.cache import CakeCache
from cake_cli.engine.cascade import CascadePrefill, LayerStats
from cake_cli.engine.config import CakeConfig, SamplingConfig
from cake_cli.engine.decode import FixedDecode, GrowDecode, prepare_cache
from cake_cli.engine.families import attention_layout
from cake_cli.engine.indicators import accumulates
from cake_cli.engine.lean_step import lean_decoder
from cake_cli.engine.measures import saved_fraction, tokens_per_second
from cake_cli.engine.policy import CascadeView
from cake_cli.engine.sampling import Sampler, repeated_tail


@dataclass(frozen=True)
class LayerRow:
    """One layer after prefill: statistics (None when n <= w), budget and tokens kept."""

    layer: int
    stats: LayerStats | None
    budget: int | None  # B_l evictable tokens (Eq. 7, integer), None when nothing was evicted or local
    kept: int  # tokens the layer holds after prefill (B_l + w, or n; a local layer: at most window - 1)
    window: int | None = None  # a local layer's native sliding window (tokens; no budget), None: global
    heads: tuple[int, ...] | None = None  # tokens kept per KV head when they differ (`--allocation global`), else None


@dataclass(frozen=True)
class GenerationResult:
    """Everything one run measured. Bytes are measured from the cache tensors; times in seconds."""

    token_ids: tuple[int, ...]
    prompt_tokens: int
    evicted: bool
    layers: tuple[LayerRow, ...]
    kv_bytes_full: int  # the full prompt cache, summed as each layer received it
    kv_bytes_kept: int  # after prefill
    kv_bytes_final: int  # after the last decode step
    kv_peak_prefill: int  # largest total held at any moment of prefill
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int
    eviction_seconds: float  # scoring (H2O's accumulated attention included) + eviction, prefill and decode
    stop_reason: str  # "eos" | "max_new_tokens" | "max_positions" | "repetition" | "complete"
    sampling_seconds: float = 0.0  # choosing tokens from the logits, n-gram blocking included
    first_logits: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @property
    def decode_tokens_per_second(self) -> float:
        """Decode forward passes per second (0 when there were none)."""
        return tokens_per_second(self.decode_steps, self.decode_seconds)

    @property
    def saved_fraction(self) -> float:
        """1 - kept / full KV bytes after prefill."""
        return saved_fraction(self.kv_bytes_kept, self.kv_bytes_full)


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so wall-clock timings measure it; no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_step(model, cache: CakeCache, ids: torch.Tensor, start: int, step_logits: list | None) -> torch.Tensor:
    """One forward of ids [1, q] at true positions start..start+q-1 -> next-token logits [1, V]; one
    token goes through `lean_step.LeanDecoder` where it applies (the same logits, less overhead)."""
    lean = lean_decoder(model) if ids.shape[1] == 1 else None
    if lean is not None:
        logits = lean(cache, ids, start)
    else:
        positions = torch.arange(start, start + ids.shape[1], device=ids.device).unsqueeze(0)  # [1, q]
        out = model(input_ids=ids, position_ids=positions, cache=cache, cake=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1, :]  # [1, V]
    if step_logits is not None:
        step_logits.append(logits.detach().float().cpu())
    return logits


def decode_capacity(config: CakeConfig, cascade: CascadePrefill, lengths: list[int]) -> list[int]:
    """Per-layer size the `fixed` policy keeps: B_l + w after an evicting prefill, else B."""
    return lengths if cascade.evicting else [config.budget] * len(lengths)


@dataclass
class Prefilled:
    """The state right after prefill: the cache (already evicted), the cascade and timings."""

    cache: CakeCache
    cascade: CascadeView | None  # the live CascadePrefill, or a SavedCascade
    logits: torch.Tensor  # [1, V] next-token logits
    seconds: float
    lengths: list[int]  # tokens per layer after prefill
    kv_bytes: int  # after prefill, measured
    peak_bytes: int  # largest total during prefill, measured

    def rows(self) -> tuple[LayerRow, ...]:
        """Per-layer statistics, budgets and tokens kept."""
        budgets = self.cascade.final_budgets if self.cascade is not None else None
        heads = self.cache.head_lengths()
        return tuple(
            LayerRow(
                i, self.cascade.stats[i] if self.cascade else None, budgets[i] if budgets else None, kept, window,
                None if heads[i] is None else tuple(heads[i]),
            )
            for i, (kept, window) in enumerate(zip(self.lengths, self.cache.windows))
        )  # fmt: skip


class LayerProgress:
    """The eviction hook of a full-cache prefill (no config: nothing is scored or evicted) that only
    reports progress: `on_layer(layer_idx, L)` as each layer finishes, as the cascade does."""

    def __init__(self, on_layer: Callable[[int, int], None], num_layers: int):
        self.on_layer, self.num_layers = on_layer, num_layers

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
        """Report layer `layer_idx` done (`policy.EvictionPolicy`); the cache is left as it is."""
        self.on_layer(layer_idx, self.num_layers)


@torch.inference_mode()
def prefill(
    model,
    input_ids: torch.Tensor,
    config: CakeConfig | None,
    *,
    on_layer: Callable[[int, int], None] | None = None,
    step_logits: list | None = None,
    collect_stats: bool = True,
) -> Prefilled:
    """Run the prompt through the model once, cascading CAKE eviction layer by layer (Sec. 4.2).

    Args:
        model: a causal LM switched to a CAKE attention function (`attention.use_cake_attention`).
        input_ids: [1, n] prompt token ids on the model's input device.
        config: CAKE settings, or None for the full-cache baseline (nothing evicted).
        on_layer: progress callback (layer_idx, L), called as each layer finishes (with or
            without `config`).
        step_logits: if a list, receives the [1, V] float32 next-token logits.
        collect_stats: compute H, V, P for every layer even when the allocation does not need
            them (reports); False keeps baselines lean (speed benchmark).

    Returns:
        Prefilled state; the cache holds B_l + w tokens per layer when n > B, else all n.

    Raises:
        ValueError: batch size other than 1, an empty prompt, or a prompt past the model's
            positions or the sliding window every layer uses (`families.attention_layout`).
    """
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"expected input_ids of shape [1, n>0], got {tuple(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"batch size {input_ids.shape[0]} is not supported: the engine runs one sequence at a "
            "time (layers keep different tokens per sequence)"
        )
    layout = attention_layout(model.config)
    if layout.limit is not None and input_ids.shape[1] > layout.limit:
        raise ValueError(f"the prompt has {input_ids.shape[1]} tokens, past {layout.limit_text()}")
    num_layers = model.config.num_hidden_layers
    cascade = (
        CascadePrefill(config, num_layers, input_ids.shape[1], on_layer, collect_stats, layout.windows)
        if config is not None
        else None
    )
    accumulate = config is not None and accumulates(config.indicator)  # H2O: every query's attention
    progress = LayerProgress(on_layer, num_layers) if cascade is None and on_layer is not None else None
    cache = CakeCache(num_layers, policy=cascade or progress, windows=layout.windows, accumulate=accumulate)
    sync_device(input_ids.device)
    start = time.perf_counter()
    logits = forward_step(model, cache, input_ids, 0, step_logits)
    sync_device(input_ids.device)
    seconds = time.perf_counter() - start
    if progress is not None:
        cache.policy = None  # a plain full cache again
    return Prefilled(cache, cascade, logits, seconds, cache.lengths(), cache.kv_bytes(), cache.peak_bytes)


@torch.inference_mode()
def generate(
    model,
    input_ids: torch.Tensor,
    config: CakeConfig | None,
    *,
    on_layer: Callable[[int, int], None] | None = None,
    step_logits: list | None = None,
    collect_stats: bool = True,
    **decode_options,
) -> GenerationResult:
    """Prefill with the CAKE cascade (unless `config` is None), then decode (see `decode`).

    Args:
        model, input_ids, config, on_layer, collect_stats: as for `prefill`.
        step_logits: as for `prefill` and `decode` (the prefill's logits, then every step's).
        decode_options: `decode`'s keywords (max_new_tokens, sampling, stop_ids, on_token,
            forced_tokens, stop_on_repetition).

    Returns:
        GenerationResult with token ids, per-layer budgets and measured memory and times.

    Raises:
        ValueError: batch size other than 1 or an empty prompt.
    """
    state = prefill(model, input_ids, config, on_layer=on_layer, step_logits=step_logits, collect_stats=collect_stats)
    return decode(model, input_ids, state, config, step_logits=step_logits, **decode_options)


@torch.inference_mode()
def decode(
    model,
    input_ids: torch.Tensor,
    state: Prefilled,
    config: CakeConfig | None,
    *,
    max_new_tokens: int = 256,
    sampling: SamplingConfig = SamplingConfig(),
    stop_ids: frozenset[int] = frozenset(),
    on_token: Callable[[int], None] | None = None,
    step_logits: list | None = None,
    forced_tokens: list[int] | None = None,
    stop_on_repetition: bool = False,
    stop_when: Callable[[list[int]], bool] | None = None,
    capacity: list[int] | None = None,
) -> GenerationResult:
    """Decode token by token at true positions n, n+1, ... after `prefill` (or `replay.replay`),
    with the configured decode policy (docs/method.md §Decoding).

    Args:
        model: the model that filled `state`.
        input_ids: [1, n] the prompt (its length n sets the first new position).
        state: the prefilled cache and next-token logits.
        config: the CAKE settings used for `state` (None: full cache).
        max_new_tokens: most tokens to generate (>= 0).
        sampling: greedy by default.
        stop_ids: token ids that end generation (EOS); the stop token is not returned.
        on_token: called with each generated token id as soon as it is chosen (streaming).
        step_logits: if a list, receives the [1, V] float32 logits of every decode step.
        forced_tokens: feed these tokens instead of sampling (teacher forcing, for oracles).
        stop_on_repetition: stop once the answer ends in a degenerate loop (`sampling.repeated_tail`),
            stop reason "repetition".
        stop_when: called with the tokens so far after each one; True ends decoding (stop reason
            "complete": the caller has what it needs, e.g. enough lines of code).
        capacity: [L] tokens per layer the `fixed` policy keeps; default `decode_capacity` (a
            continuation after a compressed prefix passes its own, `continuation.continuation_capacity`).

    Returns:
        GenerationResult.

    Raises:
        ValueError: H2O's `fixed` policy on a cache without accumulated attention (`decode.prepare_cache`).
    """
    decoding = Decoding(
        model, input_ids, state, config, max_new_tokens=max_new_tokens, sampling=sampling, stop_ids=stop_ids,
        on_token=on_token, step_logits=step_logits, forced_tokens=forced_tokens,
        stop_on_repetition=stop_on_repetition, stop_when=stop_when, capacity=capacity,
    )  # fmt: skip
    while decoding.step():
        pass
    return decoding.result()


class Decoding:
    """`decode` one token at a time: `step()` chooses the next token and, unless decoding ends
    there, runs its forward pass; `result()` once `step()` returned False. Several decodings of one
    model can be stepped in turn (the speed benchmark interleaves its cases token by token, so a slow
    spell of a shared machine slows them alike). Arguments and errors as for `decode`."""

    def __init__(
        self,
        model,
        input_ids: torch.Tensor,
        state: Prefilled,
        config: CakeConfig | None,
        *,
        max_new_tokens: int = 256,
        sampling: SamplingConfig = SamplingConfig(),
        stop_ids: frozenset[int] = frozenset(),
        on_token: Callable[[int], None] | None = None,
        step_logits: list | None = None,
        forced_tokens: list[int] | None = None,
        stop_on_repetition: bool = False,
        stop_when: Callable[[list[int]], bool] | None = None,
        capacity: list[int] | None = None,
    ):
        self._start(model, input_ids, state, config, capacity)
        self.max_new_tokens, self.stop_ids, self.on_token = max_new_tokens, stop_ids, on_token
        self.step_logits, self.forced_tokens = step_logits, forced_tokens
        self.stop_on_repetition, self.stop_when = stop_on_repetition, stop_when
        self.sampler = Sampler(sampling)
        self.tokens: list[int] = []
        self.stop_reason = "max_new_tokens"
        self.decode_seconds, self.sampling_seconds, self.steps = 0.0, 0.0, 0
        self.done = False

    @torch.inference_mode()
    def _start(self, model, input_ids: torch.Tensor, state: Prefilled, config: CakeConfig | None, capacity) -> None:
        """Switch the prefilled cache to the decode policy (inside inference mode, as every step runs)."""
        self.model, self.state, self.n, self.device = model, state, input_ids.shape[1], input_ids.device
        prepare_cache(state.cache, config)
        self.policy = _decode_policy(config, state, capacity)
        state.cache.policy = self.policy
        state.cache.tracking_peak = False
        self.logits = state.logits
        self.limit = attention_layout(model.config).limit or float("inf")

    @torch.inference_mode()
    def step(self) -> bool:
        """Choose one token and run its forward pass; False once decoding has ended (then nothing runs)."""
        if self.done:
            return False
        tokens = self.tokens
        if len(tokens) >= self.max_new_tokens:
            return self._end(None)
        if self.n + len(tokens) >= self.limit:  # the next token would sit past the model's position range
            return self._end("max_positions")
        t0 = time.perf_counter()
        if self.forced_tokens is not None:
            token = self.forced_tokens[len(tokens)]
            self.sampler.record(token)
        else:
            token = self.sampler(self.logits)
        self.sampling_seconds += time.perf_counter() - t0
        if token in self.stop_ids and self.forced_tokens is None:
            return self._end("eos")
        tokens.append(token)
        if self.on_token is not None:
            self.on_token(token)
        if self.stop_on_repetition and repeated_tail(tokens):
            return self._end("repetition")
        if self.stop_when is not None and self.stop_when(tokens):
            return self._end("complete")
        if len(tokens) == self.max_new_tokens:
            return self._end(None)
        ids = torch.tensor([[token]], device=self.device)
        t1 = time.perf_counter()
        self.logits = forward_step(self.model, self.state.cache, ids, self.n + len(tokens) - 1, self.step_logits)
        sync_device(self.device)
        self.decode_seconds += time.perf_counter() - t1
        self.steps += 1
        return True

    def _end(self, reason: str | None) -> bool:
        """Mark decoding ended (`reason` None keeps "max_new_tokens") and settle the cache."""
        if reason is not None:
            self.stop_reason = reason
        self.done = True
        self.state.cache.settle()
        return False

    def result(self) -> GenerationResult:
        """The GenerationResult of a finished decoding.

        Raises:
            RuntimeError: decoding has not ended yet (`step()` has not returned False).
        """
        if not self.done:
            raise RuntimeError("decoding has not ended: call step() until it returns False")
        times = (self.decode_seconds, self.sampling_seconds, self.steps)
        return _result(self.state, self.n, self.tokens, self.stop_reason, times, self.policy)


def _decode_policy(config: CakeConfig | None, state: Prefilled, capacity: list[int] | None = None):
    """The decode policy of `config` for a prefilled state (None: full cache, nothing evicted);
    `capacity` overrides the `fixed` policy's per-layer sizes (`decode_capacity`)."""
    if config is None:
        return None
    if config.decode_policy == "fixed":
        return FixedDecode(config, capacity or decode_capacity(config, state.cascade, state.lengths))
    return GrowDecode()


def _result(state: Prefilled, n: int, tokens: list[int], stop_reason: str, times: tuple, policy) -> GenerationResult:
    """GenerationResult of a finished decode; `times` = (decode seconds, sampling seconds, steps)."""
    decode_seconds, sampling_seconds, steps = times
    cache = state.cache
    rows = state.rows()
    prefill_evict = state.cascade.seconds if state.cascade else 0.0
    return GenerationResult(
        token_ids=tuple(tokens),
        prompt_tokens=n,
        evicted=any(r.budget is not None for r in rows),
        layers=rows,
        kv_bytes_full=cache.full_bytes,
        kv_bytes_kept=state.kv_bytes,
        kv_bytes_final=cache.kv_bytes(),
        kv_peak_prefill=state.peak_bytes,
        prefill_seconds=state.seconds,
        decode_seconds=decode_seconds,
        decode_steps=steps,
        eviction_seconds=prefill_evict + (policy.seconds if policy else 0.0) + cache.accumulate_seconds,
        stop_reason=stop_reason,
        sampling_seconds=sampling_seconds,
        first_logits=state.logits.detach().float().cpu(),
    )
