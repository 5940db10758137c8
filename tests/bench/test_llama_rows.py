"""llama.cpp beside our rows (`cake bench speed --llama`): its target lines on synthetic rows (every
ratio known), and the one-line reasons where it cannot run. No model runs here."""

from __future__ import annotations

import pytest

from cake_cli.bench.speed import llama
from cake_cli.bench.speed.report import ratios
from cake_cli.bench.speed.targets import llama_lines
from cake_cli.errors import CakeError
from tests.bench.test_speed_targets import row

QWEN = "qwen2.5-coder-0.5b · bfloat16+int8"


def _rows(cake_tps: float, full_tps: float, llama_tps: float, length: int = 7900) -> list[dict]:
    three = [1.0, 1.02, 0.98]
    return ratios(
        [
            row(f"{QWEN} · engine", length, "cake", [50 * x for x in three], [cake_tps * x for x in three]),
            row(f"{QWEN} · engine", length, "full", [49 * x for x in three], [full_tps * x for x in three]),
            row(f"{QWEN} · llama.cpp", length + 40, "llama.cpp", [100 * x for x in three], [llama_tps] * 3),
        ]
    )


def test_llama_lines_pass_and_fail_by_the_issue_targets():
    lines = llama_lines(_rows(cake_tps=30.0, full_tps=15.0, llama_tps=23.0))
    assert len(lines) == 3
    cake_decode, cake_prefill, full_decode = lines
    assert cake_decode.startswith("PASS") and "decode 1.30x" in cake_decode and "target >= 1.00x" in cake_decode
    assert cake_prefill.startswith("PASS") and "prefill time 0.50x" in cake_prefill  # 50 s vs 100 s
    assert full_decode.startswith("FAIL") and "decode 0.65x" in full_decode and "target >= 0.80x" in full_decode


def test_rows_of_one_set_of_rounds_are_compared_round_by_round():
    """llama.cpp timed in our rounds: a slow round slows both rows, so every round's ratio is 1.3x, where
    pairing every repeat with every other would span 0.87x-1.95x."""
    speeds = [1.0, 1.5, 1.0]
    mine = row(f"{QWEN} · engine", 7900, "cake", [50.0] * 3, [30.0 * x for x in speeds], rounds="r1")
    full = row(f"{QWEN} · engine", 7900, "full", [49.0] * 3, [15.0 * x for x in speeds], rounds="r1")
    theirs = row(f"{QWEN} · llama.cpp", 7900, "llama.cpp", [100.0] * 3, [23.0 * x for x in speeds], rounds="r1")
    cake_decode = llama_lines(ratios([mine, full, theirs]))[0]
    assert cake_decode.startswith("PASS") and "decode 1.30x (min 1.30x, max 1.30x over 3 runs" in cake_decode
    apart = row(f"{QWEN} · llama.cpp", 7900, "llama.cpp", [100.0] * 3, [23.0 * x for x in speeds])
    assert llama_lines(ratios([mine, full, apart]))[0].startswith("within noise")


def test_at_32k_cake_needs_one_and_a_half_times_llama_and_full_is_not_judged():
    lines = llama_lines(_rows(cake_tps=30.0, full_tps=15.0, llama_tps=23.0, length=32000))
    assert len(lines) == 2 and lines[0].startswith("FAIL") and "target >= 1.50x" in lines[0]


def test_no_llama_row_no_lines():
    rows = [r for r in _rows(30.0, 15.0, 23.0) if r["method"] != "llama.cpp"]
    assert llama_lines(rows) == []


def test_missing_llama_cpp_is_one_line_with_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(llama.importlib.util, "find_spec", lambda name: None)
    assert llama.missing() == "llama-cpp-python is not installed"
    with pytest.raises(CakeError) as exc:
        llama.LlamaEngine(tmp_path / "m.gguf", [1, 2, 3], "g", lengths=[3], new_tokens=4, threads=(1, 1))
    assert "\n" not in str(exc.value) and ".[llama]" in exc.value.hint


def test_a_model_without_gguf_is_refused_in_one_line(tmp_path):
    with pytest.raises(CakeError, match="needs a GGUF model"):
        llama.model_gguf(str(tmp_path), None, tmp_path)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert llama.model_gguf(str(gguf), None, tmp_path) == gguf


def test_a_llama_cpp_that_does_not_import_says_why(monkeypatch):
    monkeypatch.setattr(llama.importlib.util, "find_spec", lambda name: object())

    def broken(name):
        raise ImportError("No module named 'diskcache'")

    monkeypatch.setattr(llama.importlib, "import_module", broken)
    assert llama.missing() == "llama-cpp-python does not import (No module named 'diskcache')"
