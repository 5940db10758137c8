"""KV cache with per-layer, per-KV-head eviction and real-tensor memory accounting (docs/method.md §GQA, §Memory
accounting).

Each layer stores keys/values as [1, H_kv, len_l, d] (KV-head granularity, never repeated to
query heads) plus the original position of every entry, [H_kv, len_l]. Usually all KV heads of a layer
hold the same number of tokens, each head its own; after KVzip's global ranking (`--allocation
global`) they hold different numbers, packed and padded at the front to the longest head, the padding
masked (`engine.headlengths`: `start` [H_kv] is each head's first live slot). Entries stay in position order;
keys are cached after RoPE, so an entry keeps its true position when others are evicted.

For H2O (`indicators.ACCUMULATED`) a global layer also holds `scores` [H_kv, len]: the attention
every query it has run paid each entry, accumulated by `CakeCache.after_attention` (prefill block
by block, continuation and decode tokens as they attend) and gathered with the entries.

Policy (which tokens to evict) lives in `cascade.py` and `decode.py`; this module only stores,
gathers and measures.
"""

from __future__ import annotations

import functools
import time

import torch
from transformers.cache_utils import Cache, DynamicLayer

from cake_cli.engine.headlengths import head_lengths
from cake_cli.engine.policy import EvictionPolicy
from cake_cli.engine.window import accumulated_attention

GROW = 256  # tokens of spare capacity added at least when a decode append finds the buffer full


@functools.lru_cache(maxsize=4096)
def _head_rows(heads: int, head_rows: int, device: torch.device) -> torch.Tensor:
    """[H_kv] int64: h · head_rows, the first row of head h in a flat view of a layer's tensor."""
    return torch.arange(heads, device=device) * head_rows


def _as_rows(t: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """A layer's keys or values [1, H_kv, slots, d] as a view [1, R, 1, d] of rows of d over the same
    memory, with the rows from one head's slot 0 to the next's (R = (H_kv - 1) · that + slots); None
    when its rows are not evenly spaced (d contiguous values, heads a whole number of rows apart) or
    when heads overlap (fewer rows apart than they hold slots), where one row would serve two heads."""
    heads, slots, dim = t.shape[1], t.shape[2], t.shape[3]
    stride = t.stride()
    if stride[3] != 1 or stride[2] != dim or stride[1] % dim:
        return None
    head_rows = stride[1] // dim
    if heads > 1 and head_rows < slots:  # heads overlapping (e.g. expanded over heads): one row, several heads
        return None
    return t.as_strided((1, (heads - 1) * head_rows + slots, 1, dim), (stride[0], dim, dim, 1)), head_rows


class NonFiniteError(ValueError):
    """The model produced inf/NaN keys or values; they are never written into the cache."""


class CakeLayer(DynamicLayer):
    """One layer's cache: keys/values [1, H_kv, len, d], positions [H_kv, len] (int64), and while
    `accumulates`, scores [H_kv, len] float32 (accumulated attention mass, in slot order; a new
    token starts at 0).

    `positions` is written in place only by `_write_released` (the new token in a released slot, which
    sets `slot_written`); every other change assigns a new tensor. The fixed decode policy relies on
    this to trust the slot order it carries from step to step (`decode.FixedDecode.flush`)."""

    window: int | None = None  # a local layer's native sliding window (SlidingLayer); None: global

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.positions: torch.Tensor | None = None
        self.seen = 0  # tokens ever appended = the next token's true position
        self.free: torch.Tensor | None = None  # [H_kv] a released slot per head, reused by the next token
        self.slot_written = -1  # `seen` right after the last token written into a released slot
        self.accumulates = False  # keep `scores` (H2O); set by CakeCache.accumulate
        self.scores: torch.Tensor | None = None  # [H_kv, len] float32 accumulated attention, or None
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # decode growth room (`_append_one`)
        self.start: torch.Tensor | None = None  # [H_kv] first live slot per head (ragged layer), None: all live

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Add q new tokens at their true positions seen..seen+q-1; return the whole layer.

        A single new token overwrites the slot released by `release` (no copy of the layer);
        otherwise released slots are dropped and the tokens are appended.

        Args:
            key_states, value_states: [1, H_kv, q, d] (keys already rotated).

        Returns:
            (keys, values): [1, H_kv, slots, d], every slot holding a live token.
        """
        q = key_states.shape[-2]
        if self.free is not None:
            if q == 1:
                self._write_released(key_states, value_states)
                return self.keys, self.values
            self.compact()
        if q == 1 and self.window is None and self.is_initialized and self.keys is not None and self.keys.shape[-2]:
            keys, values = self._append_one(key_states, value_states)
        else:
            keys, values = super().update(key_states, value_states)
        new = torch.arange(self.seen, self.seen + q, device=key_states.device)
        new = new.unsqueeze(0).expand(key_states.shape[1], q)  # [H_kv, q]
        self.positions = new if self.positions is None else torch.cat([self.positions, new], dim=-1)
        if self.accumulates:
            zeros = torch.zeros(new.shape, dtype=torch.float32, device=new.device)  # [H_kv, q]
            self.scores = zeros if self.scores is None else torch.cat([self.scores, zeros], dim=-1)
        self.seen += q
        return keys, values

    def _write_released(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """One new token [1, H_kv, 1, d] into slot free[h] of each head h (`release`), at position `seen`.

        Keys and values are written as rows of d (`_as_rows`: the layer, usually a view of its decode
        buffer, seen as [1, R, 1, d]), one `index_copy_` each at row h·stride + free[h], the positions with
        one `index_fill_`: a decode step writes every evicting layer, so each tensor operation's dispatch
        counts (about half the cost of indexed writes on the project's CPU)."""
        free, positions, heads = self.free, self.positions, self.free.shape[0]
        self._write_rows(key_states, value_states)
        if not positions.is_contiguous():  # e.g. the first update's positions, one row expanded to every head
            positions = self.positions = positions.contiguous()
        positions.view(-1).index_fill_(0, free + _head_rows(heads, positions.shape[1], free.device), self.seen)
        if self.scores is not None:
            self.scores.scatter_(1, free.unsqueeze(1), 0.0)
        self.free = None
        self.seen += 1
        self.slot_written = self.seen

    def _write_rows(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """The keys and values of `_write_released`: row free[h] of each head h <- the new token [1, H_kv, 1, d]."""
        free, heads = self.free, self.free.shape[0]
        for cache, new in ((self.keys, key_states), (self.values, value_states)):
            rows = _as_rows(cache)
            if rows is None:
                index = (torch.zeros_like(free), torch.arange(heads, device=free.device), free)
                cache.index_put_(index, new[0, :, 0])  # [1, H_kv, slots, d]
            else:
                view, head_rows = rows
                view.index_copy_(1, free + _head_rows(heads, head_rows, free.device), new)

    def _append_one(self, key_states: torch.Tensor, value_states: torch.Tensor):
        """Append one decoded token into spare capacity instead of concatenating: a concatenation
        copies the whole layer every step (at 8,192 tokens 12-23% of a full-cache decode step on the
        project's CPU, benchmarks/runs/decode-profile-2026-12-02.md). The buffers grow by
        max(len / 8, `GROW`) tokens when full (one copy then); keys/values stay views of their first
        len + 1 slots, so everything else sees [1, H_kv, len + 1, d] as before. `nbytes` counts the
        live slots (the spare capacity is at most len / 8 + `GROW` tokens)."""
        n = self.keys.shape[-2]
        buf = self._buffers
        if buf is None or buf[0].shape[-2] <= n or buf[0].data_ptr() != self.keys.data_ptr():
            cap = n + max(n // 8, GROW)
            shape = (*self.keys.shape[:2], cap, self.keys.shape[-1])  # [1, H_kv, cap, d]
            buf = (self.keys.new_empty(shape), self.values.new_empty(shape))
            buf[0][:, :, :n].copy_(self.keys)
            buf[1][:, :, :n].copy_(self.values)
            self._buffers = buf
        buf[0][:, :, n : n + 1].copy_(key_states)
        buf[1][:, :, n : n + 1].copy_(value_states)
        self.keys, self.values = buf[0][:, :, : n + 1], buf[1][:, :, : n + 1]  # views [1, H_kv, n + 1, d]
        return self.keys, self.values

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the entries `index` of each KV head (physical eviction).

        Args:
            index: [H_kv, k] int64 entry indices per KV head, ascending (keeps position order).
        """
        index = index.to(self.keys.device)
        expanded = index.unsqueeze(0).unsqueeze(-1).expand(1, *index.shape, self.keys.shape[-1])
        self.keys = self.keys.gather(2, expanded)  # [1, H_kv, k, d]
        self.values = self.values.gather(2, expanded)  # [1, H_kv, k, d]
        self.positions = self.positions.gather(1, index)  # [H_kv, k]
        if self.scores is not None:
            self.scores = self.scores.gather(1, index)  # [H_kv, k]

    def release(self, slot: torch.Tensor) -> None:
        """Mark one slot per KV head as evicted; the next single-token update overwrites it.

        Args:
            slot: [H_kv] int64 slot index per head.
        """
        self.free = slot

    def compact(self) -> None:
        """Physically drop released slots, keeping position order."""
        if self.free is None:
            return
        order = torch.argsort(self.positions, dim=-1)  # [H_kv, slots]: slot ids in position order
        alive = order[order != self.free.unsqueeze(1)].view(order.shape[0], -1)  # one dead slot per row
        self.free = None
        self.keep(alive)  # [1, H_kv, slots - 1, d]

    def live(self) -> int:
        """Tokens held per KV head (slots minus a released one)."""
        if not self.is_initialized or self.keys is None:
            return 0
        return self.keys.shape[-2] - (1 if self.free is not None else 0)

    def nbytes(self) -> int:
        """Bytes held by this layer's key and value tensors (0 before the first token)."""
        if self.keys is None or not self.is_initialized:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


class SlidingLayer(CakeLayer):
    """A local layer's cache (`families.attention_layout`): it keeps its native sliding window and
    is never evicted by CAKE. Like transformers' DynamicSlidingWindowLayer it returns the cached
    tokens plus the new ones for attention, then stores only the last `window - 1` of them (all a
    later query at most `window` positions away can see). Positions stay contiguous and ascending.
    """

    is_sliding = True

    def __init__(self, window: int, **kwargs):
        super().__init__(**kwargs)
        self.window = window

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Add q new tokens; return [1, H_kv, held + q, d] keys/values, keep the last window - 1."""
        keys, values = super().update(key_states, value_states)
        if keys.shape[-2] >= self.window:
            self.keep_last(self.window - 1)
        return keys, values

    def keep_last(self, count: int) -> None:
        """Keep the `count` most recent tokens, copied (so the full tensors returned for attention are
        freed afterwards and `nbytes` measures what is held)."""
        self.keys, self.values = self.keys[:, :, -count:, :].clone(), self.values[:, :, -count:, :].clone()
        self.positions = self.positions[:, -count:].clone()


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class CakeCache(Cache):
    """A transformers Cache of `CakeLayer`s that also carries the run's eviction state.

    The engine passes this object to the model twice: as `cache=` (storage) and as `cake=`
    (a keyword the registered attention functions read to call `after_attention`).

    Args:
        num_layers: L.
        policy: see Attributes.
        accumulate: the global layers accumulate H2O's `scores` (see `accumulate`).
        windows: [L] the native sliding window of each local layer (a `SlidingLayer`), None for a
            global layer (`families.attention_layout(config).windows`); None: every layer global.

    Attributes:
        policy: an `engine.policy.EvictionPolicy` (its `after_attention` runs after each layer attends)
            or None (None = plain full cache, used as the no-eviction baseline).
        peak_bytes: largest sum over layers of cached KV bytes seen after any update or eviction.
        full_bytes: KV bytes the full cache held, summed when each layer received its prompt (a
            local layer: its native window, what the model's own cache keeps).
        accumulate_seconds: wall time spent accumulating H2O's scores (prefill, continuation, decode).
    """

    def __init__(self, num_layers: int, policy: EvictionPolicy | None = None, windows=None, accumulate: bool = False):
        windows = list(windows) if windows is not None else [None] * num_layers
        if len(windows) != num_layers:
            raise ValueError(f"{len(windows)} layer windows for {num_layers} layers")
        super().__init__(layers=[CakeLayer() if w is None else SlidingLayer(w) for w in windows])
        self.windows = windows
        self._policy = policy
        self.peak_bytes = 0
        self.full_bytes = 0
        self.tracking_peak = True  # decode() turns it off: the peak reported is the prefill's
        self.accumulate_seconds = 0.0  # wall time spent accumulating H2O's scores, seconds
        self.accumulate(accumulate)

    @property
    def policy(self) -> EvictionPolicy | None:
        """The eviction hook run after each layer attends (None: a plain full cache)."""
        return self._policy

    @policy.setter
    def policy(self, policy: EvictionPolicy | None) -> None:
        self.settle()  # what the outgoing policy deferred is carried out before another takes over
        self._policy = policy

    def settle(self) -> None:
        """Carry out the evictions the policy deferred to batch them across layers
        (`decode.FixedDecode.flush`); called before the cache is written or measured."""
        flush = getattr(self._policy, "flush", None)
        if flush is not None:
            flush(self)

    def accumulate(self, on: bool) -> None:
        """Start (a global layer's entries held now start at 0) or stop (scores dropped) accumulating
        H2O's scores on every global layer; a local layer is never scored."""
        for layer in self.layers:
            layer.accumulates = on and layer.window is None
            if not layer.accumulates:
                layer.scores = None
            elif layer.scores is None and layer.positions is not None:
                layer.scores = torch.zeros(layer.positions.shape, dtype=torch.float32, device=layer.positions.device)

    def accumulating(self) -> bool:
        """Whether every global layer holds accumulated scores (what H2O's decode policy reads)."""
        return all(layer.scores is not None for layer in self.layers if layer.window is None and layer.seen)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Append to layer `layer_idx` and track memory (see CakeLayer.update).

        Raises:
            NonFiniteError: the new keys or values hold inf or NaN (e.g. float16 overflow).
        """
        if not (torch.isfinite(key_states).all() and torch.isfinite(value_states).all()):
            raise NonFiniteError(
                f"layer {layer_idx} produced non-finite keys/values ({key_states.dtype}); nothing non-finite is cached"
            )
        if layer_idx == 0:  # a forward starts: the previous step's deferred evictions are due
            self.settle()
        layer = self.layers[layer_idx]
        keys, values = layer.update(key_states, value_states)
        if layer.seen == key_states.shape[-2]:  # the prompt's first pass
            self.full_bytes += layer.nbytes()
        self.track_peak(_nbytes(keys, values) - layer.nbytes())  # a local layer attends over more than it keeps
        return keys, values

    def after_attention(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        scaling: float,
        probs: torch.Tensor | None = None,
        softcap: float | None = None,
    ) -> None:
        """Hook called by the attention function once layer `layer_idx` has attended; `probs` are the
        [H, 1, k] float32 probabilities of a single decode query when the attention function computed
        them; `softcap` the layer's attention logit soft-capping (None: none).

        An accumulating layer first adds what the q new queries [1, H, q, d] paid each of its k slots
        (`window.accumulated_attention`, or `probs`) to its scores; then the policy runs.
        """
        layer = self.layers[layer_idx]
        if layer.accumulates:
            if layer.start is not None:  # its softmax would spread mass over the padding: refuse, never approximate
                raise ValueError("H2O's accumulated attention is not kept for KV heads of different lengths")
            start = time.perf_counter()
            if probs is not None:  # [H, q, k] -> [H_kv, k]: summed over the queries, averaged per KV head
                num_kv = key.shape[1]
                layer.scores += probs.sum(dim=1).view(num_kv, -1, probs.shape[-1]).mean(dim=1)
            else:
                layer.scores += accumulated_attention(query[0], key[0], scaling, softcap)  # [H_kv, k]
            self.accumulate_seconds += time.perf_counter() - start
        if self.policy is not None:
            self.policy.after_attention(self, layer_idx, query, key, scaling, probs=probs, softcap=softcap)

    def needs_probs(self, layer_idx: int, key_len: int) -> bool:
        """Whether layer `layer_idx` will use a single query's probabilities now: an accumulating layer
        always, otherwise when the policy scores it (never a local layer: CAKE does not evict it)."""
        if self.layers[layer_idx].accumulates:
            return True
        if self.policy is None or self.layers[layer_idx].window is not None:
            return False
        return getattr(self.policy, "needs_probs", lambda *_: False)(layer_idx, key_len)

    def window_rows(self, layer_idx: int, key_len: int) -> int:
        """Query rows whose probabilities layer `layer_idx`'s policy will score from in this forward when the
        attention function hands them over (`attention.split_attention`); 0: the policy computes its own,
        or none (no policy; a local layer, an accumulating one, or one whose KV heads hold different numbers
        of tokens, whose probabilities the split does not compute)."""
        layer = self.layers[layer_idx]
        if self.policy is None or layer.window is not None or layer.accumulates or layer.start is not None:
            return 0
        return getattr(self.policy, "window_rows", lambda *_: 0)(layer_idx, key_len)

    def kv_bytes(self) -> int:
        """Bytes held now by every layer's key and value tensors, measured from the tensors."""
        self.settle()
        return sum(layer.nbytes() for layer in self.layers)

    def track_peak(self, transient: int = 0) -> None:
        """Record the current total (plus `transient` bytes held only while a layer attends) if it is
        the largest so far (while `tracking_peak`)."""
        if self.tracking_peak:
            self.peak_bytes = max(self.peak_bytes, self.kv_bytes() + transient)

    def lengths(self) -> list[int]:
        """Slots held per layer (a ragged layer's padding included: its longest head; see `head_lengths`)."""
        self.settle()
        return [layer.live() for layer in self.layers]

    def head_lengths(self) -> list[list[int] | None]:
        """Live tokens per KV head of each layer, None for a layer whose heads hold the same number."""
        return [head_lengths(layer) if layer.start is not None else None for layer in self.layers]

    def ragged(self) -> bool:
        """Whether some layer's KV heads hold different numbers of tokens (`engine.headlengths`)."""
        return any(layer.start is not None for layer in self.layers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """True number of tokens seen (not the compressed length), for callers that derive positions."""
        return self.layers[layer_idx].seen
