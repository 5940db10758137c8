"""`cake bench speed --openvino` without OpenVINO installed: what the runner script is asked for, the two
rows read back from its JSON, the one warning line when it is not set up, and the target lines."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

from cake_cli.bench.speed import openvino, paths
from cake_cli.bench.speed.report import ratios
from cake_cli.bench.speed.targets import openvino_lines
from cake_cli.cli.runners import bench_speed as runner
from tests.bench.test_speed_targets import row, verdicts


def _script_row(budget, prefill, tps) -> dict:
    return {
        "prefill_seconds": prefill[1],
        "ttft_seconds": prefill[1],
        "decode_tokens_per_second": tps[1],
        "decode_steps": 31,
        "context_tokens": 8192,
        "budget": budget,
        "repeats": 3,
        "settings": {"threads": 2},
        "samples": {"prefill_seconds": prefill, "ttft_seconds": prefill, "decode_tokens_per_second": tps},
    }


def test_openvino_rows_ask_for_our_budget_window_and_warm_up(monkeypatch, tmp_path):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        rows = [_script_row(None, [20.0, 21.0, 22.0], [30.0, 31.0, 32.0]),
                _script_row(256, [19.0, 20.0, 21.0], [40.0, 41.0, 42.0])]  # fmt: skip
        out = {"rows": rows, "openvino_genai": "2026.4.1"}
        return subprocess.CompletedProcess(cmd, 0, stdout="exporting…\n" + json.dumps(out) + "\n", stderr="")

    monkeypatch.setattr(openvino, "available", lambda: True)
    monkeypatch.setattr(paths.subprocess, "run", fake_run)
    full, evict = openvino.openvino_rows(
        tmp_path / "qwen-ckpt", [1, 2, 3], 256, 32, "m · bfloat16+int8 · openvino", new_tokens=32, threads=(2, 1)
    )
    cmd = seen["cmd"]
    value = {flag: cmd[cmd.index(flag) + 1] for flag in ("--budget", "--window", "--threads", "--warmup-tokens")}
    assert value == {"--budget": "256", "--window": "32", "--threads": "2", "--warmup-tokens": "256"}
    assert cmd[cmd.index("--ir-dir") + 1] == str(tmp_path / "home" / "models" / "openvino" / "qwen-ckpt-int8")
    assert (full.method, full.budget, evict.method, evict.budget) == ("openvino-full", None, "openvino-evict", 256)
    assert evict.decode_tokens_per_second == 41.0 and evict.samples["prefill_seconds"] == (19.0, 20.0, 21.0)
    assert full.length == 8192 and full.threads == "2/2"


def test_without_the_venv_one_warning_line_and_no_rows(monkeypatch):
    monkeypatch.setattr(openvino, "available", lambda: False)
    warnings: list[str] = []
    loaded = SimpleNamespace(path="ckpt")
    setup = SimpleNamespace(new_tokens=32, repeats=3)
    base = SimpleNamespace(budget=256, window=32)
    threads = SimpleNamespace(prefill=2, decode=2)
    rows = runner._openvino_rows(loaded, list(range(9000)), [1024, 8192], "m · bf16", base, threads, setup,
                                 lambda label: None, warnings.append)  # fmt: skip
    assert rows == []
    assert warnings == [
        "OpenVINO GenAI: OpenVINO GenAI is not set up — run `bash benchmarks/openvino_env.sh` (it makes .venv-openvino)"
    ]


def test_openvino_lines_pair_cake_with_its_eviction_and_full_with_its_full_cache():
    rows = [
        row("m · bf16 · engine", 8192, "cake", [30.0] * 3, [38.0, 37.0, 36.0]),
        row("m · bf16 · engine", 8192, "full", [30.0] * 3, [27.0] * 3),
        row("m · bf16 · openvino", 8192, "openvino-evict", [40.0] * 3, [30.0] * 3),
        row("m · bf16 · openvino", 8192, "openvino-full", [40.0] * 3, [36.0, 35.0, 30.0]),
    ]
    lines = openvino_lines(ratios(rows))
    assert verdicts(lines) == ["PASS", "PASS", "within noise"]
    assert "cake at 8192 tokens vs OpenVINO GenAI (eviction, B=256): decode 1.23x" in lines[0]
    assert "prefill time 0.75x" in lines[1]
    assert "full at 8192 tokens vs OpenVINO GenAI (full cache): decode 0.77x" in lines[2]


def test_the_other_engines_scripts_are_found_in_the_checkout():
    """The runner scripts sit in the checkout's benchmarks/ (their venvs are made there too)."""
    assert paths.KVPRESS_SCRIPT.is_file() and openvino.OPENVINO_SCRIPT.is_file()
    assert (paths.REPO / "benchmarks" / "openvino_env.sh").is_file()
