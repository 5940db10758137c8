"""scripts/real_merge.py: run files of the real suite merged into one, rescored to one --abstain mode."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real_merge.py"
spec = importlib.util.spec_from_file_location("real_merge", SCRIPT)
real_merge = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real_merge)

META = {"model": "m", "split": "real", "haystack": "essays", "window": 32, "dtype": "bfloat16", "long": "middle"}
QUOTE = "# Original code by Kevin O'Connor, augmented by Tim Peters and Raymond Hettinger"


def row(qid: str, task: str, method: str, budget, prediction: str, exact: float) -> dict:
    cell = {"task": task, "case_id": qid, "length": 32768, "method": method, "budget": budget}
    return cell | {"source": "python-heapq", "prediction": prediction, "exact": exact, "score": exact,
                   "abstained": False, "support": "unsupported"}  # fmt: skip


def write(path: Path, meta: dict, rows: list[dict]) -> Path:
    path.write_text(json.dumps({"format": "cake-bench-quality", "version": 1, "meta": meta, "rows": rows}))
    return path


def test_merge_rescores_old_files_and_keeps_the_later_cell(tmp_path):
    invented = 'Answer: Guido van Rossum\nPassage: "Guido wrote the heap module"'
    old = write(tmp_path / "old.json", META | {"documents": ["python-heapq"]}, [
        row("python-heapq-02", "real", "full", None, f'Answer: Kevin O\'Connor\nPassage: "{QUOTE}"', 1.0),
        row("python-heapq-08", "real-absent", "cake", 256, invented, 0.0),
    ])  # fmt: skip
    new = write(tmp_path / "new.json", META | {"documents": ["python-graphlib"], "abstain": "foreign"}, [
        row("python-heapq-02", "real", "full", None, "Answer: someone else", 0.0),
    ])  # fmt: skip
    merged, lines = real_merge.merge([old, new], "foreign")
    rows = {(r["case_id"], r["method"]): r for r in merged["rows"]}
    assert len(merged["rows"]) == 2 and merged["meta"]["documents"] == ["python-heapq", "python-graphlib"]
    assert rows[("python-heapq-02", "full")]["prediction"] == "Answer: someone else"  # the later file's cell
    # rescored with foreign: an answer whose words the document does not hold is withheld, a right abstention
    assert rows[("python-heapq-08", "cake")]["abstained"] is True and rows[("python-heapq-08", "cake")]["exact"] == 1.0
    assert "2 rows rescored from --abstain never" in lines[0] and "0 same reply, 1 other" in lines[-1]
    only, _ = real_merge.merge([old, new], "foreign", ["cake"])
    assert [r["method"] for r in only["rows"]] == ["cake"] and only["meta"]["command"].endswith("--methods cake")


def test_merge_refuses_unlike_runs(tmp_path):
    a = write(tmp_path / "a.json", META | {"abstain": "foreign"}, [])
    b = write(tmp_path / "b.json", META | {"model": "other", "abstain": "foreign"}, [])
    with pytest.raises(SystemExit, match="model"):
        real_merge.merge([a, b], "foreign")


def test_merge_rescore_answers_scores_every_answer_with_this_scorer(tmp_path):
    run = write(tmp_path / "run.json", META | {"documents": ["python-statistics"], "abstain": "foreign"}, [
        row("python-statistics-12", "real", "cake", 1024, "Answer: The default sigma is 1.", 0.0),
        row("python-statistics-12", "real", "full", None, "Answer: 10", 1.0),
    ])  # fmt: skip
    kept, _ = real_merge.merge([run], "foreign")
    assert [r["exact"] for r in kept["rows"]] == [0.0, 1.0]  # the same mode: rows as stored
    merged, lines = real_merge.merge([run], "foreign", answers=True)
    assert [r["exact"] for r in merged["rows"]] == [1.0, 0.0]  # gold "1.0": "1." is right, "10" is not
    assert "answers scored again, 2 exact scores changed" in lines[0]
    assert merged["meta"]["command"].endswith("--rescore-answers")
