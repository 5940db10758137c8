"""Eviction indicators (paper Sec. 4.3, Eq. 11, and the baselines of docs/method.md §Baselines): which tokens a layer
keeps.

An indicator is a function from the attention of a layer's queries over its m candidate tokens to
one score per candidate (larger = keep). Most read the q most recent queries (the observation
window at prefill, the new tokens at decode) and score per query head; `token_scores` then averages
the g = H / H_kv query heads of each KV head (GQA), so each KV head keeps its own tokens. H2O reads
the accumulated attention of *every* query the layer has run (`ACCUMULATED`), which the cache keeps
per KV head (`window.accumulated_attention`, `cache.CakeLayer.scores`). `chunk` (`CHUNKED`) is
CAKE's indicator averaged over fixed chunks of consecutive positions (`chunk_means`), so a layer keeps
whole spans rather than scattered tokens (ChunkKV's idea under CAKE's budgets).
`INDICATORS` maps each name to its function: adding an indicator is one function and one row.

This module calls tensor methods only (it never imports torch), so the CLI can list and check
indicator names without loading torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SINK_TOKENS = 4  # StreamingLLM's attention sinks
SNAPKV_POOL = ("max", 7)  # SnapKV's smoothing (docs/method.md §Pooling)
DEFAULT_CHUNK = 10  # tokens per chunk of the `chunk` indicator (ChunkKV's default, Liu et al. 2025)


@dataclass(frozen=True)
class Attention:
    """What an indicator reads for one layer.

    Attributes:
        a: [H, q, m] float32 attention of the q most recent queries (the window at prefill, the
            new tokens at decode) over the m candidate tokens, in position order.
        positions: [H_kv, m] true positions of the candidates; None where the caller knows the
            indicator does not read them (`decode.batched_victims` with a trusted order).
        gamma: CAKE's variance weight (Eq. 11).
        pool: (kind, kernel) smoothing of the CAKE indicator (profile setting).
        column_var: optional precomputed Var_i a, [H, m] (saves a pass at prefill).
        accumulated: [H_kv, m] float32 accumulated attention of the candidates (attention mass: the
            sum over every query the layer has run, prompt and decode, of its probability on the
            token, averaged over each KV head's g query heads), for the ACCUMULATED indicators; None
            for the others.
    """

    a: torch.Tensor
    positions: torch.Tensor | None
    gamma: float
    pool: tuple[str, int]
    column_var: torch.Tensor | None = None
    accumulated: torch.Tensor | None = None


def variance_rows(a: torch.Tensor) -> torch.Tensor:
    """Unbiased variance down dim -2 (the q query rows); 0 when there is a single row.

    Two passes (mean, then squared deviations), which agree with `torch.var` to float32 rounding
    and run faster than it on a [H, w, n] window: the reduction runs down a strided dimension,
    where torch.var's Welford loop is slow.

    Args:
        a: [..., q, m] float tensor.

    Returns:
        [..., m] variance per column.
    """
    q = a.shape[-2]
    if q == 1:
        return a.new_zeros(a.shape[:-2] + a.shape[-1:])
    dev = a - a.mean(dim=-2, keepdim=True)  # [..., q, m]
    return dev.mul_(dev).sum(dim=-2).div_(q - 1)


def smooth(scores: torch.Tensor, kind: str, kernel: int) -> torch.Tensor:
    """1-D pooling along tokens, stride 1, padding kernel // 2 (authors' code: avg, k = 5).

    Max is torch's `max_pool1d` (padding is -inf, so it never wins). Avg is a running sum of the k
    shifted rows, then / k: equal, bit for bit, to `avg_pool1d` with zero padding counted, and faster
    on CPU at the decode step's widths (2.9x at [336, 2148], 9x at [14, 8192]; one thread, one run).
    tests/engine/test_methods.py checks both against an explicit window-by-window loop.

    Args:
        scores: [H, m] per-head token scores.
        kind: "avg" or "max".
        kernel: odd kernel size in tokens.

    Returns:
        [H, m] smoothed scores.
    """
    if kernel == 1:
        return scores
    half, m = kernel // 2, scores.shape[-1]
    if kind == "max":
        from torch.nn.functional import max_pool1d  # here, not at the top: see the module docstring

        return max_pool1d(scores.unsqueeze(1), kernel, stride=1, padding=half).squeeze(1)  # [H, m]
    padded = scores.new_zeros((scores.shape[0], m + 2 * half))
    padded[:, half : half + m] = scores  # [H, m + 2·half]
    total = padded[:, 0:m].clone()
    for shift in range(1, kernel):
        total += padded[:, shift : shift + m]
    return total / kernel  # [H, m]


def group_mean(scores: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """Average the g = H / H_kv query heads of each KV head (docs/method.md §GQA).

    Args:
        scores: [H, m]; query head h belongs to KV head h // g.

    Returns:
        [H_kv, m].
    """
    num_heads, m = scores.shape
    group = num_heads // num_kv_heads
    grouped = scores.reshape(num_kv_heads, group, m)  # [H_kv, g, m]
    # the g heads added one after another, element by element: every token's mean is summed in the same
    # order whatever the tensor's width or the token's column (torch's `mean` over dim 1 is not, and a
    # tie between candidates then breaks differently in a batched step than layer by layer)
    total = grouped[:, 0].clone()
    for head in range(1, group):
        total += grouped[:, head]
    return total / group  # [H_kv, m]


def top_k_sorted(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k highest scores per row, returned in ascending index order.

    Ties go to the lower index (stable sort), so selecting k from a top-k' subset (k <= k',
    kept in index order) picks exactly the top-k of the full row: the basis of Thm. 1.

    Args:
        scores: [H_kv, m].
        k: 0 <= k <= m.

    Returns:
        [H_kv, k] int64 indices into dim -1, ascending.
    """
    order = scores.sort(dim=-1, descending=True, stable=True).indices[:, :k]  # [H_kv, k]
    return order.sort(dim=-1).values


# ---- the indicators: Attention -> [H, m] per query head, unpooled ------------------------------


def cake(x: Attention) -> torch.Tensor:
    """CAKE (Eq. 11): mean + gamma · variance over the query rows, before pooling (`token_scores`
    pools it with `Attention.pool`). With one query (decode) the variance term is 0."""
    if x.a.shape[-2] == 1:
        return x.a[:, 0, :]
    var = x.column_var if x.column_var is not None else variance_rows(x.a)
    return x.a.mean(dim=-2) + x.gamma * var


def snapkv(x: Attention) -> torch.Tensor:
    """SnapKV: mean attention over the window, before pooling (`token_scores`: max, kernel 7)."""
    return x.a.mean(dim=-2)


def h2o(x: Attention) -> torch.Tensor:
    """H2O (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle", NeurIPS): the accumulated attention score,
    the attention every query paid the token, summed over all of them (every prompt query over the
    keys before it at prefill, plus each decoded query), not only over the observation window.
    PyramidKV's `H2OKVCluster`, where the CAKE paper's baselines come from, also sums every prompt
    query's row (it masks only the last w x w block causally; here every row is causal, as in the
    model). Unpooled; already per KV head: [H_kv, m].

    Raises:
        ValueError: no accumulated attention (a cache built without `accumulate`).
    """
    if x.accumulated is None:
        raise ValueError(
            "the h2o indicator needs the accumulated attention of every query: build the CakeCache with "
            "accumulate=True (generate.prefill and replay.record do for h2o)"
        )
    return x.accumulated


def tova(x: Attention) -> torch.Tensor:
    """TOVA: the attention of the last query only."""
    return x.a[:, -1, :]


def chunk(x: Attention) -> torch.Tensor:
    """Span-level CAKE (ChunkKV's selection, Liu et al. 2025): per query head it is CAKE's score (Eq. 11);
    `token_scores` pools and group-averages it as CAKE's, then replaces each candidate's score by the
    mean over its chunk of positions (`chunk_means`)."""
    return cake(x)


def streaming(x: Attention) -> torch.Tensor:
    """StreamingLLM: the first SINK_TOKENS positions (infinite score), then recency (the position)."""
    pos = x.positions.float()
    pos = pos.masked_fill(pos < SINK_TOKENS, float("inf"))  # [H_kv, m]
    return pos.repeat_interleave(x.a.shape[0] // pos.shape[0], dim=0)  # [H, m]: equal within a group


INDICATORS: dict[str, Callable[[Attention], torch.Tensor]] = {  # [H, m] per query head, ACCUMULATED: [H_kv, m]
    "cake": cake,
    "snapkv": snapkv,
    "h2o": h2o,
    "tova": tova,
    "streaming": streaming,
    "chunk": chunk,
}
ACCUMULATED = frozenset({"h2o"})  # indicators that read `Attention.accumulated` (already averaged per KV head)
CHUNKED = frozenset({"chunk"})  # indicators whose [H_kv, m] scores `token_scores` averages per chunk (`chunk_means`)


def chunk_means(scores: torch.Tensor, positions: torch.Tensor | None, chunk: int) -> torch.Tensor:
    """Each candidate's score replaced by the mean score of its chunk: the candidates of the same KV head
    whose positions share `position // chunk` (fixed chunks of `chunk` consecutive positions, aligned on
    position 0, so at prefill, where the candidates are positions 0..m-1, chunks are aligned on the prompt).
    A chunk some of whose tokens were evicted (decode) is averaged over the tokens still held. Candidates
    need not be in position order.

    Every token of a chunk gets the same score and `top_k_sorted` breaks ties towards the lower index,
    so with the candidates in position order (as every caller passes them) the top-k of a row keeps
    whole chunks plus at most one partial chunk (the lowest-scoring kept one, cut at its earliest
    tokens; chunks of equal mean are taken whole, the earlier first); and since the scores are fixed
    once computed, selecting k from a kept top-k' subset (k <= k') still picks the top-k of the full
    row, so CAKE's cascade stays exact (Thm. 1; tests/engine/test_chunk.py checks both).

    Args:
        scores: [H_kv, m] float scores per KV head.
        positions: [H_kv, m] int64 true positions of the candidates; None: the candidate index 0..m-1
            stands for the position (candidates in position order with no gap, as at prefill).
        chunk: tokens per chunk, >= 1 (1: the scores unchanged, bit for bit).

    Returns:
        [H_kv, m] float scores, equal within a chunk.

    Raises:
        ValueError: chunk < 1.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 token (got {chunk})")
    if chunk == 1:
        return scores
    num_kv, m = scores.shape
    if positions is None:
        positions = scores.new_ones((num_kv, m)).long().cumsum(dim=-1) - 1  # [H_kv, m]: 0 .. m - 1
    ids = positions.div(chunk, rounding_mode="floor")  # [H_kv, m] chunk of each candidate
    # dense chunk numbers per row (row-offset ids made distinct across rows, then ranked): the buffer the
    # means land in is then at most m wide whatever the positions (decode reaches 10^5)
    span = ids.max() - ids.min() + 1
    rows = scores.new_ones((num_kv, 1)).long().cumsum(dim=0) - 1  # [H_kv, 1]: 0 .. H_kv - 1
    _, dense = (ids - ids.min() + rows * span).flatten().unique(return_inverse=True)  # [H_kv·m]
    sums = scores.new_zeros(num_kv * m).scatter_add_(0, dense, scores.flatten())  # [≤ H_kv·m]
    counts = scores.new_zeros(num_kv * m).scatter_add_(0, dense, scores.new_ones(num_kv * m))
    return (sums / counts.clamp(min=1)).gather(0, dense).view(num_kv, m)  # [H_kv, m]


PROFILE_POOLED = ("cake", "chunk")  # the indicators smoothed with the profile's pooling
GAMMA_INDICATORS = ("cake", "chunk")  # the indicators that read gamma (Eq. 11's variance term)


def pooling(kind: str, pool: tuple[str, int]) -> tuple[str, int]:
    """The (kind, kernel) smoothing `token_scores` applies to indicator `kind`: CAKE's profile
    setting `pool` (also for `chunk`, CAKE's score before its chunk means), SnapKV's own (max, 7), none
    (kernel 1) for the others (docs/method.md §Pooling)."""
    if kind in PROFILE_POOLED:
        return pool
    return SNAPKV_POOL if kind == "snapkv" else ("avg", 1)


def accumulates(indicator: str | None) -> bool:
    """Whether `indicator` reads the accumulated attention of every query (the cache must accumulate it)."""
    return indicator in ACCUMULATED


def token_scores(
    kind: str,
    a: torch.Tensor,
    positions: torch.Tensor | None,
    num_kv_heads: int,
    *,
    gamma: float,
    pool: tuple[str, int],
    column_var: torch.Tensor | None = None,
    accumulated: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Eviction indicator `kind` of the candidate tokens of one layer, per KV head; larger = keep:
    the indicator per query head, pooled along tokens (`pooling`), averaged over each KV head's g
    query heads (docs/method.md §Pooling, §GQA); an ACCUMULATED indicator as it is; a CHUNKED one
    then averaged over its chunks of `chunk` positions (`chunk_means`).

    Args:
        kind: a key of INDICATORS.
        a, positions, gamma, pool, column_var, accumulated: see `Attention` (`chunk` reads `positions`;
            None: the candidates' index order stands for their positions).
        num_kv_heads: H_kv; per-query-head scores are averaged over each KV head's group.
        chunk: tokens per chunk (`CakeConfig.chunk`), required by the CHUNKED indicators, unread by the others.

    Returns:
        [H_kv, m] float32 scores.

    Raises:
        ValueError: unknown indicator, an ACCUMULATED one without `accumulated`, a CHUNKED one without
            `chunk` or with chunk < 1.
    """
    if kind not in INDICATORS:
        raise ValueError(f"unknown indicator {kind!r}; choose one of {', '.join(INDICATORS)}")
    if kind in CHUNKED and chunk is None:
        raise ValueError(f"the {kind} indicator needs the chunk size: pass chunk=config.chunk")
    scores = INDICATORS[kind](Attention(a, positions, gamma, pool, column_var, accumulated))
    if kind in ACCUMULATED:
        return scores  # [H_kv, m]
    pool_kind, kernel = pooling(kind, pool)
    if pool_kind == "avg":
        # average pooling (zero padding counted) and the group mean are both linear, so they commute:
        # the mean first pools H_kv rows instead of H (the same scores up to float rounding)
        scores = smooth(group_mean(scores, num_kv_heads), pool_kind, kernel)  # [H_kv, m]
    else:
        scores = group_mean(smooth(scores, pool_kind, kernel), num_kv_heads)  # [H_kv, m]
    return chunk_means(scores, positions, chunk) if kind in CHUNKED else scores  # [H_kv, m]


def shared_ranking(scores: torch.Tensor) -> torch.Tensor:
    """One ranking for every KV head from a layer's indicator (`CakeConfig.rank_layer`): each head's scores
    normalised to sum 1 (heads score on their own scales), then averaged over the heads.

    Args:
        scores: [H_kv, m] non-negative float32 indicator of one layer's candidate tokens (`token_scores`).

    Returns:
        [H_kv, m] float32, every row the same (a new tensor).
    """
    total = scores.sum(dim=-1, keepdim=True).clamp_min(1e-30)  # an all-zero head stays zero
    return (scores / total).mean(dim=0, keepdim=True).expand_as(scores).contiguous()
