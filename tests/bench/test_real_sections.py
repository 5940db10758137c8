"""scripts/real_sections.py: which section's reply answers, by the suite's rule, by relevance and by an oracle."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from cake_cli.bench.real_docs import load_set

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real_sections.py"
spec = importlib.util.spec_from_file_location("real_sections", SCRIPT)
real_sections = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real_sections)

QUOTE = "# Original code by Kevin O'Connor, augmented by Tim Peters and Raymond Hettinger"
WRONG = 'Answer: Guido van Rossum\nPassage: "Guido van Rossum wrote Python"'
RIGHT = f'Answer: Kevin O\'Connor\nPassage: "{QUOTE}"'
ABSTAIN = "Answer: not in the document"


def question():
    return next(q for d in load_set().documents for q in d.questions if q.id == "python-heapq-02")


def test_each_rule_picks_its_section():
    q = question()  # "Who wrote heapq's original code?"
    sections = [[ABSTAIN, "abstained"], [WRONG, "located"], [RIGHT, "located"]]
    assert real_sections.first_located(sections, q) == WRONG  # the suite's rule: the first located
    assert real_sections.most_relevant(sections, q) == RIGHT  # "original code" is in its passage
    assert real_sections.any_right(sections, q) == RIGHT
    unsupported = [[ABSTAIN, "abstained"], [WRONG, "unsupported"]]
    assert real_sections.first_located(unsupported, q) == WRONG  # no located one: the first unsupported
    assert real_sections.any_right(unsupported, q) == WRONG  # the oracle only takes a located answer
    assert real_sections.first_located([[ABSTAIN, "abstained"]] * 2, q) == ABSTAIN


def test_the_script_counts_right_answers_per_cell(tmp_path):
    def row(method, budget, sections, exact):
        return {"task": "real", "case_id": "python-heapq-02", "length": 32768, "method": method, "budget": budget,
                "exact": exact, "sections": sections}  # fmt: skip

    rows = [row("full", None, [[WRONG, "located"], [RIGHT, "located"]], 0.0)]
    rows += [row("cake", 256, [[ABSTAIN, "abstained"], [RIGHT, "located"]], 1.0)]
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"rows": rows}))
    whole = tmp_path / "w.json"
    whole.write_text(json.dumps({"rows": [{**rows[0], "exact": 1.0}, {**rows[1], "exact": 0.0}]}))
    out = subprocess.run([sys.executable, SCRIPT, path, "--whole", whole], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == (
        "cake B=256: 1 answerable | read whole 0 | sections, first located (the suite's) 1 | sections, most relevant 1"
        " | sections, any right (oracle) 1"
    )
    assert lines[1].startswith("full B=-: 1 answerable | read whole 1 | sections, first located (the suite's) 0 |")
    assert lines[1].endswith("| sections, any right (oracle) 1")
