"""`cake bench cache` on the tiny random profile: every part runs, and with nothing evicted the
question-agnostic answers equal the question-aware and full-cache ones (the continuation is exact)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cake_cli.bench.quality.run import Model
from cake_cli.bench.reuse import VARIANTS, first_token_targets, quality_rows, summarize_quality
from cake_cli.cli.main import app
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from tests.helpers.models import tiny_llama
from tests.helpers.tiny import build_tiny_tokenizer

runner = CliRunner()


@pytest.mark.slow
def test_without_eviction_agnostic_equals_aware():
    tokenizer = build_tiny_tokenizer()
    lm = tiny_llama(vocab=len(tokenizer))
    use_cake_attention(lm, "sdpa")
    model = Model(lm, tokenizer, 1500, frozenset())
    configs = {2000: CakeConfig(budget=2000, window=8), 48: CakeConfig(budget=48, window=8)}
    rows = quality_rows(model, configs, [("s-rt", 0, 0.5, 700)], "python-docs")
    by = {(r["variant"], r["budget"]): r for r in rows}
    assert set(by) == {("full", None)} | {(v, b) for v in VARIANTS[1:] for b in configs}
    nothing_evicted = {by[(v, 2000)]["prediction"] for v in VARIANTS[1:]} | {by[("full", None)]["prediction"]}
    assert len(nothing_evicted) == 1, nothing_evicted
    assert all(0.0 <= r["score"] <= 1.0 and r["exact"] in (0.0, 1.0) for r in rows)
    summary = summarize_quality(rows)
    assert [(s["variant"], s["budget"]) for s in summary][:1] == [("full", None)] and len(summary) == len(rows)


def test_bench_cache_command_timing_part(cli_env):
    out = cli_env / "cache-bench.json"
    result = runner.invoke(
        app,
        ["bench", "cache", "-m", "tiny-test", "-b", "64", "--length", "600", "--repeats", "1", "--parts", "timing",
         "--threads", "1", "-o", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "time to first answer token" in result.stdout
    data = json.loads(out.read_text())
    agnostic, whole = data["timing"]
    assert (agnostic["scoring"], whole["scoring"]) == ("instruction", "question")
    assert agnostic["kv_bits"] == whole["kv_bits"] == 16  # the tiny profile's default file
    for timing in (agnostic, whole):
        assert timing["prefill_seconds"] > 0 and timing["saved_seconds"] > 0
        assert timing["file_bytes"] > timing["kv_bytes"] and 450 < timing["prompt_tokens"] <= 600
    assert whole["kv_bytes"] > 3 * agnostic["kv_bytes"], "the whole prefix vs B·L tokens"
    assert 0 < whole["pass_seconds"] < whole["saved_seconds"], "the pass is part of the saved path"
    assert data["timing_targets"] == [f"INFO {whole['prompt_tokens']}-token prompt: the first-token targets are for "
                                      "16K tokens (--length 16384)"]  # fmt: skip


@pytest.mark.parametrize(
    ("speedup", "pass_seconds", "verdicts"), [(25.0, 2.5, ["PASS", "PASS"]), (9.9, 3.1, ["FAIL", "FAIL"])]
)
def test_first_token_targets_at_16k(speedup, pass_seconds, verdicts):
    row = {"scoring": "question", "prompt_tokens": 16027, "speedup": speedup, "pass_seconds": pass_seconds,
           "saved_seconds": 100 / speedup, "prefill_seconds": 100.0, "repeats": 3, "kv_bits": 4}  # fmt: skip
    agnostic = {**row, "scoring": "instruction", "speedup": 1.0}
    lines = first_token_targets([agnostic, row], "question")
    assert [line.split()[0] for line in lines] == verdicts
    assert f"{speedup:.1f}x sooner" in lines[0] and f"takes {pass_seconds:.2f} s (median of 3" in lines[1]
    assert "the default file (question, 4-bit) gives" in lines[0]


def test_bench_cache_bad_options(cli_env):
    result = runner.invoke(app, ["bench", "cache", "--parts", "speed"])
    assert result.exit_code == 2 and "unknown part" in result.stderr
