"""benchmarks/model_versus.py: two models' exact answers paired by question."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "model_versus.py"
spec = importlib.util.spec_from_file_location("model_versus", SCRIPT)
model_versus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model_versus)


def run(cells: dict) -> dict:
    rows = [{"case_id": q, "task": task, "method": "cake-chunk", "budget": 256, "exact": e}
            for q, (task, e) in cells.items()]  # fmt: skip
    return {"meta": {"model": "m"}, "rows": rows}


def test_only_answerable_questions_both_answered_are_paired():
    small = run({"a": ("real", 1.0), "x": ("real-absent", 1.0)} | {q: ("real", 0.0) for q in "bcde"})
    large = run({q: ("real", 1.0) for q in "abcdef"})
    first = model_versus.answerable_exact(small, "cake-chunk", 256)
    second = model_versus.answerable_exact(large, "cake-chunk", 256)
    assert first == {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0, "e": 0.0}  # the unanswerable question is not counted
    line = model_versus.versus_line(first, second, "cake-chunk B=256", ("0.5b", "1.5b"))
    # paired on a-e (f is the second run's only): gains 0, 1, 1, 1, 1; a resample of five that draws only
    # a (p = 1/3125) is the only one at 0, so the interval's lower bound is above 0
    assert line.startswith("cake-chunk B=256: 5 answerable questions, 0.5b 20.0, 1.5b 100.0, 1.5b - 0.5b +80.0 [")
    assert line.endswith(", +100.0]*") and "[+0.0" not in line and "[-" not in line


def test_no_common_question_is_an_error():
    with pytest.raises(ValueError, match="share no answerable question"):
        model_versus.versus_line({"a": 1.0}, {"b": 1.0}, "x", ("p", "q"))


def test_runs_are_named_by_model_then_by_dtype_and_weights_then_as_given():
    a = {"meta": {"model": "m (M)", "dtype": "float32", "weights": "w8a8"}}
    b = {"meta": {"model": "m (M)", "dtype": "bfloat16", "weights": "bf16"}}
    c = {"meta": {"model": "n (N)"}}
    assert model_versus.run_names([a, c]) == ("m", "n")
    assert model_versus.run_names([a, b]) == ("m float32+w8a8", "m bfloat16+bf16")
    assert model_versus.run_names([a, a], "before, after") == ("before", "after")
    with pytest.raises(ValueError, match="two names"):
        model_versus.run_names([a, a], "only")
