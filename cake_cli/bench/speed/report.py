"""`cake bench speed` results: ratios within each group and the rich table.

Ratios compare rows of one group (model · dtype · path) and length: vs the full cache (prefill,
decode, KV bytes), vs SnapKV (prefill, KV peak), and decode vs the limit (full cache with a prompt
as long as the budget).
"""

from __future__ import annotations

from dataclasses import asdict

from rich import box
from rich.table import Table

from cake_cli.bench.speed.rows import SpeedRow
from cake_cli.tasks.results import human_bytes


def ratios(rows: list[SpeedRow]) -> list[dict]:
    """Each row as a dict, with its ratios added (see the module docstring)."""
    by = {(r.group, r.length, r.method): r for r in rows}
    limits = {r.group: r for r in rows if r.method == "limit"}
    out = []
    for row in rows:
        d = asdict(row)
        full = by.get((row.group, row.length, "full"))
        if full is not None and row.method != "limit":
            d["prefill_vs_full"] = row.prefill_seconds / full.prefill_seconds
            d["decode_vs_full"] = row.decode_tokens_per_second / max(full.decode_tokens_per_second, 1e-12)
            d["kv_kept_vs_full"] = row.kv_bytes_kept / max(full.kv_bytes_kept, 1)
        limit = limits.get(row.group)
        if limit is not None and row.method not in ("limit", "full"):
            d["decode_vs_limit"] = row.decode_tokens_per_second / max(limit.decode_tokens_per_second, 1e-12)
        snap = by.get((row.group, row.length, "snapkv"))
        if snap is not None and row.method in ("cake", "pyramidkv", "cake-grow"):
            d["prefill_vs_snapkv"] = row.prefill_seconds / snap.prefill_seconds
            d["kv_peak_vs_snapkv"] = row.kv_peak_prefill / max(snap.kv_peak_prefill, 1)
        if row.prefill_seconds > 0:
            d["eviction_share"] = row.eviction_seconds / row.prefill_seconds
        if row.decode_seconds > 0:
            d["sampling_share"] = row.sampling_seconds / row.decode_seconds
        out.append(d)
    return out


def _ratio(d: dict, key: str) -> str:
    return f"{d[key]:.2f}×" if key in d else ""


COLUMNS = (
    ("tokens", lambda d: str(d["length"])),
    ("method", lambda d: d["method"]),
    ("prefill s", lambda d: f"{d['prefill_seconds']:.2f}"),
    ("vs full", lambda d: _ratio(d, "prefill_vs_full")),
    ("TTFT s", lambda d: f"{d['ttft_seconds']:.2f}"),
    ("decode tok/s", lambda d: f"{d['decode_tokens_per_second']:.1f}"),
    ("vs full", lambda d: _ratio(d, "decode_vs_full")),
    ("vs limit", lambda d: _ratio(d, "decode_vs_limit")),
    ("KV kept", lambda d: human_bytes(d["kv_bytes_kept"])),
    ("KV peak", lambda d: human_bytes(d["kv_peak_prefill"]) if d["kv_peak_prefill"] else "–"),
    ("evict s", lambda d: f"{d['eviction_seconds']:.2f}"),
    ("RSS +", lambda d: human_bytes(d["rss_peak_delta"]) if d["rss_peak_delta"] else "–"),
    ("threads", lambda d: d["threads"]),
)


def speed_tables(rows: list[dict], title: str) -> list[Table]:
    """One table per group: absolute numbers, then ratios vs the full cache and the limit."""
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
