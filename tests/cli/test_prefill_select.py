"""`cake qa --prefill select` through the real CLI on the tiny profile: keeping every document token
answers exactly as the normal prefill; fewer tokens are reported with the layer that chose them; bad
settings are one-line errors."""

from __future__ import annotations

import json

import pytest

from cake_cli.engine.selection import default_layer
from tests.helpers.cli import invoke, one_error_line
from tests.helpers.texts import license_text

TINY = ["-m", "tiny-test", "-b", "64", "-n", "6"]
TIMED = ("load_seconds", "prefill_seconds", "eviction_seconds", "decode_seconds", "sampling_seconds")


@pytest.fixture
def doc(cli_env):
    path = cli_env / "notes.txt"
    path.write_text(license_text()[:1300], encoding="utf-8")
    return path


def _untimed(data: dict) -> dict:
    drop = {*TIMED, "selected", "decode_tokens_per_second", "threads_reason", "warnings"}
    return {k: v for k, v in data.items() if k not in drop}


def test_keeping_every_token_answers_as_the_normal_prefill(doc):
    plain = invoke("qa", doc, "Who may copy it?", *TINY, "--json")
    every = invoke("qa", doc, "Who may copy it?", *TINY, "--json", "--prefill", "select", "--select-tokens", "100000")
    assert plain.exit_code == 0 and every.exit_code == 0, every.stderr
    a, b = json.loads(plain.stdout), json.loads(every.stdout)
    assert a["selected"] is None
    assert b["selected"]["kept_tokens"] == b["selected"]["prompt_tokens"] == a["prompt_tokens"]
    assert b["selected"]["layer"] == default_layer(len(a["layers"]))
    assert _untimed(b) == _untimed(a)  # same answer, layers, budgets and KV bytes


def test_fewer_tokens_are_reported_with_their_layer(doc, tiny_profile_dir):
    from transformers import AutoTokenizer

    from cake_cli.tasks.inputs.documents import load_document
    from cake_cli.tasks.templates import build_prompt, load_template

    tokenizer = AutoTokenizer.from_pretrained(tiny_profile_dir.parent / "model")
    prompt = build_prompt(
        tokenizer,
        load_template("qa"),
        load_document(str(doc)).text,
        max_prompt_tokens=10**6,
        question="Who may copy it?",
    )

    result = invoke("qa", doc, "Who may copy it?", *TINY, "--prefill", "select", "--select-tokens", "100",
                    "--select-layer", "1", "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    sel = data["selected"]
    assert sel["layer"] == 1 and sel["prompt_tokens"] == data["prompt_tokens"]
    assert data["prompt_tokens"] == len(prompt.input_ids)
    # 4 sinks, the 100 document tokens chosen, then the instruction, the question and the chat closing
    assert sel["kept_tokens"] == 4 + 100 + len(prompt.input_ids) - prompt.prefix_tokens
    report = invoke("qa", doc, "Who may copy it?", *TINY, "--prefill", "select", "--select-tokens", "100")
    assert report.exit_code == 0, report.stderr
    assert "prefill select" in report.stderr and f"of {data['prompt_tokens']} prompt tokens" in report.stderr


def test_bad_settings_are_one_line_errors(doc, cli_env):
    one_error_line(invoke("qa", doc, "Who?", *TINY, "--prefill", "sideways"), 2, "--prefill mode")
    one_error_line(invoke("qa", doc, "Who?", *TINY, "--select-tokens", "10"), 2, "--prefill select")
    one_error_line(invoke("qa", doc, "Who?", *TINY, "--prefill", "select", "--select-tokens", "0"), 2, ">= 1")
    one_error_line(invoke("qa", doc, "Who?", "Why?", *TINY, "--prefill", "select"), 2, "one question")
    one_error_line(invoke("qa", doc, "Who?", *TINY, "--prefill", "select", "--long", "sections"), 2, "sections")
    late = invoke("qa", doc, "Who?", *TINY, "--prefill", "select", "--select-layer", "99")  # known once loaded
    assert late.exit_code == 1 and late.stdout == "" and "Traceback" not in late.stderr
    assert late.stderr.strip().splitlines()[-1] == "error: --select-layer 99 is past this model's 4 layers — give 0..3"
