"""Building blocks of eviction indicators (paper Sec. 4.3): pooling, GQA aggregation, top-k.

The indicators themselves (CAKE's Eq. 11 and the baselines') are in `methods.token_scores`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def smooth(scores: torch.Tensor, kind: str, kernel: int) -> torch.Tensor:
    """1-D pooling along tokens, stride 1, padding kernel // 2 (authors' code: avg, k = 5).

    Args:
        scores: [H, m] per-head token scores.
        kind: "avg" (zero padding counted, as torch's avg_pool1d default) or "max".
        kernel: odd kernel size in tokens.

    Returns:
        [H, m] smoothed scores.
    """
    if kernel == 1:
        return scores
    x = scores.unsqueeze(1)  # [H, 1, m]
    pool = F.avg_pool1d if kind == "avg" else F.max_pool1d
    return pool(x, kernel_size=kernel, stride=1, padding=kernel // 2).squeeze(1)  # [H, m]


def group_mean(scores: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """Average the g = H / H_kv query heads of each KV head (spec §3, GQA).

    Args:
        scores: [H, m]; query head h belongs to KV head h // g.

    Returns:
        [H_kv, m].
    """
    num_heads, m = scores.shape
    return scores.reshape(num_kv_heads, num_heads // num_kv_heads, m).mean(dim=1)  # [H_kv, m]


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
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]  # [H_kv, k]
    return torch.sort(order, dim=-1).values
