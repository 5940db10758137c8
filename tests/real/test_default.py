"""The embedded default model (Qwen2.5-Coder-0.5B-Instruct) on real text: README's main job, end to end.

The other real-model tests use SmolLM2 (smaller, faster); this one runs what `scripts/demo.sh` runs, so CI
checks the default model too: its six part wheels joined and converted once (into the run's CAKE_HOME,
fresh unless CAKE_HOME is set), then `cake summarize` of CPython's LICENSE.txt at B = 512, the
demo's command exactly: its summary is a newcomer's first sight of the tool, so it must say what the
document is (issue 49): at least three of the named facts below.
"""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from cake_cli.cli.main import app
from tests.helpers.real import DEFAULT_MODEL, real_model_marks
from tests.helpers.texts import license_text

pytestmark = real_model_marks(DEFAULT_MODEL)

# What a good summary of LICENSE.txt names (issue 49), each as the words that can say it.
LICENCE_FACTS = {
    "the Python Software Foundation": r"python software foundation|\bpsf\b",
    "the licence agreement's terms": r"licen[cs]e agreement|terms and conditions|terms of (the|its|use)",
    "the history of Python's releases or licences": r"histor|releases?\b|\b19\d\d\b|cwi|cnri|beopen|guido",
    "the BSD / Zero-Clause licence": r"\bbsd\b|zero-clause",
}


def named_facts(summary: str) -> list[str]:
    """The LICENCE_FACTS a summary names."""
    return [fact for fact, words in LICENCE_FACTS.items() if re.search(words, summary.lower())]


def test_the_fact_check_reads_a_summary():
    good = "The Python Software Foundation's licence agreement, its history since 1991 and the Zero-Clause BSD licence."
    assert named_facts(good) == list(LICENCE_FACTS)
    assert named_facts("The document provides a comprehensive overview of Python.") == []


def test_default_model_summarizes_the_licence(tmp_path, shared_home, monkeypatch):
    monkeypatch.setenv("CAKE_HOME", shared_home)
    for name in ("CAKE_MODEL", "CAKE_PROFILES_DIR"):
        monkeypatch.delenv(name, raising=False)
    doc = tmp_path / "LICENSE.txt"
    doc.write_text(license_text(), encoding="utf-8")
    result = CliRunner().invoke(app, ["summarize", str(doc), "--budget", "512", "--json"])  # scripts/demo.sh
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"].startswith("qwen2.5-coder-0.5b")
    assert len(data["layers"]) == 24 and data["prompt_tokens"] >= 3000
    assert data["evicted"] and data["saved_fraction"] >= 0.80  # 512 of ~3.4K tokens per layer kept, window included
    elem = {"float32": 4, "bfloat16": 2}[data["dtype"]]
    assert data["kv_bytes_full"] == data["prompt_tokens"] * 24 * 2 * 2 * 64 * elem  # K+V, 2 KV heads, d 64
    assert len(named_facts(data["answer"])) >= 3, (named_facts(data["answer"]), data["answer"])
