"""Rich table of `cake bench speed` results."""

from __future__ import annotations

from rich import box
from rich.table import Table

from cake_cli.tasks.results import human_bytes


def _ratio(d: dict, key: str) -> str:
    return f"{d[key]:.2f}×" if key in d else ""


def speed_table(rows: list[dict], title: str) -> Table:
    """One row per (length, method): absolute numbers, then ratios vs the full cache / SnapKV / limit."""
    t = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False)
    for name in (
        "tokens",
        "method",
        "prefill s",
        "vs full",
        "vs snapkv",
        "decode tok/s",
        "vs full",
        "vs limit",
        "KV kept",
        "KV peak prefill",
        "peak vs snapkv",
        "evict s",
        "RSS peak +",
    ):
        t.add_column(name, justify="right", no_wrap=True)
    for d in rows:
        t.add_row(
            str(d["length"]),
            d["method"],
            f"{d['prefill_seconds']:.2f}",
            _ratio(d, "prefill_vs_full"),
            _ratio(d, "prefill_vs_snapkv"),
            f"{d['decode_tokens_per_second']:.1f}",
            _ratio(d, "decode_vs_full"),
            _ratio(d, "decode_vs_limit"),
            human_bytes(d["kv_bytes_kept"]),
            human_bytes(d["kv_peak_prefill"]),
            _ratio(d, "kv_peak_vs_snapkv"),
            f"{d['eviction_seconds']:.3f}",
            human_bytes(d["rss_peak_delta"]),
        )
    return t
