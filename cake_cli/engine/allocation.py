"""Budget allocation across layers and its cascade (paper Sec. 4.1-4.2, Eqs. 7-10, Prop. 1).

Real-valued budgets follow Eq. 7 with caps (water-filling: capped layers hand their excess to
the others). Integer budgets use largest-remainder rounding clamped by the previous cascade
stage, so they are integers, never increase from stage m to m + 1 (Prop. 1), and sum to the
total minus at most one token per layer.

`ALLOCATIONS` maps each allocation's name to its stage function: CAKE's preference cascade, and
the baselines' uniform and pyramid budgets (docs/method.md §Baselines), which ignore the layer statistics. Adding
an allocation is one function and one row. Pure Python (no torch).

`GLOBAL` (KVzip's single ranking) is not a split of budgets over layers: it ranks the scored pairs of
every layer and KV head at once, so only reconstruction scoring (`engine.reconstruct`, which holds
every layer's scores before evicting) runs it; the cascade refuses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def preference_weights(log_prefs: Sequence[float]) -> list[float]:
    """Turn log P_l into non-negative weights with the same ratios (max weight 1).

    Layers with P = 0 get weight 0; if every layer has P = 0 all get weight 1 (uniform).
    """
    finite = [x for x in log_prefs if x != float("-inf")]
    if not finite:
        return [1.0] * len(log_prefs)
    top = max(finite)
    return [math.exp(x - top) if x != float("-inf") else 0.0 for x in log_prefs]


def waterfill(weights: Sequence[float], total: float, cap: float) -> list[float]:
    """Real budgets b_l = min(cap, lambda · w_l) with sum b_l = total (Eq. 7 with caps).

    Args:
        weights: [L] non-negative preference weights (P_l up to a common factor).
        total: evictable tokens to share (B_total), >= 0.
        cap: most evictable tokens a layer can keep (n - w), >= 0.

    Returns:
        [L] real budgets, each in [0, cap]; sum = min(total, L · cap). Layers with weight 0 get a
        share only when every positive-weight layer is already capped.
    """
    n_layers = len(weights)
    if total >= cap * n_layers:
        return [float(cap)] * n_layers
    budgets = [0.0] * n_layers
    active = [i for i, w in enumerate(weights) if w > 0]
    if not active:
        active = list(range(n_layers))
        weights = [1.0] * n_layers
    remaining = float(total)
    while active:
        scale = remaining / sum(weights[i] for i in active)
        capped = [i for i in active if scale * weights[i] >= cap]
        if not capped:
            for i in active:
                budgets[i] = scale * weights[i]
            return budgets
        for i in capped:
            budgets[i] = float(cap)
            remaining -= cap
        active = [i for i in active if i not in capped]
    # every positive-weight layer is capped: spread the rest over the zero-weight layers
    rest = [i for i in range(n_layers) if budgets[i] == 0.0]
    for i in rest:
        budgets[i] = min(float(cap), remaining / len(rest))
    return budgets


def round_budgets(real: Sequence[float], cap: int) -> list[int]:
    """Largest-remainder rounding: floor each, then +1 to the largest fractions until the sum
    reaches round(sum(real)); never above cap. Ties go to the lower layer index.
    """
    floors = [min(cap, math.floor(x + 1e-9)) for x in real]
    missing = int(round(sum(real))) - sum(floors)
    order = sorted(range(len(real)), key=lambda i: (-(real[i] - floors[i]), i))
    for i in order:
        if missing <= 0:
            break
        if floors[i] < cap and real[i] - floors[i] > 1e-9:
            floors[i] += 1
            missing -= 1
    return floors


def allocate(log_prefs: Sequence[float], total: int, cap: int, previous: Sequence[int] | None = None) -> list[int]:
    """Integer budgets B_l^(m) for the layers seen so far (Eq. 7 for stage m, Eq. 9-10).

    Args:
        log_prefs: [m + 1] log P_l of layers 0..m.
        total: B_total = (B - w) · L evictable tokens for the whole model.
        cap: n - w, the evictable tokens each layer holds.
        previous: [m] budgets of layers 0..m-1 at stage m - 1, or None at stage 0 / one-shot.

    Returns:
        [m + 1] integer budgets in [0, cap]; budget[l] <= previous[l] (Prop. 1); the sum is at
        least min(total, (m+1)·cap) minus (m + 1).
    """
    real = waterfill(preference_weights(log_prefs), float(total), float(cap))
    budgets = round_budgets(real, cap)
    if previous is not None:
        budgets = [min(b, p) for b, p in zip(budgets, previous)] + budgets[len(previous) :]
    return budgets


def cascade(log_prefs: Sequence[float], total: int, cap: int) -> list[list[int]]:
    """Every stage of the cascade: stage m holds the budgets of layers 0..m (Sec. 4.2).

    Returns:
        [L] lists; stages[m] has m + 1 integer budgets; stages[-1] are the final budgets.
    """
    stages: list[list[int]] = []
    for m in range(len(log_prefs)):
        stages.append(allocate(log_prefs[: m + 1], total, cap, stages[-1] if stages else None))
    return stages


def uniform(num_layers: int, total: int, cap: int, window: int = 0) -> list[int]:
    """Equal integer budgets (SnapKV/H2O/TOVA-style allocation), each <= cap (`window` is not read)."""
    return round_budgets(waterfill([1.0] * num_layers, float(total), float(cap)), cap)


PYRAMID_BETA = 20  # PyramidKV's ratio between the top and bottom layers' budgets


def pyramid_weights(num_layers: int, beta: int = PYRAMID_BETA) -> list[float]:
    """PyramidKV's linear schedule: layer 0 gets the most, the last layer 1/beta of the mean.

    With mean budget c: min = c / beta, max = 2c - min, linear in between, so the weights sum to
    L · c. Returned normalised to mean 1.
    """
    if num_layers == 1:
        return [1.0]
    low = 1.0 / beta
    high = 2.0 - low
    step = (high - low) / (num_layers - 1)
    return [high - layer * step for layer in range(num_layers)]


def pyramid(num_layers: int, total: int, cap: int, window: int) -> list[int]:
    """PyramidKV's integer budgets, decreasing linearly with depth, summing to the total: the
    schedule of PyramidKV's code (`PyramidKVCluster.update_kv`, docs/method.md §Baselines) in real
    numbers, then rounded (largest remainder) so that the sum is exact (that code floors its end
    points and step, and keeps up to L - 1 tokens more or fewer than the total).

    With c = total / L evictable tokens per layer and n = cap + window prompt tokens:
    - n < 2c: every layer c (the code's SnapKV branch: the pyramid does not fit the prompt);
    - else linear from c · (2 - 1/beta) down to c / beta (`pyramid_weights`); when the top exceeds
      cap (n - w), the top is cap and the bottom 2c - cap, linear in between (the sum stays L · c).

    Args:
        num_layers: L.
        total: B_total = (B - w) · L evictable tokens.
        cap: n - w, the evictable tokens each layer holds.
        window: w, the observation window in tokens.

    Returns:
        [L] integer budgets in [0, cap], non-increasing with depth, summing to min(total, L · cap).
    """
    mean = total / num_layers
    if num_layers == 1 or total >= cap * num_layers or cap + window < 2 * mean:
        return uniform(num_layers, total, cap)
    weights = pyramid_weights(num_layers)
    high, low = mean * weights[0], mean * weights[-1]
    if high >= cap:
        high, low = float(cap), 2 * mean - cap
    step = (high - low) / (num_layers - 1)
    return round_budgets([high - layer * step for layer in range(num_layers)], cap)


@dataclass(frozen=True)
class Allocation:
    """How B_total is split over layers.

    Attributes:
        uses_stats: True when the budgets depend on the layer statistics: `split(log_prefs, total,
            cap, previous)` re-allocates layers 0..m at every cascade stage (Eq. 9). False when
            they are fixed before prefill: `split(num_layers, total, cap, window)` gives every layer's.
        split: the function (see `uses_stats`), returning integer budgets.
    """

    uses_stats: bool
    split: Callable[..., list[int]]


GLOBAL = "global"  # KVzip's one ranking over every layer and KV head (`engine.headlengths`), by reconstruction scores
SCORE_ALLOCATIONS = (GLOBAL,)  # allocations that rank the pairs themselves: only with `--scoring reconstruct`

ALLOCATIONS: dict[str, Allocation] = {
    "cake": Allocation(uses_stats=True, split=allocate),
    "uniform": Allocation(uses_stats=False, split=uniform),
    "pyramid": Allocation(uses_stats=False, split=pyramid),
}


def stage_budgets(
    name: str,
    log_prefs: Sequence[float] | None,
    seen: int,
    num_layers: int,
    total: int,
    cap: int,
    previous: Sequence[int] | None,
    *,
    window: int,
) -> list[int]:
    """Budgets of layers 0..seen-1 at cascade stage seen - 1 under allocation `name` (Eqs. 9-10).

    Args:
        name: a key of ALLOCATIONS.
        log_prefs: [seen] log P_l (needed when the allocation uses statistics, else ignored).
        seen: layers prefilled so far (m + 1).
        num_layers: L.
        total: B_total = (B - w) · L.
        cap: n - w.
        previous: the budgets of the previous stage, or None.
        window: w (the pyramid's schedule reads the prompt length n = cap + w).

    Returns:
        [seen] integer budgets, each in [0, cap], non-increasing across stages (Prop. 1).

    Raises:
        ValueError: unknown allocation.
    """
    if name == GLOBAL:
        raise ValueError("allocation global ranks reconstruction scores: it needs --scoring reconstruct")
    if name not in ALLOCATIONS:
        raise ValueError(f"unknown allocation {name!r}; choose one of {', '.join(ALLOCATIONS)}")
    alloc = ALLOCATIONS[name]
    if alloc.uses_stats:
        return alloc.split(log_prefs, total, cap, previous)
    return alloc.split(num_layers, total, cap, window)[:seen]
