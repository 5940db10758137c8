"""The agnostic benchmark (`cake bench cache --parts agnostic`): with nothing evicted (and `grow` decoding,
so no decode step evicts either) every compressed row answers each question exactly as the full cache (the
continuation over a compressed copy is exact); a rerun
resumes; the summary, the pairs against question-aware CAKE and the target lines on hand-made rows; and its
options refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cake_cli.bench.agnostic import report
from cake_cli.bench.agnostic.run import AGNOSTIC, run_documents, single_question
from cake_cli.bench.quality.run import Model
from cake_cli.cli.main import app
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from tests.helpers.models import tiny_llama
from tests.helpers.tiny import build_tiny_tokenizer

runner = CliRunner()


def test_single_question():
    got = single_question("The lucky number of Barna Corbrook is 12345.")
    assert got == "What is the lucky number of Barna Corbrook?"
    assert single_question("The secret passcode of the Dalimere vault is 20001.") == (
        "What is the secret passcode of the Dalimere vault?"
    )


@pytest.mark.slow
def test_with_nothing_evicted_every_row_answers_as_the_full_cache():
    tokenizer = build_tiny_tokenizer()
    lm = tiny_llama(vocab=len(tokenizer))
    use_cake_attention(lm, "sdpa")
    model = Model(lm, tokenizer, 1500, frozenset())
    saved = []

    def grow(budget: int) -> CakeConfig:
        return CakeConfig(budget=budget, window=8, decode_policy="grow")

    data = run_documents(model, grow, [(0, 0.25, 1400)], [1.0], [16, 4], save=saved.append)
    rows = data["rows"]
    assert len(saved) == 1 and len(data["timings"]) == 1
    assert {r["row"] for r in rows} == {"full", "aware", *AGNOSTIC} and {r["question"] for r in rows} == {0, 1, 2, 3}
    full = {r["question"]: r["prediction"] for r in rows if (r["row"], r["bits"]) == ("full", 16)}
    for r in rows:
        if r["row"] in AGNOSTIC and r["bits"] == 16:
            assert r["prediction"] == full[r["question"]], r["row"]
    sizes = {(r["row"], r["bits"]): r["file_bytes"] for r in rows}
    assert sizes[("reconstruct+cake", 4)] < 0.5 * sizes[("reconstruct+cake", 16)] == 0.5 * sizes[("full", 16)]
    again = run_documents(model, grow, [(0, 0.25, 1400)], [1.0], [16, 4], previous=data, save=saved.append)
    assert again["rows"] == rows and len(saved) == 1, "a rerun resumes: nothing is asked twice"


def _row(row, ratio, bits, q, score, size=100, length=1024):
    return dict(doc_id="d", length=length, row=row, ratio=ratio, bits=bits, question=q, score=score, exact=score,
                file_bytes=size, kv_bytes=size, first_token_seconds=0.1)  # fmt: skip


def test_summary_pairs_and_targets():
    rows = [_row("full", None, 16, q, 1.0, 1000) for q in range(2)]
    rows += [_row("aware", 0.25, 16, q, s) for q, s in enumerate((1.0, 0.5))]
    rows += [_row("reconstruct+cake", 0.25, 16, q, s, 400) for q, s in enumerate((1.0, 1.0))]
    rows += [_row("reconstruct+cake", 0.25, 4, q, s, 100) for q, s in enumerate((1.0, 1.0))]
    rows += [_row("end+snapkv", 0.25, 16, q, s, 400) for q, s in enumerate((0.0, 0.5))]
    summary = report.summarize(rows)
    lead = next(s for s in summary if (s["row"], s["bits"]) == ("reconstruct+cake", 16))
    assert (lead["score"], lead["answers"], lead["file_bytes"]) == (100.0, 2, 400)
    pairs = {(p["row"], p["bits"]): (p["wins"], p["ties"], p["losses"]) for p in report.paired(rows)}
    assert pairs[("reconstruct+cake", 16)] == (1, 1, 0) and pairs[("end+snapkv", 16)] == (0, 1, 1)
    timings = [dict(doc_id="d", length=1024, prefill_seconds=1.0, reconstruction_seconds=1.5)]
    lines = report.targets(summary, timings)
    assert any(line.startswith("PASS 1024 tokens, keep 25%: reconstruct+cake 100.0 >= every") for line in lines)
    assert any(line.startswith("PASS") and "95% of the full cache" in line for line in lines)
    assert any(line.startswith("PASS") and "0.250x the 16-bit one" in line for line in lines)
    assert any(line.startswith("FAIL") and "2.50x a plain prefill" in line for line in lines)
    assert any(line.startswith("INFO no 16K-token document") for line in lines)
    rows += [_row("end+cake", 0.25, 16, q, 1.0) for q in range(2)]
    rows[4]["score"] = 0.5  # the lead loses a point to end+cake
    lines = report.targets(report.summarize(rows), [])
    assert any(line.startswith("FAIL 1024 tokens, keep 25%") and "beaten by end+cake 100.0" in line for line in lines)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--parts", "agnostic", "--kv-bits", "3"], "--kv-bits 3"),
        (["--parts", "agnostic", "--ratios", "0"], "--ratios 0"),
        (["--parts", "timing", "--plot", "x.png"], "--plot draws the agnostic part"),
    ],
)
def test_bad_agnostic_options(cli_env, args, words):
    result = runner.invoke(app, ["bench", "cache", "-m", "tiny-test", *args])
    assert result.exit_code == 2 and words in result.stderr and "Traceback" not in result.stderr


def test_the_table_script_prints_the_target_lines_the_cli_saved():
    """`benchmarks/agnostic_table.py` on a finished run file prints the lines `cake bench cache` stored in it."""
    root = Path(__file__).parents[2]
    run_file = root / "benchmarks/runs/agnostic-smollm2-smoke.json"
    saved = json.loads(run_file.read_text())["agnostic"]["targets"]
    env = {"COLUMNS": "400", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, str(root / "benchmarks/agnostic_table.py"), str(run_file)],
                         capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
    printed = [line for line in out.splitlines() if line.startswith(("PASS", "FAIL", "INFO"))]
    assert printed == saved and len(saved) == 11
    assert "documents: d25-n0@1024, d50-n1@1024" in out
