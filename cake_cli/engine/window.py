"""Observation-window attention computed by the engine (docs/method.md §Notation, A_l).

The window attention is recomputed from the rotated window queries and the cached keys: it is
never taken from `output_attentions` and never materialised as an n x n matrix.
"""

from __future__ import annotations

import torch


def window_attention(
    query: torch.Tensor, key: torch.Tensor, scaling: float, softcap: float | None = None
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

    Returns:
        A: [H, w, n] float32 probabilities (each row sums to 1). Query head h reads KV head
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
    if w > 1:
        rows = torch.arange(w, device=key.device).unsqueeze(1) + (n - w)  # [w, 1] absolute positions
        cols = torch.arange(n, device=key.device).unsqueeze(0)  # [1, n]
        logits.masked_fill_(cols > rows, float("-inf"))  # causal inside the window
    return torch.softmax(logits, dim=-1).view(num_heads, w, n)  # [H, w, n]
