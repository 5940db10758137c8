"""The speed targets of `cake bench speed` as PASS / FAIL lines, from the rows with their ratios
(`speed_report.ratios`). Groups are named "<model> · <dtype> · <path>"; a target whose rows are
absent from the run is not printed."""

from __future__ import annotations

LONG = 7600  # "8K" targets apply to rows at least this long (SmolLM2 stops at 7,600 prompt tokens)


def _line(ok: bool, text: str) -> str:
    return f"{'PASS' if ok else 'FAIL'} {text}"


def _split(group: str) -> tuple[str, str, str]:
    model, dtype, path = (group.split(" · ") + ["", "", ""])[:3]
    return model, dtype, path


def _rows(rows: list[dict], path: str, method: str, long: bool = True) -> list[dict]:
    return [
        r for r in rows if _split(r["group"])[2] == path and r["method"] == method and (r["length"] >= LONG) == long
    ]


def bf16_lines(rows: list[dict]) -> list[str]:
    """bf16 prefill >= 1.5x float32 at 4K and 8K (full cache, engine rows)."""
    out = []
    fp32 = {(_split(r["group"])[0], r["length"]): r for r in rows if r["group"].endswith("float32 · engine")}
    for r in rows:
        model, dtype, path = _split(r["group"])
        other = fp32.get((model, r["length"]))
        if dtype == "bfloat16" and path == "engine" and r["method"] == "full" and r["length"] >= 4000 and other:
            speedup = other["prefill_seconds"] / r["prefill_seconds"]
            out.append(
                _line(speedup >= 1.5, f"{model} at {r['length']}: bf16 prefill {speedup:.2f}x float32 (target 1.5x)")
            )
    return out


def engine_lines(rows: list[dict]) -> list[str]:
    """At 8K: CAKE decode >= 2.2x full and >= 0.9x the limit; prefill <= 1.05x full; scoring +
    eviction <= 5% of prefill."""
    out = []
    for r in _rows(rows, "engine", "cake"):
        where = f"{_split(r['group'])[0]} {_split(r['group'])[1]} at {r['length']}, B={r['budget']}"
        if "decode_vs_full" in r:
            out.append(
                _line(r["decode_vs_full"] >= 2.2, f"{where}: CAKE decode {r['decode_vs_full']:.2f}x full (target 2.2x)")
            )
        if "decode_vs_limit" in r:
            out.append(
                _line(
                    r["decode_vs_limit"] >= 0.9,
                    f"{where}: CAKE decode {r['decode_vs_limit']:.2f}x the limit (target 0.9x)",
                )
            )
        if "prefill_vs_full" in r:
            out.append(
                _line(
                    r["prefill_vs_full"] <= 1.05,
                    f"{where}: CAKE prefill {r['prefill_vs_full']:.2f}x full (target <= 1.05x)",
                )
            )
        share = r.get("eviction_share", 0.0)
        out.append(_line(share <= 0.05, f"{where}: scoring + eviction {100 * share:.1f}% of prefill (target <= 5%)"))
    return out


def cli_lines(rows: list[dict]) -> list[str]:
    """Through the CLI at 8K: qa and summarize decode under CAKE >= 2x the full cache; n-gram
    blocking <= 5% of decode time."""
    out = []
    for task in ("qa", "summarize"):
        for r in _rows(rows, f"cli {task}", "cake"):
            where = f"{_split(r['group'])[0]} `cake {task}` at {r['length']}"
            if "decode_vs_full" in r:
                out.append(
                    _line(
                        r["decode_vs_full"] >= 2.0, f"{where}: CAKE decode {r['decode_vs_full']:.2f}x full (target 2x)"
                    )
                )
            share = r.get("sampling_share", 0.0)
            out.append(
                _line(
                    share <= 0.05,
                    f"{where}: token choice incl. n-gram blocking {100 * share:.1f}% of decode (target <= 5%)",
                )
            )
    return out


def busy_lines(rows: list[dict]) -> list[str]:
    """With a busy loop holding one core: decode >= 0.6x the quiet tok/s of the same case run just before."""
    quiet = {(_split(r["group"])[:2], r["length"], r["method"]): r for r in rows if _split(r["group"])[2] == "quiet"}
    out = []
    for r in rows:
        base = quiet.get((_split(r["group"])[:2], r["length"], r["method"]))
        if _split(r["group"])[2] == "busy" and base:
            share = r["decode_tokens_per_second"] / base["decode_tokens_per_second"]
            where = f"{_split(r['group'])[0]} {r['method']} at {r['length']} with one core busy"
            out.append(_line(share >= 0.6, f"{where}: decode {share:.2f}x quiet (target 0.6x)"))
    return out


def kvpress_lines(rows: list[dict]) -> list[str]:
    """Our SnapKV and CAKE vs kvpress's SnapKV on the same document and budget: decode >= its,
    prefill <= 1.0x its, KV bytes equal."""
    out = []
    for k in (r for r in rows if r["method"] == "kvpress-snapkv"):
        model, dtype, _ = _split(k["group"])
        for method in ("snapkv", "cake"):
            ours = [r for r in rows if r["group"] == f"{model} · {dtype} · engine" and r["method"] == method]
            if not ours:
                continue
            mine = min(ours, key=lambda r: abs(r["length"] - k["length"]))
            where = f"{model} {method} vs kvpress SnapKV at ~{k['length']} tokens"
            ours_tps, theirs_tps = mine["decode_tokens_per_second"], k["decode_tokens_per_second"]
            out.append(_line(ours_tps >= theirs_tps, f"{where}: decode {ours_tps:.1f} vs {theirs_tps:.1f} tok/s"))
            ratio = mine["prefill_seconds"] / k["prefill_seconds"]
            out.append(_line(ratio <= 1.0, f"{where}: prefill {ratio:.2f}x kvpress's (target <= 1.0x)"))
            kv = mine["kv_bytes_kept"] / max(k["kv_bytes_kept"], 1)
            out.append(_line(abs(kv - 1) <= 0.02, f"{where}: KV bytes kept {kv:.3f}x kvpress's (target equal)"))
    return out


def target_lines(rows: list[dict]) -> list[str]:
    """Every target line the rows allow."""
    return bf16_lines(rows) + engine_lines(rows) + cli_lines(rows) + busy_lines(rows) + kvpress_lines(rows)
