"""The embedded SmolLM2-135M-Instruct on real text: the README's main job, end to end."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cake_cli.cli.main import app
from tests.helpers.real import SMOLLM2, real_model_marks
from tests.helpers.texts import license_text

pytestmark = real_model_marks(SMOLLM2)
runner = CliRunner()


def summarize_json(path, shared_home, monkeypatch, *extra):
    monkeypatch.setenv("CAKE_HOME", shared_home)
    monkeypatch.delenv("CAKE_MODEL", raising=False)
    monkeypatch.delenv("CAKE_PROFILES_DIR", raising=False)
    result = runner.invoke(
        app, ["summarize", str(path), "--model", "smollm2", "--budget", "256", "-n", "32", "--json", *extra]
    )
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_summarize_real_text_saves_over_80_percent(tmp_path, shared_home, monkeypatch):
    doc = tmp_path / "LICENSE.txt"
    doc.write_text(license_text(), encoding="utf-8")
    data = summarize_json(doc, shared_home, monkeypatch)
    assert data["prompt_tokens"] >= 2000
    assert data["evicted"] and data["saved_fraction"] >= 0.80
    assert len(data["answer"].split()) >= 5
    assert len(data["layers"]) == 30
    elem = {"float32": 4, "bfloat16": 2}[data["dtype"]]  # auto: bfloat16 on CPUs with native bf16
    assert data["kv_bytes_full"] == data["prompt_tokens"] * 30 * 2 * 3 * 64 * elem  # K+V, 3 KV heads, d 64
    assert sum(layer["budget"] for layer in data["layers"]) >= (256 - 32) * 30 - 30


def test_summarize_real_pdf(tmp_path, shared_home, monkeypatch):
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=10)
    for chunk in license_text().split("\n\n"):  # multi_cell breaks pages by itself
        pdf.multi_cell(0, 5, chunk.encode("latin-1", "replace").decode("latin-1"))
        pdf.ln(2)
    path = tmp_path / "license.pdf"
    pdf.output(str(path))
    data = summarize_json(path, shared_home, monkeypatch)
    assert data["prompt_tokens"] >= 2000
    assert data["saved_fraction"] >= 0.80
    assert len(data["answer"].split()) >= 5


def test_eviction_does_not_collapse_generation_into_one_token(tmp_path, shared_home, monkeypatch):
    """With n-gram blocking off, greedy text under a 256 budget still uses many distinct tokens."""
    doc = tmp_path / "LICENSE.txt"
    doc.write_text(license_text(), encoding="utf-8")
    data = summarize_json(doc, shared_home, monkeypatch, "--no-repeat-ngram", "0")
    words = data["answer"].split()
    assert len(words) >= 10 and len(set(words)) >= 0.3 * len(words)
