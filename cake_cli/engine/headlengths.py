"""Per-KV-head lengths in a layer's cache, and KVzip's single ranking that produces them (`--allocation global`).

**Layout (ours).** A layer whose KV heads keep different numbers of tokens ("ragged") stores each
head's kept tokens packed at the *end* of its row, padded at the front to the layer's longest head:
keys/values [1, H_kv, M, d], M = max_h len_h; head h's live slots are ``start[h] .. M - 1`` with
``start[h] = M - len_h``; its padding slots hold zeros and position -1 and are never attended. New
tokens are appended after slot M - 1 for every head alike (live for all), so the padding stays where
it is and a single released slot (decode's `fixed` policy) always lies among a head's live slots.
Front padding keeps the newest tokens (the observation window) last in every head, where the
quantized file keeps its unquantized tail (`engine.kvquant`). Memory is measured from the padded
tensors: padding to the longest head is real memory, masked keys in a full-size cache would not be
a saving at all (kvpress's head-wise presses only mask).

**Masks.** `live_slots` gives [H_kv, k] booleans for the k keys an attention call sees (the cached
slots plus the new tokens); the attention functions (`engine.attention`) narrow their causal /
sliding-window mask by it, repeated to each KV head's g query heads, for eager and SDPA, prefill-style
continuations and single decode queries alike. flash_attention_2 has no per-head key mask: it is
refused for a ragged cache.

**Global ranking (KVzip, Kim et al. 2025, arXiv 2505.23416, its non-uniform eviction over heads).**
KVzip ranks every (layer, KV head, pair) by its reconstruction score S (the max
attention a reconstruction query pays it, `engine.reconstruct` step 3) and keeps the pairs above one
threshold: the top K over all layers and heads, so layers *and* heads get unequal shares. We follow
that ranking on the raw scores (no normalisation per layer or head, as KVzip), with K = H_kv · B_total,
B_total = (B - w) · L_global the same evictable total CAKE shares, and keep CAKE's observation window
(the prefix's last w tokens, in every head, outside the ranking) where KVzip keeps a few sink and
recent tokens. Ties go to the lower (layer, head, index), so the choice is deterministic.
"""

from __future__ import annotations

import torch


def ranked_selection(scores: list[torch.Tensor], total: int) -> list[list[torch.Tensor]]:
    """KVzip's one threshold over every layer and KV head: the `total` highest scores overall.

    Args:
        scores: per scored layer, [H_kv, m] float scores S of its m evictable pairs (same H_kv, any m).
        total: K, pairs to keep over all layers and heads (clamped to [0, Σ H_kv · m]).

    Returns:
        Per layer, per KV head, the chosen pair indices (int64, ascending); their counts sum to K.
    """
    flat = torch.cat([s.float().reshape(-1) for s in scores])  # [Σ H_kv · m] in (layer, head, index) order
    total = max(0, min(int(total), flat.numel()))
    order = flat.sort(descending=True, stable=True).indices[:total]  # ties: lower flat index first
    chosen = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    chosen[order] = True
    out, offset = [], 0
    for s in scores:
        heads, m = s.shape
        mask = chosen[offset : offset + heads * m].view(heads, m)  # [H_kv, m]
        out.append([mask[h].nonzero().squeeze(1) for h in range(heads)])
        offset += heads * m
    return out


def pack_heads(layer, rows: list[torch.Tensor]) -> None:
    """Keep, per KV head h, the slots `rows[h]` of `layer` (a `cache.CakeLayer`), packed at the end of the
    head's row and padded at the front to the longest (module docstring); equal lengths give the plain
    rectangular layout (no padding, `layer.start` None).

    Args:
        rows: [H_kv] int64 tensors of slot indices, each ascending in position.
    """
    lengths = [int(r.numel()) for r in rows]
    longest = max(lengths)
    device = layer.keys.device
    if all(n == longest for n in lengths):
        layer.start = None
        layer.keep(torch.stack([r.to(device) for r in rows]))  # [H_kv, M]
        return
    pad = [longest - n for n in lengths]
    index = torch.stack(
        [torch.cat([r.new_zeros(p), r]).to(device) for r, p in zip(rows, pad)]
    )  # [H_kv, M]: slot 0 repeated as a placeholder in front of each head's kept slots
    layer.start = None
    layer.keep(index)  # [1, H_kv, M, d]
    start = torch.tensor(pad, dtype=torch.int64, device=device)  # [H_kv]
    set_padding(layer, start)


def set_padding(layer, start: torch.Tensor) -> None:
    """Mark slots 0 .. start[h] - 1 of every head h as padding: zero keys and values, position -1.

    Args:
        start: [H_kv] int64, first live slot per head.
    """
    slots = layer.keys.shape[-2]
    pad = torch.arange(slots, device=start.device).unsqueeze(0) < start.unsqueeze(1)  # [H_kv, slots]
    layer.keys.masked_fill_(pad[None, :, :, None], 0)
    layer.values.masked_fill_(pad[None, :, :, None], 0)
    layer.positions = layer.positions.masked_fill(pad, -1)
    if layer.scores is not None:
        layer.scores = layer.scores.masked_fill(pad, 0.0)
    layer.start = start if bool((start > 0).any()) else None


def live_slots(layer, k_len: int) -> torch.Tensor | None:
    """[H_kv, k_len] bool, True = a live key of that head, for an attention call over `k_len` keys (the
    layer's slots, then any new tokens: all live); None when the layer is not ragged."""
    start = getattr(layer, "start", None)
    if start is None:
        return None
    return torch.arange(k_len, device=start.device).unsqueeze(0) >= start.unsqueeze(1)  # [H_kv, k]


def head_lengths(layer) -> list[int]:
    """Live tokens per KV head (slots minus padding, minus a released slot)."""
    if layer.keys is None or not layer.is_initialized:
        return []
    slots = layer.keys.shape[-2] - (1 if layer.free is not None else 0)
    heads = layer.keys.shape[1]
    start = getattr(layer, "start", None)
    return [slots] * heads if start is None else [slots - int(s) for s in start.tolist()]


def check_padding(starts: torch.Tensor | None, positions: torch.Tensor, seen: int, layer_idx: int):
    """The first live slot per head of a layer read from a file (`cachefile.cache_from_tensors`), checked.

    Args:
        starts: [H_kv] integer tensor `starts.i`, or None (the layer is not ragged).
        positions: [H_kv, M] int64 positions, -1 on padding.
        seen: the prefix's length n (live positions lie in [0, n)).

    Returns:
        [H_kv] int64, or None when `starts` is None.

    Raises:
        ValueError: starts of another shape or out of [0, M), padding not at position -1, or a head's live
            positions not increasing within [0, n).
    """
    if starts is None:
        return None
    heads, slots = positions.shape
    if starts.shape != (heads,) or starts.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"layer {layer_idx}: starts {tuple(starts.shape)} {starts.dtype} do not fit its positions")
    start = starts.to(torch.int64)
    if int(start.min()) < 0 or int(start.max()) >= slots:
        raise ValueError(f"layer {layer_idx}: a head's first live slot lies outside its {slots} slots")
    for h, first in enumerate(start.tolist()):
        pad, live = positions[h, :first], positions[h, first:]
        inside = int(live.min()) >= 0 and int(live.max()) < seen and bool((live.diff() > 0).all())
        if bool((pad != -1).any()) or not inside:
            raise ValueError(f"layer {layer_idx}: positions are not increasing within [0, {seen}) after the padding")
    return start
