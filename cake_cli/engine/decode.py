"""Decode-time policies (docs/method.md §Decoding): `grow` appends, `fixed` keeps each layer at its size
(at most B when prefill evicted nothing).

`fixed` follows the authors' code: after each new token, the lowest-scoring token outside the
most recent w is evicted, scored by the new query's attention through the method's indicator
(for CAKE: Eq. 11 over the new queries, pooled along tokens, averaged over each KV head's query
heads). H2O (`indicators.ACCUMULATED`) scores instead by the accumulated attention the cache holds:
what every prompt query, every continuation token and every decoded query so far (this one
included) paid each held token, as H2O evicts at generation (Zhang et al. 2023, Algorithm 1); a
cache without it (e.g. a .cake file from before it was saved there) is refused (`prepare_cache`).
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import torch

from cake_cli.engine.config import CakeConfig
from cake_cli.engine.headlengths import live_slots, pack_heads
from cake_cli.engine.indicators import (
    CHUNKED,
    accumulates,
    chunk_means,
    group_mean,
    pooling,
    token_scores,
    top_k_sorted,
)
from cake_cli.engine.window import window_attention

# indicators `batched_victims` scores: finite scores from `a` alone (`chunk` also reads the positions, its chunk
# means taken per layer over the candidates only)
BATCHED = frozenset({"cake", "snapkv", "tova", "chunk"})


class Carry(NamedTuple):
    """What one batched step leaves the next (`FixedDecode.flush`)."""

    layers: tuple  # (layer index, slots) of the step's layers
    following: torch.Tensor  # [H_kv, S] the next step's order guess (`Victims.following`)
    held: list  # (positions tensor, seen) of each layer after the step, before the next token is written


class FixedDecode:
    """Keeps layer l at `capacity[l]` tokens during decoding.

    With one new token per step (the usual case) the evicted token's slot is released and the
    next token overwrites it, so no step copies the layer's cache. Scores are computed in
    position order (pooling runs along the sequence), from the method's indicator over the new
    queries' attention (H2O: from the layer's accumulated scores, this step's queries included, which
    `cache.CakeCache.after_attention` added before); the most recent w tokens are never evicted.

    The usual step (one new token, one eviction per layer, a layer whose KV heads hold the same
    number of tokens, one of the `BATCHED` indicators) is deferred: each layer's probabilities wait
    in `pending` and `flush` scores every layer of the step at once (`batched_victims`), before the
    cache is next written or measured (`cache.CakeCache.settle`). Nothing reads a layer between its
    attention and its next update, so the victims are those the per-layer path picks, with about
    20 tensor operations per step instead of per layer.

    Args:
        config: CAKE settings (window, indicator, pooling, gamma).
        capacity: [L] tokens per layer, e.g. B_l + w after an evicting prefill.
        batched: defer the usual step to `flush` (False: every layer scored as it attends, the
            reference the batched path is tested against).

    Attributes:
        seconds: wall time spent scoring and evicting, seconds.
        pending: (layer index, probs [H, 1, k]) of the layers attended since the last `flush`.
        orders_reused: batched steps whose slot order came from the step before (no sort).
    """

    def __init__(self, config: CakeConfig, capacity: list[int], batched: bool = True):
        self.config = config
        self.capacity = capacity
        self.seconds = 0.0
        self.batched = batched and config.indicator in BATCHED
        self.pending: list[tuple[int, torch.Tensor]] = []
        self.orders_reused = 0
        self._order: Carry | None = None

    def needs_probs(self, layer_idx: int, key_len: int) -> bool:
        """True when a layer holding `key_len` slots is over capacity (it will evict now)."""
        return key_len > self.capacity[layer_idx]

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
        """Evict layer `layer_idx` back to its capacity after q new tokens were added (a local
        layer keeps its native sliding window instead).

        Args:
            query: [1, H, q, d] rotated queries of the new tokens.
            key: [1, H_kv, k, d] every slot the layer holds (all live at this point).
            probs: [H, q, k] float32 attention of the new queries if already computed, else None.
            softcap: the layer's attention logit soft-capping, or None.
        """
        k = key.shape[-2]
        cap, cfg = self.capacity[layer_idx], self.config
        if k <= cap or cache.layers[layer_idx].window is not None:
            return
        layer = cache.layers[layer_idx]
        if self.batched and probs is not None and layer.start is None and k - cap == 1 and query.shape[2] == 1:
            if any(i == layer_idx for i, _ in self.pending):  # attended twice without a new forward: settle first
                self.flush(cache)
            self.pending.append((layer_idx, probs))  # scored with the step's other layers by `flush`
            return
        start = time.perf_counter()
        if layer.start is not None:
            self._evict_ragged(layer, query, key, scaling, probs, softcap, cap)
            self.seconds += time.perf_counter() - start
            return
        w = min(cfg.window, cap)
        num_heads, num_kv = query.shape[1], key.shape[1]
        order = torch.argsort(layer.positions, dim=-1)  # [H_kv, k]: slots in position order
        a = probs if probs is not None else window_attention(query[0], key[0], scaling, softcap)  # [H, q, k]
        by_head = order.repeat_interleave(num_heads // num_kv, dim=0)  # [H, k]
        a = a.gather(2, by_head.unsqueeze(1).expand(-1, a.shape[1], -1))  # [H, q, k] in position order
        m = k - w  # candidates: everything but the most recent w
        accumulated = layer.scores.gather(1, order)[:, :m] if accumulates(cfg.indicator) else None  # [H_kv, m]
        scores = token_scores(
            cfg.indicator,
            a[:, :, :m],
            layer.positions.gather(1, order)[:, :m],
            num_kv,
            gamma=cfg.gamma,
            pool=(cfg.pool_kind, cfg.pool_kernel),
            accumulated=accumulated,
            chunk=cfg.chunk,
        )  # [H_kv, m]
        if k - cap == 1 and query.shape[2] == 1:
            # lowest score; among ties the latest, as top_k_sorted keeps the earliest
            victim = (m - 1) - torch.argmin(scores.flip(-1), dim=-1)  # [H_kv]
            layer.release(order.gather(1, victim.unsqueeze(1)).squeeze(1))
        else:
            chosen = top_k_sorted(scores, cap - w)  # [H_kv, cap - w] in position-order space
            recent = torch.arange(m, k, device=chosen.device).expand(num_kv, w)
            layer.keep(order.gather(1, torch.cat([chosen, recent], dim=-1)))
        self.seconds += time.perf_counter() - start

    def flush(self, cache) -> None:
        """Evict one token from every layer in `pending` (`batched_victims`): each layer's victim slot
        is released, and the layer's next single-token update overwrites it. The slot order the step
        leaves is kept for the next step of the same layers (checked there before use)."""
        if not self.pending:
            return
        start = time.perf_counter()
        pending, self.pending = self.pending, []
        key = tuple((i, probs.shape[-1]) for i, probs in pending)
        layers = [cache.layers[i] for i, _ in pending]
        carry, hint, trusted = self._order, None, False
        if carry is not None and carry.layers == key:
            hint = carry.following
            # each layer's positions changed only by one token, the newest, written into the slot this policy
            # released (`CakeLayer.slot_written`); any other change replaces the tensor or writes more tokens
            trusted = all(
                layer.positions is positions and layer.seen == seen + 1 == layer.slot_written
                for layer, (positions, seen) in zip(layers, carry.held)
            )
        picked = batched_victims(
            self.config,
            [probs for _, probs in pending],
            [layer.positions for layer in layers],
            [self.capacity[i] for i, _ in pending],
            order=hint,
            trusted=trusted,
        )
        self._order = Carry(key, picked.following, [(layer.positions, layer.seen) for layer in layers])
        self.orders_reused += picked.reused
        for (i, _), slot in zip(pending, picked.slots.unbind(0)):
            cache.layers[i].release(slot)
        self.seconds += time.perf_counter() - start

    def _evict_ragged(self, layer, query, key, scaling, probs, softcap, cap: int) -> None:
        """`after_attention` for a layer whose KV heads hold different numbers of tokens
        (`engine.headlengths`): each head evicts, among its own live slots, as many tokens as the layer's
        slots exceed `cap` (one per new token), scored as above over that head's tokens in position order,
        its most recent w kept; so every head keeps its own length. One head at a time (H_kv is small)."""
        cfg, k = self.config, key.shape[-2]
        num_heads, num_kv = query.shape[1], key.shape[1]
        group = num_heads // num_kv
        live = live_slots(layer, k)  # [H_kv, k]
        a = probs if probs is not None else window_attention(query[0], key[0], scaling, softcap, live)  # [H, q, k]
        excess, victims, rows = k - cap, [], []
        for h in range(num_kv):
            slots = live[h].nonzero().squeeze(1)  # [k_h] live slots of head h
            order = slots[torch.argsort(layer.positions[h, slots])]  # [k_h] in position order
            w = min(cfg.window, order.numel() - excess)
            m = order.numel() - w  # candidates: all but the most recent w
            a_h = a[h * group : (h + 1) * group][:, :, order[:m]]  # [g, q, m]
            accumulated = layer.scores[h, order[:m]].unsqueeze(0) if accumulates(cfg.indicator) else None
            scores = token_scores(
                cfg.indicator, a_h, layer.positions[h, order[:m]].unsqueeze(0), 1, gamma=cfg.gamma,
                pool=(cfg.pool_kind, cfg.pool_kernel), accumulated=accumulated, chunk=cfg.chunk,
            )[0]  # fmt: skip
            if excess == 1 and query.shape[2] == 1:
                victims.append(order[(m - 1) - torch.argmin(scores.flip(-1))])  # lowest; among ties the latest
            else:
                chosen = top_k_sorted(scores.unsqueeze(0), m - excess)[0]  # [m - excess]
                rows.append(torch.cat([order[chosen], order[m:]]))  # position order
        if victims:
            layer.release(torch.stack(victims))  # [H_kv]
        else:
            pack_heads(layer, rows)


class Victims(NamedTuple):
    """What `batched_victims` picked for one step of P layers."""

    slots: torch.Tensor  # [P, H_kv] int64: the slot each KV head of each layer evicts
    following: torch.Tensor  # [H_kv, S] int64: the next step's flat column order (`FlatLayout`), the victim moved last
    reused: bool  # the `order` hint was this step's position order (no sort ran)


POSITION_BITS = 40  # flat sort key = layer << 40 | (position + pad): true positions stay below 2**40


class FlatLayout(NamedTuple):
    """The P layers of a batched step side by side in one row of S = sum(pad + k_l) columns: layer l
    takes columns base_l .. base_l + pad + k_l - 1, its `pad` separator columns first, then its k_l
    slots (slot s in column base_l + pad + s). A separator is never a candidate, so pooling (kernel
    <= 2·pad + 1) never reads across two layers."""

    layer: torch.Tensor  # [S] int64: the layer of each column
    key_offset: torch.Tensor  # [S] int64: layer << POSITION_BITS | pad, the column's sort key less its position
    first_slot: torch.Tensor  # [P] int64: base_l + pad, the column of the layer's slot 0
    # [n_out] int64: the columns of separators and of each layer's most recent w = min(window, capacity)
    outside: torch.Tensor
    inside: torch.Tensor  # [n_in] int64: the other columns, each layer's candidates (in column order)
    columns: torch.Tensor  # [S] int64: 0 .. S - 1
    dest: torch.Tensor  # [S] int64: the column's place in a [P, wmax] grid, each layer reversed (its last column first)
    last: torch.Tensor  # [S] int64: the last column of the column's layer
    layer_last: torch.Tensor  # [P] int64: the last column of each layer
    pad_positions: torch.Tensor  # [pad] int64: -pad .. -1, the separators' positions (before every slot)
    wmax: int  # the widest layer, pad + max k_l


@functools.lru_cache(maxsize=32)  # a benchmark decodes several cases in turn: each keeps its layout cached
def flat_layout(sizes: tuple[int, ...], windows: tuple[int, ...], pad: int, device: torch.device) -> FlatLayout:
    """The `FlatLayout` of layers holding `sizes` slots with `windows` protected recent tokens each
    (the same for every step of a fixed-policy decode, hence cached)."""
    widths = torch.tensor([pad + k for k in sizes], device=device)  # [P]
    base = widths.cumsum(0) - widths
    layer = torch.repeat_interleave(torch.arange(len(sizes), device=device), widths)  # [S]
    columns = torch.arange(layer.shape[0], device=device)
    offset = columns - base[layer]  # column within its layer
    candidates_end = (widths - torch.tensor(windows, device=device))[layer]
    wmax = int(widths.max())
    return FlatLayout(
        layer=layer,
        key_offset=(layer << POSITION_BITS) + pad,
        first_slot=base + pad,
        outside=((offset < pad) | (offset >= candidates_end)).nonzero().squeeze(1),
        inside=((offset >= pad) & (offset < candidates_end)).nonzero().squeeze(1),
        columns=columns,
        dest=layer * wmax + widths[layer] - 1 - offset,
        last=(base + widths - 1)[layer],
        layer_last=base + widths - 1,
        pad_positions=torch.arange(-pad, 0, device=device),
        wmax=wmax,
    )


def batched_victims(
    config: CakeConfig,
    probs: list[torch.Tensor],
    positions: list[torch.Tensor],
    capacity: list[int],
    order: torch.Tensor | None = None,
    trusted: bool = False,
) -> Victims:
    """The slot each KV head of P layers evicts after one decode token, all layers at once: what
    `FixedDecode.after_attention` picks layer by layer (the lowest indicator score among the
    candidates in position order, the most recent w = min(window, capacity) kept; among ties the
    latest), for an indicator of `BATCHED`; `chunk`'s means are taken per layer over its candidates
    (`indicators.chunk_means` on positions moved apart by layer), as the per-layer path takes them.

    The layers hold different numbers of slots k_l (= capacity + 1); they are laid side by side in
    one row (`FlatLayout`, no padding to the longest), each after `kernel // 2` separator columns.
    Every column is sorted by the key (layer, true position), so the row is each layer's slots in
    position order, layer after layer. The attention outside each layer's candidates (separators and
    window) is set to what the pooling pads with (0 for average, -inf for max pooling), so pooling the
    whole row gives each candidate its one-layer score, summed in the same order; the separators and
    the window then score +inf, out of the running for the minimum.

    Sorting is the step's largest cost, and the next step's order is known: the new token takes the
    victim's slot and is the newest, so it is this order with the victim moved to its layer's end
    (`Victims.following`). Passed back as `order`, it is used when it sorts this step's keys strictly
    increasing (which makes it the sorting permutation), else the columns are sorted again.

    Args:
        config: the indicator, pooling, gamma and window (docs/method.md §Decoding, Eq. 11).
        probs: P tensors [H, 1, k_l] float32, the new query's attention over the layer's slots.
        positions: P tensors [H_kv, k_l] int64, the true position of each slot (0 <= p < 2**40).
        capacity: P ints, the layer's tokens after eviction (k_l - 1).
        order: [H_kv, S] int64, a guess of the flat columns in key order (the previous step's
            `following`), or None.
        trusted: `order` is known to be this step's key order (`FixedDecode.flush` saw each layer's
            positions change only by the new token in the released slot), so it is used unchecked and,
            but for `chunk` (its chunks are positions // chunk), the positions are not read.

    Returns:
        `Victims`: the slots [P, H_kv], the next step's order guess, whether `order` was used.

    Raises:
        ValueError: an indicator outside `BATCHED`, a layer that is not exactly one over capacity, or
            `trusted` without an `order` of the step's shape.
    """
    if config.indicator not in BATCHED:
        raise ValueError(f"batched_victims scores {', '.join(sorted(BATCHED))}, not {config.indicator!r}")
    sizes = [p.shape[-1] for p in probs]
    if any(k != cap + 1 for k, cap in zip(sizes, capacity)):
        raise ValueError(f"each layer must hold one slot over its capacity: slots {sizes}, capacity {capacity}")
    pool = (config.pool_kind, config.pool_kernel)
    pool_kind, kernel = pooling(config.indicator, pool)
    num_heads, num_kv, device = probs[0].shape[0], positions[0].shape[0], probs[0].device
    group, pad = num_heads // num_kv, kernel // 2
    windows = tuple(min(config.window, cap) for cap in capacity)
    flat = flat_layout(tuple(sizes), windows, pad, device)
    separator = probs[0].new_zeros((num_heads, 1, pad))  # its values are masked below
    att = torch.cat([t for p in probs for t in (separator, p)], dim=2)[:, 0, :]  # [H, S]
    if pool_kind == "avg":
        # `token_scores` takes the group mean before an average pooling: taking it here, bit for bit the
        # same (the mean is element-wise), gathers, masks and pools H_kv rows instead of H
        att, group = group_mean(att, num_kv), 1  # [H_kv, S]
    chunked = config.indicator in CHUNKED  # its chunks are read from the positions, even in a trusted order
    if trusted:
        if order is None or order.shape != (num_kv, flat.layer.shape[0]):
            raise ValueError(f"a trusted order must be [H_kv, S] = [{num_kv}, {flat.layer.shape[0]}]")
        reused, sorted_pos = True, None
    if not trusted or chunked:
        pad_pos = flat.pad_positions.expand(num_kv, pad)
        pos = torch.cat([t for p in positions for t in (pad_pos, p)], dim=1)  # [H_kv, S]
        key = pos + flat.key_offset  # [H_kv, S]: distinct, >= 0
        sorted_key = key.gather(1, order) if order is not None and order.shape == key.shape else None
        if not trusted:
            reused = sorted_key is not None and bool((sorted_key[:, 1:] > sorted_key[:, :-1]).all())
            if not reused:
                order = key.argsort(dim=-1)  # [H_kv, S]
                sorted_key = key.gather(1, order)
        sorted_pos = sorted_key - flat.key_offset  # [H_kv, S]: the order keeps every column in its layer
    by_head = order[:, None, :].expand(num_kv, group, order.shape[1])
    att = att.view(num_kv, group, -1).gather(2, by_head).view(num_kv * group, -1)  # [H or H_kv, S] in key order
    att.index_fill_(1, flat.outside, float("-inf") if pool_kind == "max" else 0.0)  # (masked_fill_: 15x longer)
    # `chunk` is the `cake` score averaged per chunk: over the whole row its chunks would take in the window,
    # the separators and other layers' tokens at the same positions, so the means are taken below
    kind = "cake" if chunked else config.indicator
    scores = token_scores(kind, att.unsqueeze(1), sorted_pos, num_kv, gamma=config.gamma, pool=pool)  # [H_kv, S]
    if chunked:
        inside = flat.inside
        # layer l's positions moved by l * chunk * 2**40: chunk ids (layer, position // chunk), distinct per layer
        shifted = sorted_pos[:, inside] + flat.layer[inside] * (config.chunk << POSITION_BITS)  # [H_kv, n_in]
        scores[:, inside] = chunk_means(scores[:, inside], shifted, config.chunk)
    scores.index_fill_(1, flat.outside, float("inf"))
    grid = scores.new_full((num_kv, len(sizes) * flat.wmax), float("inf"))
    grid = grid.index_copy_(1, flat.dest, scores).view(num_kv, len(sizes), flat.wmax)  # [H_kv, P, wmax] reversed
    victim = flat.layer_last - torch.argmin(grid, dim=-1)  # [H_kv, P]: lowest; among ties the latest (first reversed)
    column = order.gather(1, victim)  # [H_kv, P]: the victim slot's own column
    index = flat.columns.expand_as(order)
    at = victim.gather(1, flat.layer.expand_as(order))  # [H_kv, S]: the victim column of each column's layer
    shift = (index >= at) & (index < flat.last)
    index = torch.where(index == flat.last, at, index + shift)  # skip the victim, then put it last
    return Victims((column - flat.first_slot).T.contiguous(), order.gather(1, index), reused)


class GrowDecode:
    """Appends every new token; evicts nothing after prefill."""

    seconds = 0.0

    def after_attention(
        self, cache, layer_idx, query, key, scaling, probs=None, softcap=None
    ) -> None:  # EvictionPolicy
        """Nothing to do."""


def prepare_cache(cache, config: CakeConfig | None) -> None:
    """Keep the accumulated attention only where the decode policy reads it (H2O's `fixed` policy);
    elsewhere stop accumulating (it costs an attention pass per layer and step).

    Raises:
        ValueError: H2O's `fixed` policy on a cache that holds no accumulated attention.
    """
    needed = config is not None and config.decode_policy == "fixed" and accumulates(config.indicator)
    if not needed:
        cache.accumulate(False)
    elif not cache.accumulating():
        raise ValueError(
            f"the {config.indicator} decode policy evicts by the accumulated attention of every query, which this "
            "cache does not hold (a .cake file made before it was saved there?): compress the document again, "
            "or decode with the grow policy"
        )
