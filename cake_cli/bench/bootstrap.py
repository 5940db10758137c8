"""Paired bootstrap confidence intervals for a difference of mean scores on the same cases.

Two methods answered the same n cases; d_i = score_A(case i) - score_B(case i). The paired
bootstrap (Efron & Tibshirani 1993, ch. 13; Koehn 2004 for NLP systems) draws n cases with
replacement `resamples` times, takes the mean of d over each draw, and reports the percentile
interval: the (1 - level) / 2 and (1 + level) / 2 quantiles of those means. Pairing by case
removes the case-to-case variance both methods share (a hard case is hard for both).

"A >= B" is claimed only where the interval's lower bound is >= 0 (`claim`). Deterministic
given `seed` (a CPU `torch.Generator`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0


@dataclass(frozen=True)
class Interval:
    """Mean paired difference (A - B, score fractions) and its bootstrap percentile interval."""

    mean: float
    low: float
    high: float
    cases: int

    def to_json(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "cases": self.cases}


def resample_indices(n: int, resamples: int = RESAMPLES, seed: int = SEED) -> torch.Tensor:
    """[resamples, n] case indices (int64) drawn with replacement (the draws `paired_interval` uses)."""
    return torch.randint(0, n, (resamples, n), generator=torch.Generator().manual_seed(seed))


def paired_interval(a, b, *, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED) -> Interval:
    """The paired bootstrap interval of mean(a - b).

    Args:
        a, b: [n] scores of two methods on the same n cases, in the same case order.
        resamples: bootstrap draws; level: coverage in (0, 1); seed: of the draws.

    Raises:
        ValueError: a and b differ in length, are empty, or level is outside (0, 1).
    """
    x, y = torch.tensor(list(a), dtype=torch.float64), torch.tensor(list(b), dtype=torch.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired scores must be two equal-length lists, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.numel() == 0:
        raise ValueError("no paired cases")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    d = x - y  # [n]
    means = d[resample_indices(d.numel(), resamples, seed)].mean(dim=1)  # [resamples]
    qs = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    low, high = torch.quantile(means, qs).tolist()  # linear interpolation between order statistics
    return Interval(float(d.mean()), low, high, int(d.numel()))


def claim(interval: Interval, tol: float = 1e-12) -> bool:
    """Whether the interval supports "A >= B": its lower bound is >= 0 (within `tol`)."""
    return interval.low >= -tol


def paired_intervals(
    rows: list[dict], versus: str, methods, budgets, metric: str = "score", cases=None, **kwargs
) -> dict:
    """{(other method, budget): Interval of `versus` - other}, paired by case (task, case id, length)
    over the cases both answered at that budget ("full" counts at every budget).

    Args:
        rows: results rows (`bench.suites.CaseResult` dicts); metric: the row field compared.
        cases: optional predicate on a row selecting the cases (e.g. held-out genres only).
        kwargs: `paired_interval`'s resamples, level, seed.
    """
    score: dict = {}
    for r in rows:
        if r.get(metric) is None or (cases is not None and not cases(r)):
            continue
        score[(r["task"], r["case_id"], r["length"], r["method"], r["budget"])] = r[metric]
    keys = sorted({k[:3] for k in score}, key=str)
    out = {}
    for m in methods:
        if m == versus:
            continue
        for b in budgets:
            pairs = [
                (score[(*c, versus, b)], score[(*c, m, None if m == "full" else b)])
                for c in keys
                if (*c, versus, b) in score and (*c, m, None if m == "full" else b) in score
            ]
            if pairs:
                mine, other = zip(*pairs)
                out[(m, b)] = paired_interval(mine, other, **kwargs)
    return out
