"""`cake summarize` through the real CLI (CliRunner) on a tiny random model profile."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cake_cli.cli.main import app
from tests.helpers.texts import license_text

runner = CliRunner()


@pytest.fixture
def doc(cli_env):
    path = cli_env / "notes.txt"
    path.write_text(license_text()[:4000], encoding="utf-8")
    return path


def test_summarize_streams_answer_to_stdout_and_report_to_stderr(doc):
    result = runner.invoke(app, ["summarize", str(doc), "-m", "tiny-test", "-b", "64", "-n", "12"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip(), "the summary goes to stdout"
    assert "CAKE report" not in result.stdout
    assert "CAKE report · summarize" in result.stderr
    assert "allocation across layers" in result.stderr
    assert "saved" in result.stderr


def test_summarize_json_schema(doc):
    result = runner.invoke(app, ["summarize", str(doc), "-m", "tiny-test", "-b", "64", "-n", "8", "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    for key in (
        "answer",
        "model",
        "prompt_tokens",
        "budget",
        "window",
        "tau1",
        "tau2",
        "tau_rule",
        "layers",
        "kv_bytes_full",
        "kv_bytes_kept",
        "saved_fraction",
        "prefill_seconds",
        "decode_tokens_per_second",
    ):
        assert key in data
    assert data["budget"] == 64 and data["window"] == 8 and data["evicted"] is True
    assert len(data["layers"]) == 4
    kept = [layer["kept"] for layer in data["layers"]]
    budgets = [layer["budget"] for layer in data["layers"]]
    assert kept == [b + 8 for b in budgets]
    assert (64 - 8) * 4 - 4 <= sum(budgets) <= (64 - 8) * 4
    # bytes are measured from the tensors: K+V, 2 KV heads, head dim 8, fp32
    elem = {"float32": 4, "bfloat16": 2}[data["dtype"]]  # auto: bfloat16 on CPUs with native bf16
    assert data["kv_bytes_kept"] == sum(kept) * 2 * 2 * 8 * elem
    assert data["kv_bytes_full"] == data["prompt_tokens"] * 4 * 2 * 2 * 8 * elem
    assert data["saved_fraction"] == pytest.approx(1 - data["kv_bytes_kept"] / data["kv_bytes_full"])
    # taus interpolated log-linearly between B=32 (1.0, 1.0) and B=256 (0.5, 2.0): B=64 is 1/3 of the way
    assert data["tau1"] == pytest.approx(1.0 - 0.5 / 3) and data["tau2"] == pytest.approx(1.0 + 1.0 / 3)
    assert "interpolated" in data["tau_rule"]


def test_summarize_reads_stdin(doc):
    text = doc.read_text()
    via_stdin = runner.invoke(app, ["summarize", "-", "-m", "tiny-test", "-b", "64", "-n", "6", "--json"], input=text)
    via_file = runner.invoke(app, ["summarize", str(doc), "-m", "tiny-test", "-b", "64", "-n", "6", "--json"])
    assert via_stdin.exit_code == 0, via_stdin.stderr
    assert json.loads(via_stdin.stdout)["answer"] == json.loads(via_file.stdout)["answer"]
    assert json.loads(via_stdin.stdout)["prompt_tokens"] == json.loads(via_file.stdout)["prompt_tokens"]


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["summarize", "missing.txt", "-m", "tiny-test"], 1, "missing.txt"),
        (["summarize", "{doc}", "-m", "tiny-test", "-b", "4"], 2, "window"),
        (["summarize", "{doc}", "-m", "no-such-model"], 2, "no-such-model"),
        (["summarize", "{doc}", "-m", "tiny-test", "--decode-policy", "shrink"], 2, "decode policy"),
    ],
)
def test_bad_input_is_one_line_without_traceback(doc, args, code, words):
    result = runner.invoke(app, [a.replace("{doc}", str(doc)) for a in args])
    assert result.exit_code == code
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0]
