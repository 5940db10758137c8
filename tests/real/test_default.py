"""The embedded default model (Qwen2.5-Coder-0.5B-Instruct) on real text: README's main job, end to end.

The other real-model tests use SmolLM2 (smaller, faster); this one runs what `scripts/demo.sh` runs, so CI
checks the default model too: its six part wheels joined and converted once (into the run's CAKE_HOME,
fresh unless CAKE_HOME is set), then `cake summarize` of CPython's LICENSE.txt at B = 512.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cake_cli.cli.main import app
from tests.helpers.real import DEFAULT_MODEL, real_model_marks
from tests.helpers.texts import license_text

pytestmark = real_model_marks(DEFAULT_MODEL)


def test_default_model_summarizes_the_licence(tmp_path, shared_home, monkeypatch):
    monkeypatch.setenv("CAKE_HOME", shared_home)
    for name in ("CAKE_MODEL", "CAKE_PROFILES_DIR"):
        monkeypatch.delenv(name, raising=False)
    doc = tmp_path / "LICENSE.txt"
    doc.write_text(license_text(), encoding="utf-8")
    result = CliRunner().invoke(app, ["summarize", str(doc), "--budget", "512", "-n", "96", "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"].startswith("qwen2.5-coder-0.5b")
    assert len(data["layers"]) == 24 and data["prompt_tokens"] >= 3000
    assert data["evicted"] and data["saved_fraction"] >= 0.80  # 512 of ~3.4K tokens per layer kept, window included
    elem = {"float32": 4, "bfloat16": 2}[data["dtype"]]
    assert data["kv_bytes_full"] == data["prompt_tokens"] * 24 * 2 * 2 * 64 * elem  # K+V, 2 KV heads, d 64
    answer = data["answer"].lower()
    assert "python" in answer and ("licen" in answer or "terms" in answer), data["answer"]
