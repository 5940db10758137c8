"""Attention the engine computes itself for scoring: the observation window's (docs/method.md §Notation, A_l)
and H2O's accumulated attention of every query.

Both are recomputed from the rotated queries and the cached keys: never taken from
`output_attentions` and never materialised as an n x n matrix.
"""

from __future__ import annotations

import torch


def window_attention(
    query: torch.Tensor, key: torch.Tensor, scaling: float, softcap: float | None = None, live=None
) -> torch.Tensor:
    """Attention probabilities of the last w queries over all keys, in float32, exactly as the
    model's attention computes them (the query arrives after any q norm and RoPE).

    Args:
        query: [H, w, d] rotated queries of the w most recent tokens (any float dtype).
        key: [H_kv, n, d] rotated cached keys at KV-head granularity; the queries are the last
            w of these n tokens, so row i (position n - w + i) sees keys 0..n - w + i (causal).
        scaling: softmax scale, usually d ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5).
        softcap: attention logit soft-capping c (Gemma 2): logits -> c · tanh(logits / c) before
            the softmax; None for none.
        live: [H_kv, n] bool, the keys each KV head holds (a ragged layer's padding False,
            `engine.headlengths`), or None: every key.

    Returns:
        A: [H, w, n] float32 probabilities (each row sums to 1; 0 on padding). Query head h reads KV head
        h // g with g = H / H_kv (the repeat_kv convention of transformers).

    Raises:
        ValueError: if H is not a multiple of H_kv or w > n.
    """
    num_heads, w, dim = query.shape
    num_kv, n, _ = key.shape
    if num_heads % num_kv or w > n:
        raise ValueError(f"bad shapes: query {tuple(query.shape)}, key {tuple(key.shape)}")
    group = num_heads // num_kv
    q = query.float().reshape(num_kv, group * w, dim)  # [H_kv, g·w, d]: each KV head's query rows
    logits = torch.bmm(q, key.float().transpose(1, 2)).mul_(scaling).view(num_kv, group, w, n)  # [H_kv, g, w, n]
    if softcap is not None:
        logits = logits.div_(softcap).tanh_().mul_(softcap)
    if w > 1:  # causal inside the window: only its own last w keys are ever masked
        future = torch.ones(w, w, dtype=torch.bool, device=key.device).triu_(1)  # [w, w]
        logits[..., n - w :].masked_fill_(future, float("-inf"))
    if live is not None:
        logits.masked_fill_(~live[:, None, None, :], float("-inf"))  # [H_kv, 1, 1, n]: a head's padding
    return torch.softmax(logits, dim=-1).view(num_heads, w, n)  # [H, w, n]


ACCUMULATE_BLOCK = 1 << 24  # float32 logits per block of `accumulated_attention` (64 MiB)


def block_rows(num_heads: int, keys: int) -> int:
    """Query rows per block of `accumulated_attention`: ACCUMULATE_BLOCK / (H · k), within 16..1024
    (H = 14 query heads: 1024 rows up to 1170 keys, 146 at 8192, 36 at 32768)."""
    return max(16, min(1024, ACCUMULATE_BLOCK // max(num_heads * keys, 1)))


def accumulated_attention(
    query: torch.Tensor, key: torch.Tensor, scaling: float, softcap: float | None = None, rows: int | None = None
) -> torch.Tensor:
    """H2O's accumulated attention (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle", NeurIPS): the
    attention every query pays each key, summed over the queries, computed block by block of query
    rows (a [H, rows, k] float32 block at a time, never the [H, q, k] matrix).

    Each block's logits are taken as `window_attention` takes them (scaling, here folded into the
    queries, soft-capping, causal mask, softmax per row over the keys the row sees); the block's rows
    are then summed down with one batched matrix-vector product per KV head (weights 1 / row sum of
    the exponentials).
    No sliding window is applied: local layers never accumulate (`cache.CakeCache.accumulate`), and
    a global layer past a sliding window is refused where attention runs (`attention.layer_window`).

    Args:
        query: [H, q, d] rotated queries of the last q of the k tokens (any float dtype); row i
            (position k - q + i) sees keys 0..k - q + i: the first k - q keys are cached, visible to
            every row, and the last q are causal among the queries (q = k in a prefill).
        key: [H_kv, k, d] rotated keys at KV-head granularity (query head h reads KV head h // g).
        scaling: softmax scale, usually d ** -0.5.
        softcap: attention logit soft-capping c (c · tanh(logits / c)), or None.
        rows: query rows per block (>= 1); None: `block_rows(H, k)`.

    Returns:
        [H_kv, k] float32, attention mass (a sum of probabilities, in [0, q]): for each key, the sum
        over the q queries of their probability on it, averaged over the g = H / H_kv query heads of
        its KV head (the GQA convention of `indicators.group_mean`).

    Memory: one block of H · rows · k float32 logits, exponentiated in place (at most
    ACCUMULATE_BLOCK values = 64 MiB with the default rows, beyond 16 rows), a float32 copy of the
    keys and the [H_kv, k] result. Time: one more causal attention pass, unfused (H = 14, d = 64,
    q = k = 8192: 1.2 s on 2 idle CPU cores, a few times the fused SDPA pass of the same layer).

    Raises:
        ValueError: H not a multiple of H_kv, q > k, or rows < 1.
    """
    num_heads, q, dim = query.shape
    num_kv, k, _ = key.shape
    rows = block_rows(num_heads, k) if rows is None else rows
    if num_heads % num_kv or q > k or rows < 1:
        raise ValueError(f"bad shapes: query {tuple(query.shape)}, key {tuple(key.shape)}, rows {rows}")
    group, cached = num_heads // num_kv, k - q
    keys_t = key.float().transpose(1, 2)  # [H_kv, d, k]
    total = torch.zeros(num_kv, 1, k, dtype=torch.float32, device=key.device)  # [H_kv, 1, k]
    buffer = torch.empty(num_heads * min(rows, q) * k, dtype=torch.float32, device=key.device)  # one block, reused
    for start in range(0, q, rows):
        b = min(rows, q - start)  # rows in this block
        seen = cached + start + b  # keys the block's last row sees
        block = query[:, start : start + b].float().mul(scaling).reshape(num_kv, group * b, dim)  # [H_kv, g·b, d]
        logits = buffer[: num_heads * b * seen].view(num_kv, group * b, seen)
        torch.bmm(block, keys_t[:, :, :seen], out=logits)  # [H_kv, g·b, seen], scaled (through the queries)
        if softcap is not None:
            logits.div_(softcap).tanh_().mul_(softcap)
        if b > 1:  # causal among the block's own keys (the last b it sees)
            future = torch.ones(b, b, dtype=torch.bool, device=key.device).triu_(1)  # [b, b]
            logits.view(num_kv, group, b, seen)[..., seen - b :].masked_fill_(future, float("-inf"))
        logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()  # [H_kv, g·b, seen] unnormalised
        weights = logits.sum(dim=-1, keepdim=True).reciprocal_().transpose(1, 2)  # [H_kv, 1, g·b]
        total[:, :, :seen] += torch.bmm(weights, logits)  # [H_kv, 1, seen]: summed over g·b rows
    return total.view(num_kv, k).div_(group)  # [H_kv, k]
