"""`cake bench speed` results: ratios within each group and the rich table.

Ratios compare rows of one group (model · dtype · path) and length: vs the full cache (prefill,
decode, KV bytes), vs SnapKV (prefill, KV peak), and decode vs the limit (full cache with a prompt
as long as the budget). Each timed ratio is taken round by round (`rows.ratio_spread`: rows of one
`run_speed` call ran in the same rounds), its median, min and max over the rounds under `spreads`
(`rows.Spread`), which the targets read; rows measured apart pair every repeat (`rows.cross_ratio`).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

from rich import box
from rich.table import Table

from cake_cli.bench.speed.rows import SpeedRow, Spread, ratio_spread, share
from cake_cli.tasks.results import human_bytes


def ratios(rows: list[SpeedRow]) -> list[dict]:
    """Each row as a dict, with its ratios added (see the module docstring); `spreads` maps each
    timed ratio's name to its `Spread` as a dict."""
    by = {(r.group, r.length, r.method): asdict(r) for r in rows}
    limits = {r.group: asdict(r) for r in rows if r.method == "limit"}
    out = []
    for row in rows:
        d = asdict(row)
        spreads: dict[str, Spread] = {}
        full = by.get((row.group, row.length, "full"))
        if full is not None and row.method != "limit":
            spreads["prefill_vs_full"] = ratio_spread(d, full, "prefill_seconds")
            spreads["decode_vs_full"] = ratio_spread(d, full, "decode_tokens_per_second")
            d["kv_kept_vs_full"] = row.kv_bytes_kept / max(full["kv_bytes_kept"], 1)
        limit = limits.get(row.group)
        if limit is not None and row.method not in ("limit", "full"):
            spreads["decode_vs_limit"] = ratio_spread(d, limit, "decode_tokens_per_second")
        snap = by.get((row.group, row.length, "snapkv"))
        if snap is not None and row.method in ("cake", "pyramidkv", "cake-grow", "cake-chunk"):
            spreads["prefill_vs_snapkv"] = ratio_spread(d, snap, "prefill_seconds")
            d["kv_peak_vs_snapkv"] = row.kv_peak_prefill / max(snap["kv_peak_prefill"], 1)
        if row.prefill_seconds > 0:
            spreads["eviction_share"] = share(d, "eviction_seconds", "prefill_seconds")
        if row.decode_seconds > 0:
            spreads["sampling_share"] = share(d, "sampling_seconds", "decode_seconds")
        d.update({name: s.median for name, s in spreads.items()})
        d["spreads"] = {name: asdict(s) for name, s in spreads.items()}
        out.append(d)
    return out


def _range(d: dict, key: str, fmt: str) -> str:
    """'min–max' of a TIMED field over the repeats ('' with fewer than 2)."""
    values = d.get("samples", {}).get(key) or []
    return f"{fmt.format(min(values))}–{fmt.format(max(values))}" if len(values) > 1 else ""


def _min(d: dict, key: str) -> str:
    values = d.get("samples", {}).get(key) or [d[key]]
    return f"{min(values):.2f}"


def _spread_pct(d: dict, key: str) -> str:
    """The spread of a TIMED field, (max - min) / median in %, ('' with fewer than 2 repeats)."""
    values = d.get("samples", {}).get(key) or []
    if len(values) < 2 or not statistics.median(values):
        return ""
    return f"±{50 * (max(values) - min(values)) / statistics.median(values):.1f}%"


def _ratio(d: dict, key: str) -> str:
    return f"{d[key]:.2f}×" if key in d else ""


COLUMNS = (
    ("tokens", lambda d: str(d["length"])),
    ("method", lambda d: d["method"]),
    ("prefill s", lambda d: f"{d['prefill_seconds']:.2f}"),
    ("min", lambda d: _min(d, "prefill_seconds")),
    ("spread", lambda d: _spread_pct(d, "prefill_seconds")),
    ("vs full", lambda d: _ratio(d, "prefill_vs_full")),
    ("TTFT s", lambda d: f"{d['ttft_seconds']:.2f}"),
    ("decode tok/s", lambda d: f"{d['decode_tokens_per_second']:.1f}"),
    ("min–max", lambda d: _range(d, "decode_tokens_per_second", "{:.1f}")),
    ("vs full", lambda d: _ratio(d, "decode_vs_full")),
    ("vs limit", lambda d: _ratio(d, "decode_vs_limit")),
    ("KV kept", lambda d: human_bytes(d["kv_bytes_kept"])),
    ("KV peak", lambda d: human_bytes(d["kv_peak_prefill"]) if d["kv_peak_prefill"] else "–"),
    ("evict s", lambda d: f"{d['eviction_seconds']:.2f}"),
    ("RSS +", lambda d: human_bytes(d["rss_peak_delta"]) if d["rss_peak_delta"] else "–"),
    ("threads", lambda d: d["threads"]),
    ("runs", lambda d: str(d["repeats"])),
)


def speed_tables(rows: list[dict], title: str) -> list[Table]:
    """One table per group: medians over the repeats (prefill also its min and spread, ± half the
    min-max range in % of the median; decode its min-max), then ratios vs the full cache and the
    limit, and the number of timed runs."""
    tables = []
    for group in dict.fromkeys(d["group"] for d in rows):
        t = Table(box=box.SIMPLE_HEAD, title=f"{title} · {group}", title_justify="left", pad_edge=False)
        for name, _ in COLUMNS:
            t.add_column(name, justify="right", no_wrap=True)
        for d in rows:
            if d["group"] == group:
                t.add_row(*(cell(d) for _, cell in COLUMNS))
        tables.append(t)
    return tables


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "–"


PEAK_COLUMNS = (
    ("tokens", lambda d: str(d["tokens"])),
    ("method", lambda d: d["method"]),
    ("prefill s", lambda d: f"{d['prefill_seconds']:.2f}"),
    ("of peak", lambda d: f"{100 * d['prefill_of_peak']:.0f}%"),
    ("linear s", lambda d: f"{d['linear_seconds']:.2f}"),
    ("share", lambda d: _pct(d["linear_seconds"], d["prefill_seconds"])),
    ("GFLOP/s", lambda d: f"{d['linear_gflops']:.0f}"),
    ("peak", lambda d: f"{d['linear_peak_gflops']:.0f}"),
    ("of peak", lambda d: f"{100 * d['linear_of_peak']:.0f}%"),
    ("attention s", lambda d: f"{d['attention_seconds']:.2f}"),
    ("share", lambda d: _pct(d["attention_seconds"], d["prefill_seconds"])),
    ("GFLOP/s", lambda d: f"{d['attention_gflops']:.0f}"),
    ("peak", lambda d: f"{d['attention_peak_gflops']:.0f}"),
    ("of peak", lambda d: f"{100 * d['attention_of_peak']:.0f}%"),
    ("rest s", lambda d: f"{d['rest_seconds']:.2f}"),
    ("share", lambda d: _pct(d["rest_seconds"], d["prefill_seconds"])),
    ("evict s", lambda d: f"{d['eviction_seconds']:.2f}"),
    ("threads", lambda d: str(d["threads"])),
)


def peak_tables(rows: list[dict], title: str) -> list[Table]:
    """One table per (model, dtype) of `speed.peak.PeakRow` dicts: the prefill split into linear layers,
    attention and the rest (seconds, share of the prefill), each part's achieved GFLOP/s against the
    GEMM peak at its own shapes; then the linear calls' peak in every GEMM kind measured (GFLOP/s,
    int8: GOP/s)."""
    tables = []
    for key in dict.fromkeys((d["model"], d["dtype"]) for d in rows):
        group = [d for d in rows if (d["model"], d["dtype"]) == key]
        t = Table(
            box=box.SIMPLE_HEAD, title=f"{title} · {key[0]} · {key[1]} · prefill against the peak",
            title_justify="left", pad_edge=False,
        )  # fmt: skip
        for name, _ in PEAK_COLUMNS:
            t.add_column(name, justify="right", no_wrap=True)
        for d in group:
            t.add_row(*(cell(d) for _, cell in PEAK_COLUMNS))
        tables.append(t)
        kinds = list(dict.fromkeys(k for d in group for k in d["peaks"]))
        p = Table(
            box=box.SIMPLE_HEAD, title=f"GEMM peak at the linear layers' own shapes · {key[0]} (best of repeats)",
            title_justify="left", pad_edge=False,
        )  # fmt: skip
        p.add_column("tokens", justify="right")
        p.add_column("method", justify="right")
        for kind in kinds:
            p.add_column(f"{kind} {'GOP/s' if kind == 'int8' else 'GFLOP/s'}", justify="right")
        for d in group:
            p.add_row(str(d["tokens"]), d["method"], *(f"{d['peaks'].get(k, 0):.0f}" for k in kinds))
        tables.append(p)
    return tables
