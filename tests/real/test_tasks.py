"""The embedded SmolLM2-135M-Instruct on real text: QA, needle search and code completion under CAKE.

Few and short on purpose (each is one prefill of 2.5-4K tokens plus a few dozen decoded tokens).
What the 135M model does and does not do reliably is written next to each assertion.
"""

from __future__ import annotations

import ast
import json
import re
import sysconfig
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cake_cli.cli.main import app
from tests.helpers.real import NEEDLE, SMOLLM2, real_model_marks
from tests.helpers.texts import license_text

pytestmark = real_model_marks(SMOLLM2)
runner = CliRunner()


def cake_json(monkeypatch, shared_home, *args) -> dict:
    monkeypatch.setenv("CAKE_HOME", shared_home)
    monkeypatch.delenv("CAKE_MODEL", raising=False)
    monkeypatch.delenv("CAKE_PROFILES_DIR", raising=False)
    result = runner.invoke(app, [str(a) for a in args] + ["--model", "smollm2", "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def plant(text: str, sentence: str, fraction: float) -> tuple[str, int]:
    """`text` with `sentence` as a paragraph of its own, at the end of the prose paragraph (one
    ending in '.') nearest to `fraction` of the text, as needle tests insert at sentence
    boundaries; returns the new text and the sentence's offset in it.

    (Not inside LICENSE.txt's version table at ~10%: there SmolLM2 misses the needle even with
    the full cache, 0.1 -> "... is to visit the San Francisco Bay Area.", so a test there would
    measure the model, not the cache.)"""
    breaks = [m.end() for m in re.finditer(r"\.\n\n", text)]
    at = min(breaks, key=lambda b: abs(b - fraction * len(text)))
    return text[:at] + sentence + "\n\n" + text[at:], at


def test_qa_answers_a_fact_stated_once(tmp_path, shared_home, monkeypatch):
    text, _ = plant(license_text(), "The secret project code name is Blue Falcon.", 0.5)
    path = tmp_path / "license.txt"
    path.write_text(text, encoding="utf-8")
    data = cake_json(
        monkeypatch, shared_home, "qa", path, "What is the secret project code name?", "--budget", "256", "-n", "24"
    )
    assert data["prompt_tokens"] >= 2000 and data["evicted"] and data["saved_fraction"] > 0.9
    assert "blue falcon" in data["answer"].lower(), data["answer"]


# Measured at 8.8% depth (the prose paragraph nearest 10%): SmolLM2-135M answers "... is to visit
# the famous San Francisco Art Crime Museum" at --budget 256 (similarity 66), and "... is to visit
# the San Francisco Bay Area." with the FULL cache (--budget 8192, nothing evicted): a model limit,
# not the cache's. At 14.5% (after the version table) it quotes the needle at --budget 256
# (similarity 95), as at 50% and 90%. Kept as a non-strict xfail so a better model shows XPASS.
SHALLOW = pytest.param(
    0.1,
    marks=pytest.mark.xfail(
        reason="SmolLM2-135M misses the needle at ~9% depth even with the full cache", strict=False
    ),
)


@pytest.mark.parametrize("fraction", [SHALLOW, 0.5, 0.9])
def test_needle_found_at_depth(tmp_path, shared_home, monkeypatch, fraction):
    text, at = plant(license_text(), NEEDLE, fraction)
    assert abs(at / len(text) - fraction) < 0.02
    path = tmp_path / "haystack.txt"
    path.write_text(text, encoding="utf-8")
    data = cake_json(
        monkeypatch,
        shared_home,
        "needle",
        path,
        "What is the best thing to do in San Francisco?",
        "--budget",
        "256",
        "-n",
        "40",
    )
    assert data["prompt_tokens"] >= 3000 and data["evicted"]
    # SmolLM2 quotes the needle, sometimes shortened or paraphrased ("... is to eat a sandwich."):
    # the quote must still match the document (similarity >= 80) at the planted sentence.
    assert "San Francisco" in data["answer"], data["answer"]
    location = data["location"]
    assert location is not None, data["warnings"]
    assert abs(location["start"] - at) <= 0.01 * len(text), (location, at)
    assert abs(location["percent"] - 100 * at / len(text)) < 1.0


def test_complete_continues_real_python(shared_home, monkeypatch):
    """Syntactically plausible code plus LongBench's code score (rapidfuzz ratio of the first predicted
    non-comment line to the real one); an exact-line match is not a fair check for a 135M model.
    Measured on 8 method bodies of textwrap.py at --budget 256 with tau = 1 the mean was 58 (range 12-85);
    here the body of `_wrap_chunks` (about 2,500 prompt tokens) scored 85 with tau = 1 and 44 with the
    searched taus (it starts the docstring in other words). Unrelated line pairs of this file score
    about 25-30, so 40 still says the model continued the right place."""
    from rapidfuzz import fuzz

    path = Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"
    lines = path.read_text(encoding="utf-8").split("\n")
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("def _wrap_chunks(")) + 2  # 1-based
    data = cake_json(monkeypatch, shared_home, "complete", path, "--at", at, "--budget", "256", "-n", "48")
    answer = data["answer"]
    assert answer and "```" not in answer, data["raw_answer"]
    code_lines = [line for line in answer.split("\n") if line.strip()]
    assert len(code_lines) <= 5 and all(re.match(r"^\s", line) for line in code_lines), "a method body"
    predicted = next(line for line in code_lines if not line.strip().startswith("#"))
    statement = predicted.strip()
    if statement.count('"""') % 2:  # a docstring opened on this line and closed later
        statement += '"""'
    ast.parse(statement)  # the first predicted line is a Python statement on its own
    score = fuzz.ratio(predicted.strip(), lines[at - 1].strip())
    assert score >= 40, (predicted, lines[at - 1], score)
