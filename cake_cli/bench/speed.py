"""`cake bench speed`: prefill time, decode speed, KV memory and eviction overhead, side by side.

Every method runs on the same real prompt (the Python language reference shipped with CPython)
cut to each context length, in one process, repeated; the median of the repeats is reported
with ratios against the full cache of the same length, plus the decode "limit": the full cache
with a prompt only as long as the budget (what decoding at that cache size cannot beat).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from cake_cli.bench.memory import PeakRss
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import generate
from cake_cli.engine.methods import with_method


@dataclass(frozen=True)
class SpeedRow:
    """Median measurements of one (context length, method). Bytes measured, times in seconds."""

    length: int  # prompt tokens
    method: str  # a METHODS name, "cake-grow" (cake with the grow decode policy) or "limit"
    budget: int | None  # tokens per layer (None: full cache)
    prefill_seconds: float
    decode_tokens_per_second: float
    kv_bytes_kept: int  # after prefill
    kv_peak_prefill: int  # largest total during prefill
    kv_bytes_full: int  # the full cache of this prompt
    rss_peak_delta: int  # peak process memory during the run minus before, bytes
    eviction_seconds: float  # scoring + eviction, prefill and decode
    repeats: int


def config_for(method: str, base: CakeConfig) -> CakeConfig | None:
    """The engine config of a speed-bench method name."""
    if method == "cake-grow":
        return replace(with_method(base, "cake"), decode_policy="grow")
    return with_method(base, method)


def measure(model, ids: torch.Tensor, config: CakeConfig | None, new_tokens: int) -> dict:
    """One run: prefill + `new_tokens` greedy tokens (no EOS stop)."""
    with PeakRss() as rss:
        r = generate(model, ids, config, max_new_tokens=new_tokens, collect_stats=False)
    return {
        "prefill_seconds": r.prefill_seconds,
        "decode_tokens_per_second": r.decode_tokens_per_second,
        "kv_bytes_kept": r.kv_bytes_kept,
        "kv_peak_prefill": r.kv_peak_prefill,
        "kv_bytes_full": r.kv_bytes_full,
        "rss_peak_delta": max(rss.peak - rss.start, 0),
        "eviction_seconds": r.eviction_seconds,
    }


def median_row(length: int, method: str, budget: int | None, runs: list[dict]) -> SpeedRow:
    """Median of each measurement over the repeats."""
    med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    ints = ("kv_bytes_kept", "kv_peak_prefill", "kv_bytes_full", "rss_peak_delta")
    return SpeedRow(
        length=length,
        method=method,
        budget=budget,
        repeats=len(runs),
        **{k: int(v) if k in ints else float(v) for k, v in med.items()},
    )


def run_speed(
    model,
    token_ids: list[int],
    base: CakeConfig,
    *,
    lengths: list[int],
    methods: list[str],
    new_tokens: int = 32,
    repeats: int = 3,
    on_case: Callable[[str], None] | None = None,
) -> list[SpeedRow]:
    """Measure every (length, method) plus the decode limit at the budget.

    Args:
        model: a causal LM switched to a CAKE attention function.
        token_ids: a long real prompt; each length uses its first `length` tokens.
        base: CAKE settings (budget, window, taus) shared by the evicting methods.
        lengths: prompt lengths in tokens (each <= len(token_ids)).
        methods: names from `bench.suites.SPEED_METHODS`.
        new_tokens: tokens generated per run (decode speed is over new_tokens - 1 steps).
        repeats: runs per case; the median is reported.
        on_case: progress callback, called before each run with a short label.

    Returns:
        One SpeedRow per (length, method), then one "limit" row (full cache, prompt = budget).

    Raises:
        ValueError: a length longer than the prompt, or an unknown method.
    """
    if max(lengths) > len(token_ids):
        raise ValueError(f"the prompt has {len(token_ids)} tokens, fewer than the longest length {max(lengths)}")
    device = model.get_input_embeddings().weight.device
    warm = torch.tensor([token_ids[: min(256, len(token_ids))]], device=device)
    generate(model, warm, config_for("cake", base), max_new_tokens=4)  # warm-up, not measured
    cases = [(n, m) for n in lengths for m in methods] + [(base.budget, "limit")]
    rows = []
    for n, method in cases:
        ids = torch.tensor([token_ids[:n]], device=device)
        config = None if method == "limit" else config_for(method, base)
        runs = []
        for r in range(repeats):
            if on_case:
                on_case(f"{method} @ {n} tokens, run {r + 1}/{repeats}")
            runs.append(measure(model, ids, config, new_tokens))
        rows.append(median_row(n, method, None if config is None else base.budget, runs))
    return rows


def ratios(rows: list[SpeedRow]) -> list[dict]:
    """Each row as a dict with ratios against the full cache of the same length (and the limit)."""
    full = {row.length: row for row in rows if row.method == "full"}
    limit = next((row for row in rows if row.method == "limit"), None)
    snap = {row.length: row for row in rows if row.method == "snapkv"}
    grow = {row.length: row for row in rows if row.method == "cake-grow"}
    out = []
    for row in rows:
        d = asdict(row)
        f = full.get(row.length)
        if f is not None and row.method != "limit":
            d["prefill_vs_full"] = row.prefill_seconds / f.prefill_seconds
            d["decode_vs_full"] = row.decode_tokens_per_second / f.decode_tokens_per_second
            d["kv_kept_vs_full"] = row.kv_bytes_kept / f.kv_bytes_kept
            d["kv_peak_vs_full"] = row.kv_peak_prefill / f.kv_peak_prefill
        if limit is not None and row.method not in ("limit", "full"):
            d["decode_vs_limit"] = row.decode_tokens_per_second / limit.decode_tokens_per_second
        s = snap.get(row.length)
        if s is not None and row.method in ("cake", "pyramidkv", "cake-grow"):
            d["prefill_vs_snapkv"] = row.prefill_seconds / s.prefill_seconds
            d["kv_peak_vs_snapkv"] = row.kv_peak_prefill / s.kv_peak_prefill
        g = grow.get(row.length)
        if g is not None and row.method == "cake":
            d["decode_seconds_per_token_vs_grow"] = g.decode_tokens_per_second / row.decode_tokens_per_second
        out.append(d)
    return out
