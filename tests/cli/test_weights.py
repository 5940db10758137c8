"""`--weights` through the real CLI on the tiny profile: what the report and JSON say, the cache
under CAKE_HOME, and a bad name refused in one line."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import TINY, flat, invoke, one_error_line
from tests.helpers.models import needs_fbgemm
from tests.helpers.texts import license_text


@pytest.fixture
def doc(cli_env):
    path = cli_env / "notes.txt"
    path.write_text(license_text()[:3000], encoding="utf-8")
    return path


def test_int8_weights_are_reported_and_cached_once(doc, cli_env):
    first = invoke("summarize", doc, *TINY, "-b", "64", "-n", "6", "--weights", "int8", "--json")
    assert first.exit_code == 0, first.stderr
    data = json.loads(first.stdout)
    assert (data["weights"], data["weights_reason"]) == ("int8", "asked for (--weights)")
    cached = list(cli_env.rglob("int8-*.safetensors"))
    assert len(cached) == 1
    again = invoke("summarize", doc, *TINY, "-b", "64", "-n", "6", "--weights", "int8")
    assert again.exit_code == 0, again.stderr
    assert "int8 weights read from" in again.stderr
    assert "weights int8 linear layers · asked for (--weights)" in flat(again.stderr)
    assert list(cli_env.rglob("int8-*.safetensors")) == cached


@needs_fbgemm
def test_w8a8_is_reported_and_built_from_int8s_cache(doc, cli_env):
    first = invoke("summarize", doc, *TINY, "-b", "64", "-n", "6", "--weights", "int8")
    assert first.exit_code == 0, first.stderr
    cached = list(cli_env.rglob("*.safetensors"))
    result = invoke("summarize", doc, *TINY, "-b", "64", "-n", "6", "--weights", "W8A8", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["weights"], data["weights_reason"]) == ("w8a8", "asked for (--weights)")
    assert "w8a8 weights read from" in result.stderr and "int8-g" in flat(result.stderr)
    assert list(cli_env.rglob("*.safetensors")) == cached  # no second quantization, no second file


def test_auto_keeps_a_tiny_model_in_its_dtype_and_says_why(doc):
    result = invoke("summarize", doc, *TINY, "-b", "64", "-n", "4", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["weights"] == "bf16" and data["weights_reason"].startswith("auto: ")
    assert "fit the CPU caches" in data["weights_reason"]


def test_an_unknown_weight_format_is_one_line(doc):
    one_error_line(invoke("summarize", doc, *TINY, "--weights", "int3"), 2, "unknown weight format 'int3'")
