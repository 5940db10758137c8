"""Baseline indicators and allocations on small hand-checkable inputs (docs/method.md §Baselines)."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import torch

from cake_cli.engine.allocation import ALLOCATIONS, PYRAMID_BETA, pyramid, pyramid_weights, uniform
from cake_cli.engine.indicators import INDICATORS, smooth, token_scores, top_k_sorted
from cake_cli.engine.methods import METHODS, label, resolve

# one query head, one KV head, a 3-row window over 5 candidate tokens
A = torch.tensor([[[0.10, 0.20, 0.30, 0.15, 0.25], [0.40, 0.10, 0.20, 0.20, 0.10], [0.05, 0.60, 0.05, 0.20, 0.10]]])
POS = torch.arange(5).unsqueeze(0)


def scores(kind, a=A, pos=POS, kv=1, pool=("avg", 1)):
    return token_scores(kind, a, pos, kv, gamma=200.0, pool=pool)


def test_h2o_reads_the_accumulated_attention_not_the_window_rows():
    # accumulated over every query (tests/engine/test_h2o.py checks the sums); the window rows are ignored
    acc = torch.tensor([[2.0, 0.5, 1.0, 0.25, 1.25]])
    got = token_scores("h2o", A, POS, 1, gamma=200.0, pool=("max", 7), accumulated=acc)
    assert torch.equal(got, acc)
    with pytest.raises(ValueError, match="accumulated attention of every query"):
        scores("h2o")


def test_tova_uses_the_last_query_only():
    torch.testing.assert_close(scores("tova"), torch.tensor([[0.05, 0.60, 0.05, 0.20, 0.10]]))


def test_snapkv_means_then_max_pools_kernel_7():
    # mean over rows = [0.1833, 0.3, 0.1833, 0.1833, 0.15]; a kernel of 7 covers all 5 tokens
    torch.testing.assert_close(scores("snapkv"), torch.full((1, 5), 0.3))


def test_cake_indicator_is_mean_plus_gamma_var_then_avg_pool():
    mean = A[0].mean(dim=0)
    var = A[0].var(dim=0, correction=1)
    torch.testing.assert_close(scores("cake"), (mean + 200.0 * var).unsqueeze(0))
    pooled = scores("cake", pool=("avg", 3))[0]
    raw = mean + 200.0 * var
    torch.testing.assert_close(pooled[0], (raw[0] + raw[1]) / 3)  # zero padding counted, as torch's default
    torch.testing.assert_close(pooled[2], raw[1:4].mean())


def test_streaming_keeps_sinks_and_the_most_recent():
    pos = torch.arange(10).unsqueeze(0)
    s = token_scores("streaming", torch.zeros(1, 1, 10), pos, 1, gamma=0.0, pool=("avg", 1))
    assert top_k_sorted(s, 6).tolist() == [[0, 1, 2, 3, 8, 9]]


def test_gqa_averages_each_kv_heads_query_heads():
    a = torch.stack([A[0], 2 * A[0], A[0], A[0]])  # 4 query heads, 2 KV heads (g = 2)
    s = token_scores("tova", a, POS.expand(2, 5), 2, gamma=0.0, pool=("avg", 1))
    torch.testing.assert_close(s[0], 1.5 * A[0, -1])
    torch.testing.assert_close(s[1], A[0, -1])


def test_pyramid_is_linear_decreasing_and_sums_to_the_total():
    w = pyramid_weights(5, beta=20)
    assert w[0] == pytest.approx(2 - 1 / 20) and w[-1] == pytest.approx(1 / 20)
    assert all(x > y for x, y in zip(w, w[1:]))
    assert sum(w) == pytest.approx(5)
    budgets = pyramid(5, 500, 1000, 32)
    assert sum(budgets) == 500 and budgets[0] == 195 and budgets[-1] == 5
    assert budgets == sorted(budgets, reverse=True)


def pyramidkv_code(n: int, budget: int, window: int, layers: int) -> list[int]:
    """Evictable tokens per layer as PyramidKV's code computes them (`PyramidKVCluster.update_kv`, with
    max_capacity_prompt = B): integer end points and step (floored), the top clipped to n - w,
    the SnapKV branch (every layer B - w) when n < 2 (B - w)."""
    c = budget - window
    if n < 2 * c:
        return [c] * layers
    low = c // PYRAMID_BETA
    high = 2 * c - low
    if high >= n - window:
        high = n - window
        low = 2 * c - high
    step = (high - low) // (layers - 1)
    return [high - layer * step for layer in range(layers)]


def pyramid_exact(n: int, budget: int, window: int, layers: int) -> list[Fraction]:
    """The same schedule in exact arithmetic (no flooring): what `pyramid` rounds."""
    c = Fraction(budget - window)
    if n < 2 * c:
        return [c] * layers
    low = c / PYRAMID_BETA
    high = 2 * c - low
    if high >= n - window:
        high = Fraction(n - window)
        low = 2 * c - high
    step = (high - low) / (layers - 1)
    return [high - layer * step for layer in range(layers)]


def test_pyramid_follows_pyramidkvs_schedule():
    # the real model's cases of benchmarks/runs/kvpress-parity-2026-12-05.txt (24 layers, w = 32, n = 1042)
    real = pyramid(24, 24 * 96, 1010, 32)  # B = 128: kept 219 ... 37 with the window
    assert (real[0], real[-1], sum(real)) == (187, 5, 24 * 96)
    assert pyramid(24, 24 * 736, 1010, 32) == [736] * 24  # n < 2 (B - w): the code's SnapKV branch
    assert pyramidkv_code(1042, 768, 32, 24) == [736] * 24
    rng = random.Random(0)
    for _ in range(2000):
        layers, window = rng.randint(2, 40), rng.randint(1, 64)
        budget = rng.randint(window + 1, 4096)
        n = rng.randint(budget + 1, 40000)
        cap, total = n - window, (budget - window) * layers
        ours = pyramid(layers, total, cap, window)
        exact = pyramid_exact(n, budget, window, layers)
        code = pyramidkv_code(n, budget, window, layers)
        assert sum(ours) == total and all(0 <= b <= cap for b in ours)
        assert ours == sorted(ours, reverse=True)
        assert all(abs(b - x) < 1 for b, x in zip(ours, exact)), (layers, window, budget, n)
        # the code floors its low end and step: each layer at most 1 + l tokens off, never the other regime
        assert all(abs(b - x) <= 1 + layer for layer, (b, x) in enumerate(zip(ours, code))), (layers, window, budget, n)
        if n < 2 * (budget - window):  # the SnapKV branch: every layer B - w, as the code
            assert ours == code


def test_uniform_is_equal_and_capped():
    assert uniform(4, 100, 1000) == [25, 25, 25, 25]
    assert uniform(4, 100, 10) == [10, 10, 10, 10]


def test_method_table_pairs():
    assert METHODS["cake"] == ("cake", "cake")
    assert METHODS["pyramidkv"] == ("pyramid", "snapkv")
    assert METHODS["full"] is None


def test_method_rows_name_registered_allocations_and_indicators():
    for pair in METHODS.values():
        if pair is not None:
            assert pair[0] in ALLOCATIONS and pair[1] in INDICATORS
    assert resolve("snapkv", allocation="cake") == ("cake", "snapkv")
    assert resolve("full", indicator="h2o") is None


@pytest.mark.parametrize(
    "method, allocation, indicator, expected",
    [
        ("cake", None, None, "cake"),
        ("cake+h2o", None, "tova", "cake+tova"),  # the issue: the override wins, and the label says so
        ("snapkv", "pyramid", None, "pyramidkv"),  # a pairing with a name of its own gets that name
        ("h2o", None, "snapkv", "snapkv"),
        ("uniform+cake", None, None, "uniform+cake"),
    ],
)
def test_label_names_what_runs(method, allocation, indicator, expected):
    assert label(*resolve(method, allocation, indicator)) == expected


def _pool_window_by_window(x, kind, kernel):
    """Oracle for `smooth`: each token's window read on its own, padding outside [0, m) (0 for avg, none
    for max), the avg window summed left to right in float32 (the order `avg_pool1d` and a running sum
    of shifted rows both use)."""
    half, m = kernel // 2, x.shape[-1]
    out = torch.empty_like(x)
    for i in range(m):
        lo, hi = i - half, i + half + 1
        window = x[:, max(lo, 0) : min(hi, m)]
        if kind == "max":
            out[:, i] = window.amax(dim=-1)
        else:
            total = torch.zeros(x.shape[0]) if lo < 0 else window[:, 0].clone()
            for j in range(0 if lo < 0 else 1, window.shape[-1]):
                total += window[:, j]
            out[:, i] = total / kernel
    return out


@pytest.mark.parametrize("kind,kernel", [("avg", 5), ("avg", 3)] + [("max", k) for k in (1, 3, 5, 7, 9, 15, 17)])
def test_smooth_equals_window_by_window_pooling_bit_for_bit(kind, kernel):
    torch.manual_seed(kernel)
    pool = torch.nn.functional.avg_pool1d if kind == "avg" else torch.nn.functional.max_pool1d
    for heads, m in [(1, 1), (3, 4), (2, 9), (8, 257), (4, 700)]:
        x = torch.rand(heads, m) ** 8  # attention-like: many small values
        if kind == "max":  # masked tokens (-inf, as the batched decode step pools them) and ties
            x[:, ::5] = float("-inf")
            x[:, 1::7] = 0.5
        got = smooth(x, kind, kernel)
        assert torch.equal(got, _pool_window_by_window(x, kind, kernel))
        torch_pool = pool(x.unsqueeze(1), kernel_size=kernel, stride=1, padding=kernel // 2).squeeze(1)
        assert torch.equal(got, torch_pool)
