"""benchmarks/kv_bits_quality.py's report: real-set and genre-suite questions pooled per layout and budget."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kv_bits_quality.py"
spec = importlib.util.spec_from_file_location("kv_bits_quality", SCRIPT)
kv_bits_quality = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kv_bits_quality)

QUOTE = "# Original code by Kevin O'Connor, augmented by Tim Peters and Raymond Hettinger"
META = {"model": "m", "dtype": "torch.bfloat16", "group": 32, "window": 32, "layouts": ["16", "4"]}


def real_row(layout: str, prediction: str) -> dict:
    return {"task": "real", "case_id": "python-heapq-02", "source": "python-heapq", "layout": layout, "budget": 256,
            "length": 32768, "method": "file", "prediction": prediction, "exact": 0.0, "score": 0.0}  # fmt: skip


def genre_row(case_id: str, layout: str, exact: float) -> dict:
    return {"task": "s-rt", "case_id": case_id, "source": f"genre:{case_id}", "layout": layout, "budget": 256,
            "prediction": "x", "exact": exact, "score": exact}  # fmt: skip


def test_report_pools_genre_cases_with_real_questions_and_rescores_only_the_real_ones(capsys):
    right = f'Answer: Kevin O\'Connor\nPassage: "{QUOTE}"'
    rows = [
        real_row("16", right),
        real_row("4", right),
        genre_row("code/d25-n0", "16", 1.0),
        genre_row("code/d25-n0", "4", 0.0),  # the 4-bit file lost this fact
        genre_row("wiki/d75-n1", "16", 1.0),
        genre_row("wiki/d75-n1", "4", 1.0),
    ]
    files = {f"{d}/{n}": size for d in ("python-heapq", "genre:code/d25-n0", "genre:wiki/d75-n1")
             for n, size in (("16", 1000), ("4", 300))}  # fmt: skip
    kv_bits_quality.print_report([{"meta": META, "files": files, "rows": rows}], "foreign")
    out = capsys.readouterr().out
    assert "B = 256: 3 questions (3 answerable) on 3 documents; 2 of them genre-suite cases on 2" in out
    assert "| 16 | 100.0 | 100.0 | 100.0 | – | 0 / 3 / 0 | – | 1.000 |" in out
    assert "| 4 | 66.7 | 66.7 | 66.7 | – | 0 / 2 / 1 | -33.3 [-100.0, +0.0] | 0.300 |" in out
    assert "FAIL B=256: the 4-bit file is 0.300x the 16-bit one (target <= 0.32x) and its exact answers differ by " \
        "-33.3 [-100.0, +0.0] on 3 questions (target: lower bound >= -2)" in out  # fmt: skip
    assert "4 against 16, better / same / worse: real questions 0 / 1 / 0; genre-suite facts 0 / 1 / 1" in out


def test_report_pools_runs_over_the_layouts_they_share(capsys):
    first = {"meta": {**META, "layouts": ["16", "4", "4/4/32/v32"]}, "files": {"a/16": 1000, "a/4": 300,
             "a/4/4/32/v32": 320}, "rows": [genre_row("a", n, 1.0) for n in ("16", "4", "4/4/32/v32")]}  # fmt: skip
    second = {"meta": META, "files": {"b/16": 1000, "b/4": 300},
              "rows": [genre_row("b", "16", 1.0), genre_row("b", "4", 0.0)]}  # fmt: skip
    for row in first["rows"] + second["rows"]:
        row["source"] = row["case_id"]
    kv_bits_quality.print_report([first, second], "foreign")
    out = capsys.readouterr().out
    assert "B = 256: 2 questions (2 answerable) on 2 documents; 2 of them genre-suite cases on 0" in out
    assert "| 4 | 50.0 | 50.0 | 50.0 | – | 0 / 1 / 1 | -50.0 [-100.0, +0.0] | 0.300 |" in out
    assert "4/4/32/v32" not in out  # the second run has no such layout


def test_override_runs_replace_the_same_cells_replies(capsys):
    run = {"meta": META, "files": {"a/16": 1000, "a/4": 300},
           "rows": [genre_row("a", "16", 1.0), genre_row("a", "4", 1.0)]}  # fmt: skip
    again = {"meta": {**META, "layouts": ["4"]}, "files": {"a/4": 300}, "rows": [genre_row("a", "4", 0.0)]}
    for row in run["rows"] + again["rows"]:
        row["source"] = row["case_id"]
    kv_bits_quality.print_report([run], "foreign", [again])
    out = capsys.readouterr().out
    assert "1 stored replies replaced by the override runs'" in out
    assert "| 4 | 0.0 | 0.0 | 0.0 | – | 0 / 0 / 1 | -100.0 [-100.0, -100.0] | 0.300 |" in out
