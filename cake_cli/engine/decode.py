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

import time
from typing import NamedTuple

import torch

from cake_cli.engine.config import CakeConfig
from cake_cli.engine.headlengths import live_slots, pack_heads
from cake_cli.engine.indicators import SNAPKV_POOL, accumulates, token_scores, top_k_sorted
from cake_cli.engine.window import window_attention

BATCHED = frozenset({"cake", "snapkv", "tova"})  # indicators `batched_victims` scores: finite scores from `a` alone


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
        self._order: tuple[tuple, torch.Tensor] | None = None  # (pending layers and sizes, next order guess)

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
        hint = self._order[1] if self._order is not None and self._order[0] == key else None
        picked = batched_victims(
            self.config,
            [probs for _, probs in pending],
            [cache.layers[i].positions for i, _ in pending],
            [self.capacity[i] for i, _ in pending],
            order=hint,
        )
        self._order = (key, picked.following)
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
                pool=(cfg.pool_kind, cfg.pool_kernel), accumulated=accumulated,
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
    following: torch.Tensor  # [P, H_kv, kmax]: the padded slot order after the new token takes each victim's slot
    reused: bool  # the `order` hint was this step's position order (no sort ran)


def batched_victims(
    config: CakeConfig,
    probs: list[torch.Tensor],
    positions: list[torch.Tensor],
    capacity: list[int],
    order: torch.Tensor | None = None,
) -> Victims:
    """The slot each KV head of P layers evicts after one decode token, all layers at once: what
    `FixedDecode.after_attention` picks layer by layer (the lowest indicator score among the
    candidates in position order, the most recent w = min(window, capacity) kept; among ties the
    latest), for an indicator of `BATCHED`.

    The layers hold different numbers of slots k_l (= capacity + 1), so they are padded at the front
    to the longest, kmax: padded slots get position -1, before every real one, and the attention
    outside each layer's candidates (the padding and the window) is set to what the pooling pads with
    (0 for average, -inf for max pooling), so each candidate's pooled score is the one-layer score;
    the padded and window slots then score +inf, out of the running for the minimum.

    Sorting the slots by position is the step's largest cost, and it is known in advance: the new
    token of the next step takes the victim's slot and is the newest, so the next order is this one
    with the victim moved to the end (`Victims.following`). Passed back as `order`, it is used when
    it is this step's order (checked: padding first, then strictly increasing true positions, which
    makes it a permutation of the real slots), else the slots are sorted as before.

    Args:
        config: the indicator, pooling, gamma and window (docs/method.md §Decoding, Eq. 11).
        probs: P tensors [H, 1, k_l] float32, the new query's attention over the layer's slots.
        positions: P tensors [H_kv, k_l] int64, the true position of each slot (>= 0).
        capacity: P ints, the layer's tokens after eviction (k_l - 1).
        order: [P, H_kv, kmax] int64, a guess of the padded slots in position order (the previous
            step's `following`), or None.

    Returns:
        `Victims`: the slots [P, H_kv], the next step's order guess, whether `order` was used.

    Raises:
        ValueError: an indicator outside `BATCHED`, or a layer that is not exactly one over capacity.
    """
    if config.indicator not in BATCHED:
        raise ValueError(f"batched_victims scores {', '.join(sorted(BATCHED))}, not {config.indicator!r}")
    sizes = [p.shape[-1] for p in probs]
    if any(k != cap + 1 for k, cap in zip(sizes, capacity)):
        raise ValueError(f"each layer must hold one slot over its capacity: slots {sizes}, capacity {capacity}")
    count, num_heads, num_kv, kmax = len(probs), probs[0].shape[0], positions[0].shape[0], max(sizes)
    group, device = num_heads // num_kv, probs[0].device
    pos = positions[0].new_full((count, num_kv, kmax), -1)  # [P, H_kv, kmax], padding first
    att = probs[0].new_empty((count, num_heads, kmax))  # [P, H, kmax]
    for i, (p, a, k) in enumerate(zip(positions, probs, sizes)):
        pos[i, :, kmax - k :] = p
        att[i, :, kmax - k :] = a[:, 0, :]
    pads = torch.tensor([kmax - k for k in sizes], device=device)[:, None]  # [P, 1]
    index = torch.arange(kmax, device=device)
    padding = index < pads  # [P, kmax]
    reused = order is not None and order.shape == pos.shape
    if reused:
        sorted_pos = pos.gather(2, order)  # [P, H_kv, kmax]
        rising = sorted_pos[..., 1:] > sorted_pos[..., :-1]  # [P, H_kv, kmax - 1]
        reused = bool(((sorted_pos < 0) == padding[:, None, :]).all() and (rising | padding[:, None, 1:]).all())
    if not reused:
        order = pos.argsort(dim=-1)  # [P, H_kv, kmax]: padding (-1) first, then position order
        sorted_pos = pos.gather(2, order)
    by_head = order[:, :, None, :].expand(count, num_kv, group, kmax)
    att = att.view(count, num_kv, group, kmax).gather(3, by_head).view(count, num_heads, kmax)  # position order
    window = torch.tensor([kmax - min(config.window, cap) for cap in capacity], device=device)[:, None]
    outside = padding | (index >= window)  # [P, kmax]: padding and window
    pool_kind = {"cake": config.pool_kind, "snapkv": SNAPKV_POOL[0]}.get(config.indicator, "avg")
    att.masked_fill_(outside[:, None, :], float("-inf") if pool_kind == "max" else 0.0)
    scores = token_scores(
        config.indicator,
        att.view(-1, 1, kmax),
        sorted_pos.reshape(-1, kmax),
        count * num_kv,
        gamma=config.gamma,
        pool=(config.pool_kind, config.pool_kernel),
    ).view(count, num_kv, kmax)  # [P, H_kv, kmax]
    scores.masked_fill_(outside[:, None, :], float("inf"))
    victim = (kmax - 1) - torch.argmin(scores.flip(-1), dim=-1)  # [P, H_kv]: lowest; among ties the latest
    padded_slot = order.gather(2, victim.unsqueeze(-1))  # [P, H_kv, 1]
    skip = index[: kmax - 1] + (index[: kmax - 1] >= victim.unsqueeze(-1))  # [P, H_kv, kmax - 1]: all but the victim
    following = torch.cat([order.gather(2, skip), padded_slot], dim=-1)  # the victim's slot holds the newest next
    return Victims(padded_slot.squeeze(-1) - pads, following, reused)


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
