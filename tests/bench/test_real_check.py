"""`cake bench quality --suite real --abstain checked|doubt`: every reply of a document read whole carries
the check pass's P(yes) or the abstention probability, and its rows are scored as `abstain.decide` rules
with it (a rescore of the stored replies with their checks gives the same abstentions); `cake qa` refuses
the benchmark-only mode (checked) in one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
from cake_cli.bench.quality.abstention import rescore
from cake_cli.bench.real_docs import load_set, read_document
from cake_cli.cli.main import app
from cake_cli.tasks.answers.abstain import CHECKED, DOUBT

runner = CliRunner()


@pytest.mark.parametrize("mode", [CHECKED, DOUBT])
def test_the_real_suite_stores_the_check_and_scores_with_it(cli_env, mode):
    out = cli_env / "real.json"
    args = ["bench", "quality", "--suite", "real", "--model", "tiny-test", "--threads", "1", "--quick"]
    args += ["--documents", "python-textwrap", "--lengths", "600", "--window", "16", "--budgets", "96"]
    args += ["--methods", "full,cake", "--abstain", mode, "--output", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 and all(0.0 <= r["check"] <= 1.0 for r in rows)
    doc = next(d for d in load_set().documents if d.id == "python-textwrap")
    questions = {q.id: (q.question, q.answers) for q in doc.questions}
    again = rescore(rows, mode, {doc.id: read_document(doc).text}, questions)
    assert [r["abstained"] for r in again] == [r["abstained"] for r in rows]


@pytest.mark.parametrize("mode", [CHECKED])
def test_cake_qa_refuses_the_benchmark_only_mode(cli_env, mode):
    doc = cli_env / "notes.txt"
    doc.write_text("The lighthouse was lit in 1871.", encoding="utf-8")
    result = runner.invoke(app, ["qa", str(doc), "When was it lit?", "-m", "tiny-test", "--abstain", mode])
    assert result.exit_code == 2 and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"--abstain mode '{mode}'" in lines[0]
    assert "never, foreign, unsupported, doubt" in lines[0]
