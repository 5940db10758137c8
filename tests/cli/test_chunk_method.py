"""`--method cake-chunk` through `cake qa` and `cake bench quality` on the tiny random model (CliRunner)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
from cake_cli.bench.suites import Variant, parse_variants
from cake_cli.cli.main import app
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.methods import METHODS, PAPER_METHODS
from cake_cli.errors import UsageError
from tests.helpers.texts import license_text

runner = CliRunner()


def qa_json(doc, *extra):
    args = ["qa", str(doc), "Who may copy it?", "-m", "tiny-test", "-n", "4", "-b", "48", "--json", *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_qa_runs_cake_chunk_with_cakes_budgets(cli_env):
    doc = cli_env / "notes.txt"
    doc.write_text(license_text()[:3000], encoding="utf-8")
    chunk = qa_json(doc, "--method", "cake-chunk")
    cake = qa_json(doc, "--method", "cake")
    assert (chunk["method"], chunk["allocation"], chunk["indicator"]) == ("cake-chunk", "cake", "chunk")
    budgets = [layer["budget"] for layer in chunk["layers"]]
    assert sum(budgets) == (48 - 8) * 4  # the tiny profile: w = 8, 4 layers
    assert budgets == [layer["budget"] for layer in cake["layers"]]  # the indicator changes no budget
    pairing = qa_json(doc, "--method", "cake+chunk")
    assert pairing["method"] == "cake-chunk"  # the pairing has the method's name


def test_bench_quality_runs_cake_chunk_only_when_named(cli_env):
    assert "cake-chunk" in METHODS and "cake-chunk" not in PAPER_METHODS
    args = ["bench", "quality", "--model", "tiny-test", "--haystack", "python-docs", "--tasks", "s-rt"]
    args += ["--lengths", "400", "--depths", "0.5", "--repeats", "1", "--threads", "1", "--budgets", "32"]
    result = runner.invoke(app, [*args, "--methods", "cake,cake-chunk", "--json"])
    assert result.exit_code == 0, result.stderr
    scores = {(s["method"], s["budget"]) for s in json.loads(result.stdout)["summary"]["scores"]}
    assert {("cake", 32), ("cake-chunk", 32)} <= scores


def test_a_variant_overrides_the_chunk_size():
    (variant,) = parse_variants("cake-chunk")
    assert (variant.allocation, variant.indicator) == ("cake", "chunk")
    base = CakeConfig(budget=64)
    assert variant.config(base).chunk == 10
    wider = Variant("cake-chunk-20", "cake", "chunk", chunk=20)
    assert (wider.config(base).indicator, wider.config(base).chunk) == ("chunk", 20)
    named = parse_variants("full,cake-chunk:20,cake-chunk:5")
    assert [(v.name, v.chunk) for v in named] == [("full", None), ("cake-chunk:20", 20), ("cake-chunk:5", 5)]
    assert (named[1].config(base).allocation, named[1].config(base).indicator, named[1].config(base).chunk) == (
        "cake", "chunk", 20
    )  # fmt: skip
    for bad in ("cake-chunk:0", "cake-chunk:x", "cake-chunk:"):
        with pytest.raises(UsageError, match="chunk size must be a whole number"):
            parse_variants(bad)
