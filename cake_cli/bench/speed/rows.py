"""`cake bench speed`, engine rows: prefill time, time to first token, decode speed, KV memory and
eviction overhead of each method, side by side in one process.

Every method runs on the same real prompt (the Python language reference shipped with CPython)
cut to each context length, with the same thread policy the CLI uses (`tasks.threads`), repeated;
the median of the repeats is reported. The decode "limit" row is the full cache with a prompt only
as long as the budget: what decoding at that cache size cannot beat.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from cake_cli.bench.memory import PeakRss
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import decode, prefill
from cake_cli.engine.methods import with_method
from cake_cli.tasks.threads import Threads, decode_following_load
from cake_cli.tasks.threads import using as threads_using


@dataclass(frozen=True)
class SpeedRow:
    """Median measurements of one case. Bytes measured from the cache tensors, times in seconds.

    `group` names what the row is compared within: rows with the same group and length share a
    full-cache row (ratios), e.g. "qwen2.5-coder-0.5b · bfloat16 · engine".
    """

    group: str
    length: int  # prompt tokens
    method: str  # a METHODS name, "cake-grow", "limit" or "kvpress-snapkv"
    budget: int | None  # tokens per layer (None: full cache)
    prefill_seconds: float
    ttft_seconds: float  # prefill + choosing the first token (the CLI path: + building the prompt)
    decode_tokens_per_second: float
    decode_steps: int
    kv_bytes_kept: int  # after prefill
    kv_peak_prefill: int  # largest total during prefill
    kv_bytes_full: int  # the full cache of this prompt
    rss_peak_delta: int  # peak process memory during the run minus before, bytes
    eviction_seconds: float  # scoring + eviction, prefill and decode
    sampling_seconds: float  # choosing tokens, n-gram blocking included
    decode_seconds: float
    threads: str  # "prefill/decode"
    repeats: int


def config_for(method: str, base: CakeConfig) -> CakeConfig | None:
    """The engine config of a speed-bench method name ("cake-grow": CAKE with the grow policy)."""
    if method == "cake-grow":
        return replace(with_method(base, "cake"), decode_policy="grow")
    return with_method(base, method)


def measure(model, ids: torch.Tensor, config: CakeConfig | None, new_tokens: int, threads: Threads) -> dict:
    """One run: prefill on `threads.prefill` threads, then `new_tokens` greedy tokens on `threads.decode`."""
    with PeakRss() as rss:
        with threads_using(threads.prefill):
            state = prefill(model, ids, config, collect_stats=False)
        r = decode_following_load(threads, decode, model, ids, state, config, max_new_tokens=new_tokens)
    first = r.sampling_seconds / max(len(r.token_ids), 1)  # choosing one token
    return {
        "prefill_seconds": r.prefill_seconds,
        "ttft_seconds": r.prefill_seconds + first,
        "decode_tokens_per_second": r.decode_tokens_per_second,
        "decode_steps": r.decode_steps,
        "kv_bytes_kept": r.kv_bytes_kept,
        "kv_peak_prefill": r.kv_peak_prefill,
        "kv_bytes_full": r.kv_bytes_full,
        "rss_peak_delta": max(rss.peak - rss.start, 0),
        "eviction_seconds": r.eviction_seconds,
        "sampling_seconds": r.sampling_seconds,
        "decode_seconds": r.decode_seconds,
    }


INT_FIELDS = ("decode_steps", "kv_bytes_kept", "kv_peak_prefill", "kv_bytes_full", "rss_peak_delta")


def median_row(group: str, length: int, method: str, budget: int | None, runs: list[dict], threads: str) -> SpeedRow:
    """Median of each measurement over the repeats."""
    med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    values = {k: int(v) if k in INT_FIELDS else float(v) for k, v in med.items()}
    return SpeedRow(
        group=group, length=length, method=method, budget=budget, threads=threads, repeats=len(runs), **values
    )


def run_speed(
    model,
    token_ids: list[int],
    base: CakeConfig,
    *,
    group: str,
    lengths: list[int],
    methods: list[str],
    threads: Threads,
    new_tokens: int = 32,
    repeats: int = 3,
    on_case: Callable[[str], None] | None = None,
) -> list[SpeedRow]:
    """Measure every (length, method) plus the decode limit at the budget.

    Args:
        model: a causal LM switched to a CAKE attention function.
        token_ids: a long real prompt; each length uses its first `length` tokens.
        base: CAKE settings (budget, window, taus) shared by the evicting methods.
        group: the rows' group label (model · dtype · path).
        lengths: prompt lengths in tokens (each <= len(token_ids)).
        methods: names from `bench.suites.SPEED_METHODS`.
        threads: prefill / decode thread counts (`tasks.threads.choose`).
        new_tokens: tokens generated per run (decode speed is over new_tokens - 1 steps).
        repeats: runs per case; the median is reported.
        on_case: progress callback, called before each run with a short label.

    Returns:
        One SpeedRow per (length, method), then one "limit" row (full cache, prompt = budget).

    Raises:
        ValueError: a length longer than the prompt.
    """
    if max(lengths) > len(token_ids):
        raise ValueError(f"the prompt has {len(token_ids)} tokens, fewer than the longest length {max(lengths)}")
    device = model.get_input_embeddings().weight.device
    warm = torch.tensor([token_ids[: min(256, len(token_ids))]], device=device)
    measure(model, warm, config_for("cake", base), 4, threads)  # warm-up, not measured
    cases = [(n, m) for n in lengths for m in methods] + [(base.budget, "limit")]
    label = f"{threads.prefill}/{threads.decode}"
    rows = []
    for n, method in cases:
        ids = torch.tensor([token_ids[:n]], device=device)
        config = None if method == "limit" else config_for(method, base)
        runs = []
        for r in range(repeats):
            if on_case:
                on_case(f"{group}: {method} @ {n} tokens, run {r + 1}/{repeats}")
            runs.append(measure(model, ids, config, new_tokens, threads))
        rows.append(median_row(group, n, method, None if config is None else base.budget, runs, label))
    return rows
