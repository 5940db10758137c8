"""`cake bench speed`, engine rows: prefill time, time to first token, decode speed, KV memory and
eviction overhead of each method, side by side in one process.

Every method runs on the same real prompt (the Python language reference shipped with CPython)
cut to each context length, with the same thread policy the CLI uses (`tasks.threads`), after one
unmeasured warm-up run, `repeats` times, in rounds: each round prefills every case, then decodes
them all one token of each in turn (`decode_interleaved`), so a slower spell of a shared machine
slows the cases of that round alike, down to a single decode step. A row holds the median of the repeats
and every repeat's timings (`SpeedRow.samples`), so a comparison can show its spread (`Spread`);
two rows of the same rounds are compared round by round (`ratio_spread`). Another engine (llama.cpp,
a `RoundEngine`) can run one timed repeat of its own at the end of each round, so its row pairs with
ours round by round too. The decode "limit" row is the full cache with a prompt only as long as the
budget: what decoding at that cache size cannot beat.
"""

from __future__ import annotations

import copy
import statistics
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from cake_cli.bench.memory import PeakRss
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import Decoding, GenerationResult, prefill
from cake_cli.engine.methods import with_method
from cake_cli.errors import CakeError
from cake_cli.tasks.threads import Threads, decoding
from cake_cli.tasks.threads import using as threads_using

TIMED = (
    "prefill_seconds",
    "ttft_seconds",
    "decode_tokens_per_second",
    "eviction_seconds",
    "sampling_seconds",
    "decode_seconds",
)  # the measurements that vary from run to run; `SpeedRow.samples` keeps each repeat's


@dataclass(frozen=True)
class SpeedRow:
    """Median measurements of one case. Bytes measured from the cache tensors, times in seconds.

    `group` names what the row is compared within: rows with the same group and length share a
    full-cache row (ratios), e.g. "qwen2.5-coder-0.5b · bfloat16 · engine". `samples` holds, for
    each TIMED field, its value in every repeat (run order); the field itself is their median.
    `rounds` is shared by the rows one `run_speed` call measured round by round (sample i of each
    from round i), "" for a row measured on its own (another engine's).
    """

    group: str
    length: int  # prompt tokens
    method: str  # a METHODS name, "cake-grow", "limit", "kvpress-snapkv", "llama.cpp" or `OPENVINO_METHODS`
    budget: int | None  # tokens per layer (None: full cache)
    prefill_seconds: float
    ttft_seconds: float  # prefill + choosing the first token (the CLI path: + building the prompt)
    decode_tokens_per_second: float
    decode_steps: int
    kv_bytes_kept: int  # after prefill
    kv_peak_prefill: int  # largest total during prefill
    kv_bytes_full: int  # the full cache of this prompt
    rss_peak_delta: int  # peak process memory during the prefill minus before, bytes (decoding adds a token a step)
    eviction_seconds: float  # scoring + eviction, prefill and decode
    sampling_seconds: float  # choosing tokens, n-gram blocking included
    decode_seconds: float
    threads: str  # "prefill/decode"
    repeats: int
    samples: dict[str, tuple[float, ...]] = field(default_factory=dict)  # TIMED field -> one value per repeat
    rounds: str = ""


@dataclass(frozen=True)
class Spread:
    """A comparison over the repeats: the median (the verdict's value), the min and max it can take
    across the repeats' runs, and how many repeats stand behind it (the fewer of the two rows')."""

    median: float
    low: float
    high: float
    repeats: int

    def covers(self, target: float) -> bool:
        """Whether `target` lies within [low, high]: the repeats cannot tell the two sides apart."""
        return self.low <= target <= self.high


def _values(row: dict, key: str) -> list[float]:
    """Every repeat's value of `key` in a row dict (its median alone when it kept no samples)."""
    return list(row.get("samples", {}).get(key) or [row[key]])


TINY = 1e-12  # guards a ratio against a zero denominator


def ratio_spread(a: dict, b: dict, key: str) -> Spread:
    """a[key] / b[key] for two rows of one set of rounds (`SpeedRow.rounds`, the same number of
    samples of `key`): the median, min and max of the ratio within each round, so a slowdown both
    rows shared cancels out; for rows measured apart (or one sample each), `cross_ratio`."""
    xa, xb = _values(a, key), _values(b, key)
    if not (a.get("rounds") and a.get("rounds") == b.get("rounds") and len(xa) == len(xb) > 1):
        return cross_ratio(a, b, key)
    per_round = [p / max(q, TINY) for p, q in zip(xa, xb)]
    return Spread(statistics.median(per_round), min(per_round), max(per_round), len(per_round))


def cross_ratio(a: dict, b: dict, key: str) -> Spread:
    """a[key] / b[key] for two rows measured in separate runs: the median is the ratio of the
    medians; low and high pair a's smallest with b's largest value and the reverse (any pairing of
    their repeats lies between)."""
    xa, xb = _values(a, key), _values(b, key)
    return Spread(
        a[key] / max(b[key], TINY),
        min(xa) / max(max(xb), TINY),
        max(xa) / max(min(xb), TINY),
        min(len(xa), len(xb)),
    )


def share(row: dict, part: str, whole: str) -> Spread:
    """row[part] / row[whole] within each repeat (both timed in the same run): median, min, max."""
    shares = [p / w for p, w in zip(_values(row, part), _values(row, whole)) if w > 0] or [0.0]
    return Spread(statistics.median(shares), min(shares), max(shares), len(shares))


def config_for(method: str, base: CakeConfig) -> CakeConfig | None:
    """The engine config of a speed-bench method name ("cake-grow": CAKE with the grow policy)."""
    if method == "cake-grow":
        return replace(with_method(base, "cake"), decode_policy="grow")
    return with_method(base, method)


def prefill_case(model, ids: torch.Tensor, config: CakeConfig | None, threads: Threads, prefilled=None) -> tuple:
    """(prefilled state, peak process memory of the prefill minus before, bytes): a prefill on
    `threads.prefill` threads, or with `prefilled` (a `generate.Prefilled` of the same ids and config)
    a copy of it (`--prefill-once`: decoding changes the cache, each repeat starts from the same one)."""
    with PeakRss() as rss:
        if prefilled is None:
            with threads_using(threads.prefill):
                state = prefill(model, ids, config, collect_stats=False)
        else:
            state = copy.deepcopy(prefilled)
    return state, max(rss.peak - rss.start, 0)


def decode_interleaved(model, cases: list[tuple], new_tokens: int, threads: Threads) -> list[GenerationResult]:
    """Greedy-decode `new_tokens` for every (ids [1, n], prefilled state, config) of `cases`, one token
    of each in turn (the first case to step moves by one each turn), on `threads.decode` threads with
    the CLI's governor stepped once a turn: a slow spell of a shared machine slows every case alike,
    so their ratios within one call hold where run-to-run drift does not. Returns their results, in order."""
    with decoding(threads) as governor:
        runs = [Decoding(model, ids, state, config, max_new_tokens=new_tokens) for ids, state, config in cases]
        active, turn = list(runs), 0
        while active:
            k = turn % len(active)
            stepped = {id(d) for d in active[k:] + active[:k] if d.step()}
            active = [d for d in active if id(d) in stepped]
            governor.step()
            turn += 1
    return [d.result() for d in runs]


def measurements(r: GenerationResult, rss_delta: int) -> dict:
    """The dict of one run that `median_row` reads, from its result and its prefill's memory."""
    first = r.sampling_seconds / max(len(r.token_ids), 1)  # choosing one token
    return {
        "prefill_seconds": r.prefill_seconds,
        "ttft_seconds": r.prefill_seconds + first,
        "decode_tokens_per_second": r.decode_tokens_per_second,
        "decode_steps": r.decode_steps,
        "kv_bytes_kept": r.kv_bytes_kept,
        "kv_peak_prefill": r.kv_peak_prefill,
        "kv_bytes_full": r.kv_bytes_full,
        "rss_peak_delta": rss_delta,
        "eviction_seconds": r.eviction_seconds,
        "sampling_seconds": r.sampling_seconds,
        "decode_seconds": r.decode_seconds,
    }


def measure(
    model, ids: torch.Tensor, config: CakeConfig | None, new_tokens: int, threads: Threads, prefilled=None
) -> dict:
    """One run alone: `prefill_case`, then `new_tokens` greedy tokens on `threads.decode`."""
    state, rss_delta = prefill_case(model, ids, config, threads, prefilled)
    (r,) = decode_interleaved(model, [(ids, state, config)], new_tokens, threads)
    return measurements(r, rss_delta)


OPENVINO_METHODS = ("openvino-full", "openvino-evict")  # `speed.openvino`'s rows: its full cache, its eviction at B
WARMUP_TOKENS = 256  # prompt tokens of the unmeasured warm-up run before a block of timed runs
WARMUP_NEW_TOKENS = 4  # tokens it generates
INT_FIELDS = ("decode_steps", "kv_bytes_kept", "kv_peak_prefill", "kv_bytes_full", "rss_peak_delta")


def median_row(
    group: str, length: int, method: str, budget: int | None, runs: list[dict], threads: str, rounds: str = ""
) -> SpeedRow:
    """Median of each measurement over the repeats `runs` (dicts of `measure`'s keys), with every
    repeat's TIMED values kept as `samples`; `rounds`: see `SpeedRow`."""
    med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    values = {k: int(v) if k in INT_FIELDS else float(v) for k, v in med.items()}
    samples = {key: tuple(float(run[key]) for run in runs) for key in TIMED if key in runs[0]}
    return SpeedRow(
        group=group,
        length=length,
        method=method,
        budget=budget,
        threads=threads,
        repeats=len(runs),
        samples=samples,
        rounds=rounds,
        **values,
    )


def one_prefill(row: SpeedRow) -> SpeedRow:
    """A row whose repeats decoded from one timed prefill: its prefill (and TTFT) samples are that one
    run, so comparisons of them count a single repeat."""
    samples = dict(row.samples)
    for key in ("prefill_seconds", "ttft_seconds"):
        samples[key] = samples[key][:1]
    return replace(row, samples=samples)


class RoundEngine(Protocol):
    """Another engine `run_speed` times in its rounds (llama.cpp: `speed.llama.LlamaEngine`): after our
    cases' decoding, one timed repeat of its own at every length, so a slow spell of the machine that
    spans a round slows both engines' samples of that round."""

    method: str  # its rows' method name
    group: str  # its rows' group

    def measure(self, length: int) -> dict:
        """One timed repeat on the first `length` prompt tokens: a dict of `measure`'s keys.

        Raises:
            CakeError: the engine failed (its rows are left out).
        """
        ...


def _time_others(other_runs: dict, failed: set, label: str, on_case, warn) -> None:
    """One timed repeat of each other engine at each length (`RoundEngine`), appended to `other_runs`
    [(engine, length)]; an engine that raises a CakeError joins `failed` (one line to `warn`)."""
    for other, n in other_runs:
        if other in failed:
            continue
        if on_case:
            on_case(f"{other.group}: {other.method} @ {n} tokens, {label}")
        try:
            other_runs[(other, n)].append(other.measure(n))
        except CakeError as exc:  # that engine's rows are dropped, ours kept
            failed.add(other)
            if warn:
                warn(f"{other.method}: {str(exc).splitlines()[0]}; its rows are left out")


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
    prefill_once: bool = False,
    others: Sequence[RoundEngine] = (),
    warn: Callable[[str], None] | None = None,
) -> list[SpeedRow]:
    """Measure every (length, method) plus the decode limit at the budget, and each of `others` at
    every length in the same rounds.

    Args:
        model: a causal LM switched to a CAKE attention function.
        token_ids: a long real prompt; each length uses its first `length` tokens.
        base: CAKE settings (budget, window, taus) shared by the evicting methods.
        group: the rows' group label (model · dtype · path).
        lengths: prompt lengths in tokens (each <= len(token_ids)).
        methods: names from `bench.suites.SPEED_METHODS`.
        threads: prefill / decode thread counts (`tasks.threads.choose`).
        new_tokens: tokens generated per run (decode speed is over new_tokens - 1 steps).
        repeats: rounds of timed runs after one unmeasured warm-up run of this call; each round
            prefills every case, then decodes them all token by token in turn (`decode_interleaved`);
            the median is reported, every repeat kept in `SpeedRow.samples`.
        on_case: progress callback, called before each run with a short label.
        prefill_once: time one prefill per case and decode `repeats` times from copies of its state
            (long contexts, where a prefill takes minutes): the row's prefill has one sample, so no
            prefill verdict can be drawn from it (`Spread.repeats`). Every case's prefilled state is
            held until the last round (the full cache of the longest length included).
        others: engines timed at the end of every round (`RoundEngine`), already prepared with the
            same lengths and `prefill_once`; their rows share this call's rounds. One that raises a
            CakeError is dropped (no rows), with one line to `warn`.

    Returns:
        One SpeedRow per (length, method), then one "limit" row (full cache, prompt = budget), then
        one row per other engine and length.

    Raises:
        ValueError: a length longer than the prompt.
    """
    if max(lengths) > len(token_ids):
        raise ValueError(f"the prompt has {len(token_ids)} tokens, fewer than the longest length {max(lengths)}")
    device = model.get_input_embeddings().weight.device
    warm = torch.tensor([token_ids[: min(WARMUP_TOKENS, len(token_ids))]], device=device)
    measure(model, warm, config_for("cake", base), WARMUP_NEW_TOKENS, threads)  # warm-up, not measured
    cases = [(n, m) for n in lengths for m in methods] + [(base.budget, "limit")]
    label, rounds = f"{threads.prefill}/{threads.decode}", uuid.uuid4().hex[:12]
    ids = {n: torch.tensor([token_ids[:n]], device=device) for n, _ in cases}
    configs = {case: None if case[1] == "limit" else config_for(case[1], base) for case in cases}
    states = {}  # (length, method) -> its one prefilled state, with `prefill_once`
    if prefill_once:
        for n, method in cases:
            if on_case:
                on_case(f"{group}: {method} @ {n} tokens, prefill")
            with threads_using(threads.prefill):
                states[(n, method)] = prefill(model, ids[n], configs[(n, method)], collect_stats=False)
    runs: dict[tuple[int, str], list[dict]] = {case: [] for case in cases}
    other_runs: dict[tuple[RoundEngine, int], list[dict]] = {(other, n): [] for other in others for n in lengths}
    failed: set = set()  # other engines that raised: no rows
    for r in range(repeats):
        prefilled = {}
        for n, method in cases:
            if on_case:
                on_case(f"{group}: {method} @ {n} tokens, run {r + 1}/{repeats}")
            prefilled[(n, method)] = prefill_case(model, ids[n], configs[(n, method)], threads, states.get((n, method)))
        if on_case:
            on_case(f"{group}: decoding {len(cases)} cases in turn, run {r + 1}/{repeats}")
        decoded = decode_interleaved(
            model, [(ids[n], prefilled[(n, m)][0], configs[(n, m)]) for n, m in cases], new_tokens, threads
        )
        for case, result in zip(cases, decoded):
            runs[case].append(measurements(result, prefilled[case][1]))
        del prefilled, decoded  # the next round's prefills start without this round's caches
        _time_others(other_runs, failed, f"run {r + 1}/{repeats}", on_case, warn)
    rows = []
    for (n, method), case_runs in runs.items():
        budget = None if configs[(n, method)] is None else base.budget
        rows.append(median_row(group, n, method, budget, case_runs, label, rounds))
    for (other, n), case_runs in other_runs.items():  # full cache, in the engine's own KV layout
        if other not in failed:
            rows.append(median_row(other.group, n, other.method, None, case_runs, label, rounds))
    return [one_prefill(row) for row in rows] if prefill_once else rows
