"""`cake serve` on the embedded SmolLM2 and real text: the server's answer is the CLI's on the .cake it wrote,
streamed and not, and a second question reuses the compressed document (no prefill of it again)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cake_cli.cli.main import app
from cake_cli.serve.settings import ServeSettings
from cake_cli.tasks.runner import load_ready
from tests.helpers.real import SMOLLM2, real_model_marks
from tests.helpers.texts import license_text

pytestmark = real_model_marks(SMOLLM2)
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.serve.conftest import create_app, live  # noqa: E402 - after the skips

QUESTION = "Which organization holds the copyright of Python?"


def test_served_answer_equals_the_cli_on_real_text(tmp_path, shared_home, monkeypatch):
    monkeypatch.setenv("CAKE_HOME", shared_home)
    monkeypatch.delenv("CAKE_MODEL", raising=False)
    monkeypatch.delenv("CAKE_PROFILES_DIR", raising=False)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "LICENSE.txt").write_text(license_text()[:6000], encoding="utf-8")
    ready = load_ready("smollm2", "auto", "auto", None, None, "auto")
    settings = ServeSettings(documents=docs, model="smollm2")
    with live(create_app(settings, ready, "smollm2")) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
        ask = dict(model="smollm2", max_tokens=24, extra_body={"cake": {"document": "LICENSE.txt", "budget": 256}})
        first = client.chat.completions.create(messages=[{"role": "user", "content": QUESTION}], **ask)
        cake = first.model_extra["cake"]
        assert cake["compressed_now"] is True and cake["saved_fraction"] > 0.5 and cake["document_tokens"] > 1000
        chunks = list(
            client.chat.completions.create(messages=[{"role": "user", "content": QUESTION}], stream=True, **ask)
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
        assert streamed == first.choices[0].message.content
        assert chunks[-1].model_extra["cake"]["compressed_now"] is False
    result = CliRunner().invoke(
        app, ["qa", str(docs / cake["cache"]), QUESTION, "-m", "smollm2", "-b", "256", "-n", "24", "--json"]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["reply"] if data["reply"] is not None else data["answer"]) == first.choices[0].message.content
