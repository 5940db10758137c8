"""`cake inspect-layers` on the tiny profile: its numbers are the engine's, budgets sum to (B - w)·L."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from cake_cli.cli.main import app
from tests.helpers.cli import runner

B, W, L = 64, 8, 4  # --budget, tiny-test's window, its layers
ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s+(\S+)\s+(\S+)%\s+(\d+)\s+(\d+)\s+\S*\s*$")


@pytest.fixture
def engine_rows(doc):
    """Prefill the same prompt directly through the engine: the oracle for the CLI's numbers."""
    from cake_cli.engine.attention import use_cake_attention
    from cake_cli.engine.config import CakeConfig
    from cake_cli.engine.generate import prefill
    from cake_cli.models.loader import load_model
    from cake_cli.tasks.inputs.documents import load_document
    from cake_cli.tasks.templates import build_prompt, load_template

    loaded = load_model("tiny-test")
    use_cake_attention(loaded.model, "sdpa")
    profile = loaded.profile
    prompt = build_prompt(
        loaded.tokenizer,
        load_template("summarize"),
        load_document(str(doc)).text,
        max_prompt_tokens=profile.max_prompt_tokens,
    )
    taus = profile.taus_for(B)
    config = CakeConfig(
        budget=B,
        window=W,
        tau1=taus.tau1,
        tau2=taus.tau2,
        gamma=profile.gamma,
        pool_kind=profile.pooling.kind,
        pool_kernel=profile.pooling.kernel,
    )
    return prefill(loaded.model, torch.tensor([prompt.input_ids]), config).rows()


def shares(rows):
    logs = [row.stats.log_preference for row in rows]
    top = max(logs)
    weights = [math.exp(x - top) for x in logs]
    return [w / sum(weights) for w in weights]


def test_json_numbers_are_the_engines(doc, engine_rows):
    result = runner.invoke(app, ["inspect-layers", str(doc), "-m", "tiny-test", "-b", str(B), "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["evicted"] and data["budget"] == B and data["window"] == W and len(data["layers"]) == L
    assert data["evictable_total"] == (B - W) * L
    assert data["evictable_total"] - L <= data["budget_sum"] <= data["evictable_total"]
    assert data["budget_sum"] == sum(layer["budget"] for layer in data["layers"])
    for layer, row, share in zip(data["layers"], engine_rows, shares(engine_rows)):
        assert layer["layer"] == row.layer
        assert layer["dispersion"] == pytest.approx(row.stats.dispersion, rel=1e-6)
        assert layer["shift"] == pytest.approx(row.stats.shift, rel=1e-6)
        assert layer["preference_share"] == pytest.approx(share, rel=1e-6)
        assert layer["budget"] == row.budget and layer["kept"] == row.kept == row.budget + W
    elem = {"float32": 4, "bfloat16": 2}[data["dtype"]]  # auto: bfloat16 on CPUs with native bf16
    assert data["kv_bytes_kept"] == sum(row.kept for row in engine_rows) * 2 * 2 * 8 * elem  # K+V, 2 KV heads, d 8
    assert data["template"] == "summarize" and data["document"] == str(doc)


def test_table_on_stdout_shows_the_engines_numbers(doc, engine_rows):
    result = runner.invoke(app, ["inspect-layers", str(doc), "-m", "tiny-test", "-b", str(B)])
    assert result.exit_code == 0, result.stderr
    assert "CAKE layer inspector" in result.stdout and "allocation across layers" in result.stdout
    assert "inspector" not in result.stderr and "prefill" in result.stderr  # progress on stderr
    rows = [ROW.match(line).groups() for line in result.stdout.splitlines() if ROW.match(line)]
    assert len(rows) == L
    for (layer, h, v, p, b, kept), row, share in zip(rows, engine_rows, shares(engine_rows)):
        assert int(layer) == row.layer
        assert h == f"{row.stats.dispersion:.0f}" and v == f"{row.stats.shift:.1e}"
        assert p == f"{share * 100:.1f}"
        assert int(b) == row.budget and int(kept) == row.kept
    total = sum(row.budget for row in engine_rows)
    assert f"sum of B_l = {total} of (B - w)·L = {(B - W) * L}" in result.stdout


def test_default_document_is_the_packaged_sample(cli_env):
    result = runner.invoke(app, ["inspect-layers", "-m", "tiny-test", "--json", "-q"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["document"].endswith("gull-rock.txt") and data["evicted"]


def test_stdin_and_nothing_evicted_when_the_prompt_fits(cli_env):
    result = runner.invoke(
        app, ["inspect-layers", "-", "-m", "tiny-test", "-b", "1024", "--json"], input="A short note about caches."
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert not data["evicted"] and data["budget_sum"] is None and data["saved_fraction"] == 0
    assert all(layer["budget"] is None and layer["kept"] == data["prompt_tokens"] for layer in data["layers"])
    table = runner.invoke(app, ["inspect-layers", "-", "-m", "tiny-test", "-b", "1024"], input="A short note.")
    assert "nothing evicted" in table.stdout


def test_missing_weights_give_the_download_command(cli_env, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    result = runner.invoke(app, ["inspect-layers", "--model", "mistral"])
    assert result.exit_code == 1 and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "not downloaded" in lines[0]
    assert "hf download mistralai/Mistral-7B-Instruct-v0.3" in lines[0]


@pytest.mark.parametrize(
    "args, code",
    [(["-b", "4"], 2), (["-w", "0"], 2), (["--truncate", "x"], 2), (["missing.txt"], 1), (["-m", "no-such-model"], 2)],
)
def test_bad_input_exit_codes(cli_env, args, code):
    result = runner.invoke(app, ["inspect-layers", *(["-m", "tiny-test"] if "-m" not in args else []), *args])
    assert result.exit_code == code and result.stdout == "" and "Traceback" not in result.stderr


def test_narrow_terminals_keep_every_number(doc):
    result = runner.invoke(app, ["inspect-layers", str(doc), "-m", "tiny-test", "-b", str(B)], env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    rows = [r for r in rows if len(r) >= 6 and r[0].isdigit() and int(r[0]) < L]
    assert [int(r[0]) for r in rows] == list(range(L))
    assert all(int(r[5]) == int(r[4]) + W for r in rows)  # kept = B_l + w, nothing cut
    assert "…" not in result.stdout


def test_piped_speed_table_is_complete(cli_env):
    result = runner.invoke(
        app,
        ["bench", "speed", "-m", "tiny-test", "-b", "32", "--lengths", "200", "--repeats", "1", "--new-tokens", "3"],
    )
    assert result.exit_code == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if "prefill s" in line)
    for column in ("tokens", "method", "TTFT s", "decode tok/s", "KV kept", "evict s", "threads"):
        assert column in header
    assert "…" not in result.stdout
    assert (
        sum(
            line.split()[1] in ("full", "cake", "snapkv")
            for line in result.stdout.splitlines()
            if line.split()[:1] == ["200"]
        )
        == 3
    )
