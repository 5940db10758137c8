"""Paired bootstrap intervals: against a slow pure-Python reference, known cases, and the pairing by case."""

from __future__ import annotations

import math
import random

import pytest

from cake_cli.bench.bootstrap import claim, paired_interval, paired_intervals, resample_indices


def reference_interval(a, b, resamples, level, seed):
    """The obvious loop: the same draws, each draw's mean difference, linear-interpolated quantiles."""
    draws = resample_indices(len(a), resamples, seed).tolist()
    diffs = [x - y for x, y in zip(a, b)]
    means = sorted(sum(diffs[i] for i in draw) / len(draw) for draw in draws)

    def quantile(q):
        pos = q * (len(means) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(means) - 1)
        return means[lo] + (means[hi] - means[lo]) * (pos - lo)

    return sum(diffs) / len(diffs), quantile((1 - level) / 2), quantile((1 + level) / 2)


@pytest.mark.parametrize("n, seed", [(1, 0), (5, 1), (37, 2), (200, 3)])
def test_matches_the_slow_reference(n, seed):
    rng = random.Random(seed)
    a = [rng.choice([0.0, 0.2, 1.0, rng.random()]) for _ in range(n)]
    b = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(n)]
    got = paired_interval(a, b, resamples=500, level=0.9, seed=seed)
    mean, low, high = reference_interval(a, b, 500, 0.9, seed)
    assert got.cases == n
    assert got.mean == pytest.approx(mean, abs=1e-12)
    assert got.low == pytest.approx(low, abs=1e-12) and got.high == pytest.approx(high, abs=1e-12)
    assert got.low <= got.mean + 1e-12 or n == 1


def test_known_cases():
    same = paired_interval([0.3, 1.0, 0.0, 0.5], [0.3, 1.0, 0.0, 0.5])
    assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0) and claim(same)
    shift = paired_interval([0.5, 0.7, 0.9], [0.25, 0.45, 0.65])
    assert shift.low == pytest.approx(0.25) and shift.high == pytest.approx(0.25)
    worse = paired_interval([0.0] * 10, [1.0] * 10)
    assert worse.high == pytest.approx(-1.0) and not claim(worse)
    assert paired_interval([1, 0], [0, 1], seed=5) == paired_interval([1, 0], [0, 1], seed=5)  # seeded


def test_the_interval_agrees_with_normal_theory_on_many_cases():
    rng = random.Random(7)
    d = [rng.gauss(0.1, 1.0) for _ in range(2000)]
    iv = paired_interval(d, [0.0] * len(d), resamples=2000)
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    half = 1.96 * sd / math.sqrt(len(d))
    assert iv.low == pytest.approx(mean - half, abs=0.2 * half)
    assert iv.high == pytest.approx(mean + half, abs=0.2 * half)


def test_bad_input():
    with pytest.raises(ValueError, match="equal-length"):
        paired_interval([1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="no paired cases"):
        paired_interval([], [])
    with pytest.raises(ValueError, match="level"):
        paired_interval([1.0], [0.0], level=1.0)


def row(i: int, method: str, budget, score: float) -> dict:
    case = {"task": "s-rt", "case_id": f"code/d50-n{i}", "length": 4096}
    return {**case, "method": method, "budget": budget, "score": score}


def test_rows_are_paired_by_case_not_by_order():
    rng = random.Random(0)
    rows, mine, other = [], [], []
    for i in range(12):
        a, b = rng.random(), rng.random()
        mine.append(a)
        other.append(b)
        rows.append(
            {"task": "s-rt", "case_id": f"code/d50-n{i}", "length": 4096, "method": "cake", "budget": 128, "score": a}
        )
        rows.append(
            {"task": "s-rt", "case_id": f"code/d50-n{i}", "length": 4096, "method": "snapkv", "budget": 128, "score": b}
        )
        rows.append(
            {
                "task": "s-rt",
                "case_id": f"code/d50-n{i}",
                "length": 4096,
                "method": "full",
                "budget": None,
                "score": 1.0,
            }
        )
    rows.append(
        {"task": "s-rt", "case_id": "code/d50-n99", "length": 4096, "method": "cake", "budget": 128, "score": 1.0}
    )
    rng.shuffle(rows)
    got = paired_intervals(rows, "cake", ["full", "snapkv", "cake"], [128], resamples=300)
    order = sorted(range(12), key=lambda i: str(("s-rt", f"code/d50-n{i}", 4096)))  # the case order it pairs in
    want = paired_interval([mine[i] for i in order], [other[i] for i in order], resamples=300)
    assert got[("snapkv", 128)] == want  # the unpaired case (n99) is left out
    assert got[("full", 128)].cases == 12 and got[("full", 128)].high <= 0.0
    only = paired_intervals(rows, "cake", ["snapkv"], [128], cases=lambda r: r["case_id"].endswith(("n1", "n2")))
    assert only[("snapkv", 128)].cases == 2
