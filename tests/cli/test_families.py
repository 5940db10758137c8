"""The new families through the real CLI on tiny saved models: `cake qa` and `cake inspect-layers`
on a Gemma 3 (local layers shown with their window and no budget), a Gemma 2 (eager), a sliding-
window Mistral (prompt limited to the window), and what `cake env` / `cake profiles list` say."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from cake_cli.cli.main import app
from cake_cli.tasks.templates import build_prompt, load_template
from tests.helpers.texts import license_file
from tests.helpers.tiny import save_tiny_model

runner = CliRunner()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {
        "gemma3": save_tiny_model(root / "gemma3", arch="gemma3_text", layers=6),  # local: 0, 1, 3, 4
        "gemma2": save_tiny_model(root / "gemma2", arch="gemma2", layers=4),
        "qwen3": save_tiny_model(root / "qwen3", arch="qwen3", layers=2),
        "phi3": save_tiny_model(root / "phi3", arch="phi3", layers=2),
        "mistral": save_tiny_model(root / "mistral", arch="mistral", layers=2, sliding_window=300),
    }


@pytest.fixture
def doc(cli_env):
    return license_file(cli_env, 1500)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("name", ["gemma3", "gemma2", "qwen3", "phi3"])
def test_qa_runs_end_to_end(models, doc, name):
    result = invoke(
        "qa", doc, "Who holds the copyright?", "--model", models[name], "-b", 48, "-w", 8, "-n", 4, "--json"
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["evicted"] and data["generated_tokens"] >= 1 and data["kv_bytes_kept"] < data["kv_bytes_full"]
    assert data["attention"] == ("eager" if name == "gemma2" else "sdpa")
    assert "no profile for" in data["warnings"][0] and "tau1 = tau2 = 1.0" in data["warnings"][0]
    local = [row for row in data["layers"] if row["window"] is not None]
    if name.startswith("gemma"):
        assert local and all(row["budget"] is None and row["kept"] == 7 and row["window"] == 8 for row in local)
    else:
        assert not local


def test_inspect_layers_shows_local_layers_with_their_window(models, doc):
    result = invoke("inspect-layers", doc, "--model", models["gemma3"], "-b", 48, "-w", 8, "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    windows = [row["window"] for row in data["layers"]]
    assert windows == [8, 8, None, 8, 8, None]
    assert data["evictable_total"] == (48 - 8) * 2  # the budget is shared by the 2 global layers only
    assert data["evictable_total"] - 2 <= data["budget_sum"] <= data["evictable_total"]
    assert data["budget_sum"] == sum(row["budget"] for row in data["layers"] if row["window"] is None)
    view = invoke("inspect-layers", doc, "--model", models["gemma3"], "-b", 48, "-w", 8)
    assert view.exit_code == 0
    assert view.stdout.count("local 8") == 4 and "sliding-window layer, no budget" in view.stdout
    assert "global layers only" in view.stdout


def test_gemma_prompts_use_the_gemma_chat_template(models):
    tokenizer = AutoTokenizer.from_pretrained(models["gemma3"])
    prompt = build_prompt(tokenizer, load_template("qa"), "A short note.", max_prompt_tokens=1000, question="Who?")
    text = tokenizer.decode(prompt.input_ids)
    assert text.startswith("<|im_start|><start_of_turn>user\n") and text.endswith("<start_of_turn>model\n")


def test_a_sliding_window_on_every_layer_limits_the_prompt(models, cli_env):
    long = license_file(cli_env, 6000, "long.txt")
    refused = invoke("qa", long, "Who?", "--model", models["mistral"], "-b", 64, "-n", 8, "--truncate", "error")
    assert refused.exit_code == 1 and refused.stdout == ""
    error = refused.stderr.strip().splitlines()[-1]  # after the loading status and the no-profile warning
    assert error.startswith("error: the prompt has") and "more than this model's limit of 292" in error  # 300 - 8
    cut = invoke("qa", long, "Who?", "--model", models["mistral"], "-b", 64, "-n", 8, "--json")
    assert cut.exit_code == 0, cut.stderr
    data = json.loads(cut.stdout)
    assert data["prompt_tokens"] <= 292 and any("cut" in w or "truncat" in w for w in data["warnings"])


def test_env_and_profiles_list_name_the_families(cli_env):
    env = json.loads(invoke("env", "--json").stdout)
    families = {f["model_type"]: f for f in env["model_families"]}
    assert set(families) == {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3"}
    assert families["gemma3_text"]["gguf_architecture"] == "gemma3" and "local" in families["gemma3_text"]["notes"]
    assert "Gemma 3 (local sliding layers" in invoke("env").stdout
    listed = invoke("profiles", "list")
    assert listed.exit_code == 0
    assert "Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3" in " ".join(listed.stdout.split())
