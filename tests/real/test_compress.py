"""Saved caches with the embedded SmolLM2-135M-Instruct on real text (two short prefills).

With nothing evicted, an answer from a .cake (prefix prefilled once, the question run as a
continuation) is the answer of `cake qa DOC` (one prefill of the whole prompt): the prompt's split
tokenization changes no id and the continuation computes the same attention. The weights are int8
(multiplied in float32): with w8a8, which quantizes each activation row to 8 bits, the float noise
between a continuation's attention and a whole prefill's can move a code by one step, and on an AMX
host that flipped the 24th greedy token (an end of turn against " m").
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cake_cli.cli.main import app
from tests.helpers.real import NEEDLE, SMOLLM2, real_model_marks
from tests.helpers.texts import license_text

pytestmark = real_model_marks(SMOLLM2)
runner = CliRunner()
QUESTION = "What is the best thing to do in San Francisco?"
MODEL = ["--model", "smollm2", "--dtype", "float32", "--weights", "int8", "-n", "24"]


def run(monkeypatch, home, *args) -> dict:
    monkeypatch.setenv("CAKE_HOME", home)
    monkeypatch.delenv("CAKE_MODEL", raising=False)
    monkeypatch.delenv("CAKE_PROFILES_DIR", raising=False)
    result = runner.invoke(app, [str(a) for a in args] + ["--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_cake_file_without_eviction_answers_as_the_document(tmp_path, monkeypatch, shared_home):  # noqa: F811
    text = license_text()[:2500]
    doc = tmp_path / "license.txt"
    doc.write_text(text[:1200] + " " + NEEDLE + " " + text[1200:], encoding="utf-8")
    cake = tmp_path / "license.cake"
    saved = run(monkeypatch, shared_home, "compress", doc, "-o", cake, *MODEL[:6], "-b", "4096")
    assert not saved["evicted"] and saved["file_ratio"] < 1.05 + 200_000 / saved["kv_bytes_kept"]
    on_cake = run(monkeypatch, shared_home, "qa", cake, QUESTION, *MODEL[4:])
    on_doc = run(monkeypatch, shared_home, "qa", doc, QUESTION, *MODEL, "-b", "4096")
    assert on_cake["answer"] == on_doc["answer"] and on_cake["prompt_tokens"] == on_doc["prompt_tokens"]
    assert "sandwich" in on_cake["answer"].lower() or "dolores" in on_cake["answer"].lower()
