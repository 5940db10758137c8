"""`cake bench speed`'s verdicts on synthetic rows: like-for-like pairings, repeats and noise.

No model runs here: rows are built from chosen repeat timings, so every expected ratio is known.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import statistics
import subprocess
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
import cake_cli.cli.commands.bench_speed  # noqa: F401 - registers `cake bench speed`
from cake_cli.bench.speed import paths
from cake_cli.bench.speed.report import ratios
from cake_cli.bench.speed.rows import TIMED, SpeedRow, Spread, cross_ratio, median_row, ratio_spread, share
from cake_cli.bench.speed.targets import (
    MIN_REPEATS,
    bf16_lines,
    comparable,
    engine_lines,
    kvpress_lines,
    target_lines,
    verdict,
)
from cake_cli.cli.main import app
from cake_cli.cli.runners import bench_speed as runner


def row(group, length, method, prefill, tps, *, budget=256, evict=None, kv=3 << 20, rounds="") -> SpeedRow:
    """A row whose repeats took `prefill` seconds and decoded at `tps` tokens/s (one value per repeat);
    `rounds`: the id of the rounds it was measured in ("" for none)."""
    n = len(prefill)
    evict = evict or [0.01] * n
    runs = [
        {
            "prefill_seconds": p,
            "ttft_seconds": p,
            "decode_tokens_per_second": t,
            "decode_steps": 31,
            "kv_bytes_kept": kv,
            "kv_peak_prefill": 2 * kv,
            "kv_bytes_full": 32 * kv,
            "rss_peak_delta": 0,
            "eviction_seconds": e,
            "sampling_seconds": 0.001,
            "decode_seconds": 31 / t,
        }
        for p, t, e in zip(prefill, tps, evict)
    ]
    return median_row(group, length, method, None if method in ("full", "limit") else budget, runs, "2/2", rounds)


def verdicts(lines: list[str]) -> list[str]:
    words = ("PASS", "FAIL", "within noise", "too few repeats", "no comparable row")
    return [next(w for w in words if line.startswith(w)) for line in lines]


SMOL = "smollm2 · bfloat16"


def smollm2_rows(extra=()) -> list[SpeedRow]:
    """The shape of the 2026-12-01 SmolLM2 run: engine rows stop at 4,096 tokens, kvpress at 7,624."""
    three = [1.0, 1.0, 1.0]
    return [
        row(f"{SMOL} · engine", 1024, "snapkv", [0.38] * 3, [20.8] * 3),
        row(f"{SMOL} · engine", 4096, "snapkv", [1.96] * 3, [20.5] * 3),
        row(f"{SMOL} · engine", 4096, "cake", [2.28] * 3, [20.3] * 3),
        row(f"{SMOL} · kvpress", 7624, "kvpress-snapkv", [5.53 * x for x in three], [27.2] * 3),
        *extra,
    ]


def test_kvpress_is_never_compared_with_a_row_of_another_length():
    lines = kvpress_lines(ratios(smollm2_rows()))
    assert verdicts(lines) == ["no comparable row", "no comparable row"]  # snapkv, cake
    assert "1024, 4096 tokens, none within 2%" in lines[0]
    assert not [line for line in target_lines(ratios(smollm2_rows())) if "kvpress" in line and "PASS" in line]


def test_kvpress_pairs_the_row_at_its_length():
    # the same run's 7,600-token CAKE row: 5.79 s against kvpress's 5.53 s is 1.047x, a FAIL (target <= 1.0x)
    cake = row(f"{SMOL} · engine", 7600, "cake", [5.79, 5.78, 5.80], [20.0, 20.1, 19.9])
    lines = kvpress_lines(ratios(smollm2_rows([cake])))
    cake_lines = [line for line in lines if " cake " in line]
    assert verdicts(cake_lines) == ["FAIL", "FAIL", "PASS"]  # decode, prefill, KV bytes
    assert "cake at 7600 vs kvpress SnapKV at 7624 tokens: prefill vs kvpress's 1.05x" in cake_lines[1]
    assert "decode vs kvpress's 0.74x" in cake_lines[0]  # 20.0 / 27.2
    assert verdicts([line for line in lines if " snapkv " in line]) == ["no comparable row"]


@pytest.mark.parametrize(("length", "paired"), [(7624, True), (7472, True), (7776, True), (7471, False), (7777, False)])
def test_equal_length_means_within_two_percent(length, paired):
    # 2% of 7,624 tokens is 152.48: 7,472 and 7,776 are inside, 7,471 and 7,777 outside
    assert (comparable([{"length": length}], 7624) is not None) == paired


def test_the_nearest_comparable_row_is_chosen():
    rows = [{"length": 8192, "id": "a"}, {"length": 8230, "id": "b"}, {"length": 4096, "id": "c"}]
    assert comparable(rows, 8216)["id"] == "b"
    assert comparable(rows, 5000) is None


@pytest.mark.parametrize(
    ("median", "low", "high", "repeats", "expected"),
    [
        (0.91, 0.89, 0.93, 3, "within noise"),  # passes by a hair: 0.9 lies within the spread
        (0.95, 0.92, 0.97, 3, "PASS"),
        (0.85, 0.83, 0.88, 3, "FAIL"),
        (0.95, 0.92, 0.97, 2, "too few repeats"),
        (0.95, 0.95, 0.95, 1, "too few repeats"),
        (0.90, 0.90, 0.90, 3, "within noise"),  # exactly at the target
    ],
)
def test_verdict_needs_repeats_and_a_margin_beyond_the_spread(median, low, high, repeats, expected):
    assert verdict(Spread(median, low, high, repeats), 0.9, at_least=True) == expected
    assert MIN_REPEATS == 3


def test_at_most_targets_read_the_other_way():
    assert verdict(Spread(1.02, 1.0, 1.04, 3), 1.05, at_least=False) == "PASS"
    assert verdict(Spread(1.10, 1.08, 1.12, 3), 1.05, at_least=False) == "FAIL"
    assert verdict(Spread(1.04, 1.03, 1.07, 3), 1.05, at_least=False) == "within noise"


def test_cross_ratio_spans_every_pairing_of_the_repeats():
    rng = random.Random(7)
    for _ in range(50):
        xa = [rng.uniform(1, 20) for _ in range(rng.randint(1, 5))]
        xb = [rng.uniform(1, 20) for _ in range(rng.randint(1, 5))]
        a = {"x": statistics.median(xa), "samples": {"x": xa}}
        b = {"x": statistics.median(xb), "samples": {"x": xb}}
        s = cross_ratio(a, b, "x")
        pairs = [p / q for p, q in itertools.product(xa, xb)]
        assert s.low == pytest.approx(min(pairs)) and s.high == pytest.approx(max(pairs))
        assert s.median == pytest.approx(statistics.median(xa) / statistics.median(xb))
        assert s.repeats == min(len(xa), len(xb))


def test_rows_of_one_set_of_rounds_are_compared_round_by_round():
    rng = random.Random(11)
    for _ in range(50):
        n = rng.randint(2, 7)
        xa, xb = [rng.uniform(1, 20) for _ in range(n)], [rng.uniform(1, 20) for _ in range(n)]
        a = {"x": statistics.median(xa), "samples": {"x": xa}, "rounds": "r"}
        b = {"x": statistics.median(xb), "samples": {"x": xb}, "rounds": "r"}
        per_round = [xa[i] / xb[i] for i in range(n)]
        s = ratio_spread(a, b, "x")
        assert (s.median, s.low, s.high, s.repeats) == pytest.approx(
            (statistics.median(per_round), min(per_round), max(per_round), n)
        )
        assert ratio_spread(a, {**b, "rounds": "other"}, "x") == cross_ratio(a, b, "x")  # measured apart
        assert ratio_spread({**a, "rounds": ""}, {**b, "rounds": ""}, "x") == cross_ratio(a, b, "x")
    one = {"x": 2.0, "samples": {"x": [2.0]}, "rounds": "r"}
    assert ratio_spread(one, one, "x") == cross_ratio(one, one, "x")  # one sample: nothing to pair


def test_a_slow_round_both_rows_shared_cancels_when_they_ran_in_rounds():
    g = "qwen · bfloat16 · engine"

    def limit_line(rounds):
        rows = [
            row(g, 8192, "cake", [11.0] * 3, [10.0, 7.0, 10.2], rounds=rounds),
            row(g, 256, "limit", [0.2] * 3, [10.4, 7.3, 10.6], rounds=rounds),
        ]
        return next(line for line in engine_lines(ratios(rows)) if "the limit" in line)

    # round by round 10.0 / 10.4, 7.0 / 7.3, 10.2 / 10.6 = 0.962, 0.959, 0.962: every round meets 0.95x
    assert limit_line("r1").startswith("PASS") and "0.96x (min 0.96x, max 0.96x over 3 runs" in limit_line("r1")
    # measured apart, the slow round pairs with the fast ones: 7.0 / 10.6 = 0.66 up to 10.2 / 7.3 = 1.40
    assert limit_line("").startswith("within noise") and "(min 0.66x, max 1.40x" in limit_line("")


def test_share_is_taken_within_each_run():
    r = {"e": 0.5, "p": 10.0, "samples": {"e": [0.4, 0.5, 0.9], "p": [10.0, 10.0, 9.0]}}
    s = share(r, "e", "p")
    assert (s.low, s.median, s.high, s.repeats) == pytest.approx((0.04, 0.05, 0.1, 3))


def test_a_target_passing_by_a_hair_on_noisy_repeats_is_within_noise():
    g = "qwen · bfloat16 · engine"
    rows = [
        row(g, 8192, "full", [10.2, 10.0, 10.4], [8.4, 8.1, 8.7]),
        row(g, 8192, "cake", [11.2, 10.4, 11.5], [10.9, 10.3, 11.4]),
        row(g, 256, "limit", [0.2] * 3, [11.9, 11.2, 12.4]),
    ]
    lines = engine_lines(ratios(rows))
    limit = next(line for line in lines if "the limit" in line)
    # median 10.9 / 11.9 = 0.916: below 0.95, but the repeats range from 10.3 / 12.4 = 0.83 to 11.4 / 11.2 = 1.02
    assert limit.startswith("within noise") and "0.92x (min 0.83x, max 1.02x over 3 runs; target >= 0.95x)" in limit
    decode = next(line for line in lines if "decode vs full" in line)
    assert decode.startswith("FAIL")  # 1.30x, at most 11.4 / 8.1 = 1.41x: every pairing misses 2.2x


def test_one_repeat_decides_no_timing_target():
    g = "qwen · bfloat16 · engine"
    rows = [
        row(g, 8192, "full", [10.0], [8.0]),
        row(g, 8192, "cake", [10.1], [20.0]),
        row(g, 256, "limit", [0.2], [21.0]),
    ]
    lines = engine_lines(ratios(rows))
    assert lines and all(line.startswith("too few repeats") for line in lines)


def test_bf16_speed_up_pairs_the_full_cache_rows():
    rows = [
        row("qwen · bfloat16 · engine", 4096, "full", [4.04] * 3, [10.0] * 3),
        row("qwen · float32 · engine", 4096, "full", [13.50] * 3, [8.8] * 3),
        row("qwen · float32 · engine", 4096, "cake-grow", [14.21] * 3, [11.2] * 3),  # listed last: once paired
    ]
    (line,) = bf16_lines(ratios(rows))
    assert line.startswith("PASS") and "bf16 prefill speed-up over float32 3.34x" in line  # 13.50 / 4.04


def test_ratios_keep_medians_and_spreads():
    g = "m · float32 · engine"
    rows = [row(g, 1024, "full", [1.0, 2.0, 3.0], [10.0] * 3), row(g, 1024, "cake", [2.0, 2.0, 2.0], [20.0] * 3)]
    cake = ratios(rows)[1]
    assert cake["prefill_vs_full"] == 1.0  # 2 / median(1, 2, 3)
    assert cake["spreads"]["prefill_vs_full"] == {"median": 1.0, "low": 2 / 3, "high": 2.0, "repeats": 3}
    assert cake["samples"]["prefill_seconds"] == (2.0, 2.0, 2.0)
    assert set(cake["samples"]) == set(TIMED)
    json.dumps(ratios(rows))  # the --json payload


def test_kvpress_row_asks_for_our_warm_up_and_repeats(monkeypatch, tmp_path):
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        out = {
            "prefill_seconds": 5.5,
            "ttft_seconds": 5.6,
            "decode_tokens_per_second": 27.0,
            "decode_steps": 31,
            "kv_bytes_kept": 1000,
            "context_tokens": 7624,
            "repeats": 3,
            "samples": {"prefill_seconds": [5.4, 5.5, 5.6], "decode_tokens_per_second": [26.0, 27.0, 28.0]},
        }
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(out) + "\n", stderr="")

    monkeypatch.setattr(paths, "kvpress_available", lambda: True)
    monkeypatch.setattr(paths.subprocess, "run", fake_run)
    r = paths.kvpress_row(tmp_path, [1, 2, 3], 256, "m · bfloat16 · kvpress", new_tokens=32, threads=(2, 2),
                          dtype="bfloat16", repeats=3)  # fmt: skip
    cmd = seen["cmd"]
    assert cmd[cmd.index("--repeats") + 1] == "3"
    assert cmd[cmd.index("--warmup-tokens") + 1] == "256" and cmd[cmd.index("--warmup-new-tokens") + 1] == "4"
    assert r.repeats == 3 and r.samples["prefill_seconds"] == (5.4, 5.5, 5.6)


def test_every_peer_row_gets_the_runs_repeats(monkeypatch):
    calls, selects = [], []

    def fake_run_speed(model, ids, base, *, group, lengths, methods, threads, new_tokens, repeats, on_case):
        calls.append(("engine", group, repeats))
        return [row(group, lengths[0], "cake", [1.0] * repeats, [10.0] * repeats)]

    def fake_cli_row(ready, request, group, method, on_case=None, *, repeats, warmup, label=None):
        calls.append(("cli", group, repeats, warmup is not None))
        selects.append((label or method, request.prefill))
        return row(group, 100, label or method, [1.0] * repeats, [10.0] * repeats)

    def fake_kvpress_row(*args, repeats, **kwargs):
        calls.append(("kvpress", repeats))
        return row("m · bfloat16 · kvpress", 100, "kvpress-snapkv", [1.0] * repeats, [10.0] * repeats)

    monkeypatch.setattr(runner, "run_speed", fake_run_speed)
    monkeypatch.setattr(runner, "cli_row", fake_cli_row)
    monkeypatch.setattr(runner, "kvpress_row", fake_kvpress_row)
    monkeypatch.setattr(runner, "document_file", lambda tok, ids, folder: folder / f"doc-{len(ids)}.txt")
    monkeypatch.setattr(runner, "busy_core", contextlib.nullcontext)
    setup = SimpleNamespace(
        cli_tasks=["qa", "summarize"], busy=True, kvpress=True, repeats=5, new_tokens=32, select=True
    )
    loaded = SimpleNamespace(
        tokenizer=None, model=None, path="ckpt", dtype="torch.bfloat16", float_checkpoint=lambda: "ckpt"
    )
    ready = SimpleNamespace(loaded=loaded)
    base = SimpleNamespace(budget=256)
    runner._path_rows(setup, ready, runner.TaskRequest(task="qa", document="-"), list(range(300)), "m · bfloat16",
                      base, lambda label: None, lambda message: None)  # fmt: skip
    cli = [("cli", f"m · bfloat16 · cli {t}", 5, True) for t in ("qa", "qa", "qa", "summarize", "summarize")]
    assert [c for c in calls if c[0] == "cli"] == cli  # each after a warm-up run
    assert selects == [
        ("full", "full"),
        ("cake", "full"),
        ("cake-select", "select"),
        ("full", "full"),
        ("cake", "full"),
    ]
    assert [c for c in calls if c[0] == "engine"] == [("engine", f"m · bfloat16 · {p}", 5) for p in ("quiet", "busy")]
    assert ("kvpress", 5) in calls


def test_bench_speed_repeats_three_by_default(monkeypatch):
    seen = {}
    monkeypatch.setattr(runner, "speed", lambda setup: seen.setdefault("setup", setup))
    result = CliRunner().invoke(app, ["bench", "speed", "--cli-tasks", ""])
    assert result.exit_code == 0, result.output
    assert seen["setup"].repeats == 3


@pytest.mark.parametrize(
    "length, full, select, expected",
    [
        (16384, [30.0, 31.0, 32.0], [8.0, 9.0, 9.5], ["PASS"]),  # 30/9.5 = 3.16 at worst
        (16384, [30.0, 31.0, 32.0], [12.0, 12.5, 13.0], ["FAIL"]),  # 32/12 = 2.67 at best
        (16384, [30.0, 31.0, 32.0], [9.0, 10.0, 11.0], ["within noise"]),  # 2.73 .. 3.56
        (16384, [30.0], [8.0], ["too few repeats"]),
        (8256, [30.0, 31.0, 32.0], [8.0, 9.0, 9.5], []),  # the target is at 16K
    ],
)
def test_prefill_select_target_is_first_token_three_times_sooner_at_16k(length, full, select, expected):
    from cake_cli.bench.speed.targets import SELECT_METHOD, select_lines

    group = "qwen · bfloat16 · cli qa"
    rows = ratios(
        [
            row(group, length, "full", full, [9.0] * len(full)),
            row(group, length, SELECT_METHOD, select, [9.0] * len(select)),
        ]
    )
    lines = select_lines(rows)
    assert verdicts(lines) == expected
    if lines:
        assert f"select at {length} tokens" in lines[0] and "target >= 3.00x" in lines[0]
        assert lines[0] in target_lines(rows)
    assert [r["method"] for r in rows] == ["full", SELECT_METHOD]
    assert rows[1]["prefill_vs_full"] == pytest.approx(statistics.median(select) / statistics.median(full))


def test_select_needs_the_qa_rows():
    result = CliRunner().invoke(app, ["bench", "speed", "--select", "--cli-tasks", "summarize"])
    assert result.exit_code != 0 and "keep qa in --cli-tasks" in result.stderr
