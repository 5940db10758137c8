"""Code-only answers (cake_cli.tasks.answers.completion): fences and prose dropped, N lines, streaming == one shot."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cake_cli.errors import UsageError
from cake_cli.tasks.answers.completion import (
    CodeFilter,
    context_before,
    cut_at_line,
    filter_code,
    is_prose,
    max_new_tokens_for,
)
from cake_cli.tasks.inputs.documents import load_document


@pytest.mark.parametrize(
    "raw, lines, expected",
    [
        ("\n        lines = []\n        x = 1\n", 5, "        lines = []\n        x = 1"),
        (
            "Here is the completed code:\n```python\ndef f():\n    return 1\n```\nThis defines f.",
            5,
            "def f():\n    return 1",
        ),
        ("```\nx = 1\n\n\ny = 2\n```", 5, "x = 1\n\n\ny = 2"),
        ("a = 1\nb = 2\n\nc = 3\nd = 4\n", 3, "a = 1\nb = 2\n\nc = 3"),
        ("x = 1\n\n\n", 5, "x = 1"),  # trailing blank lines dropped
        ("Sure! The rest of the function follows.\n    return total\n", 5, "    return total"),
        ("The function returns the sum of its arguments.", 5, ""),  # prose only: nothing
        ("    The text first has its whitespace collapsed.\n", 5, "    The text first has its whitespace collapsed."),
        ("", 5, ""),
    ],
)
def test_filter_code(raw, lines, expected):
    assert filter_code(raw, lines) == expected


@pytest.mark.parametrize(
    "line, prose",
    [
        ("Here's the completion:", True),
        ("The following lines finish the loop.", True),
        ("This code wraps text to a given width.", True),
        ("for chunk in chunks:", False),
        ("return x", False),
        ("    Wrap a single paragraph of text.", False),  # indented: inside code
        ("x = compute(a, b)", False),
        ("else:", False),
        ("# Compute the total of all items.", False),
    ],
)
def test_is_prose(line, prose):
    assert is_prose(line) is prose


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("  # idx is the start index\n    lines = []\n", "    lines = []"),  # the issue's `--at 338`
        ("\n    lines = []\n", "    lines = []"),  # a newline first: nothing of the last line
        (")\n```python\nx = 1\n```", "x = 1"),
        ("  # only the rest of the last line", ""),
        ("", ""),
    ],
)
def test_a_completion_starts_on_the_next_line(raw, expected):
    """The prompt ends inside its last line: what comes before the first newline finishes that line."""
    assert filter_code(raw, 5, continues_line=True) == expected


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet="ab =():\n `#Hx.", max_size=80),
    st.lists(st.integers(1, 7), max_size=20),
    st.integers(1, 4),
    st.booleans(),
)
def test_streaming_equals_one_shot(text, cuts, lines, continues_line):
    f, out, pos = CodeFilter(lines, continues_line), [], 0
    for size in cuts:
        out.append(f.feed(text[pos : pos + size]))
        pos += size
    out.append(f.feed(text[pos:]))
    out.append(f.finish())
    assert "".join(out) == filter_code(text, lines, continues_line) == f.text
    assert len([line for line in f.text.split("\n") if line.strip()]) <= lines


def test_lines_must_be_positive():
    with pytest.raises(UsageError):
        CodeFilter(0)


def test_cut_at_line():
    text = "a = 1\nb = 2\n\nc = 3\nd = 4"
    assert cut_at_line(text, 4) == "a = 1\nb = 2"  # line 3 is blank: trailing blank lines dropped
    assert cut_at_line(text, 5) == "a = 1\nb = 2\n\nc = 3"
    assert cut_at_line(text, 6) == text  # after the last line
    assert cut_at_line("x\r\ny\rz", 3) == "x\ny"  # \r\n and \r count as line breaks
    for bad in (1, 0, 7):
        with pytest.raises(UsageError):
            cut_at_line(text, bad)
    with pytest.raises(UsageError):
        cut_at_line("\n\n\nx = 1", 3)
    ended = text + "\n"  # a final newline adds no line: line 6 is still the one after the last
    assert cut_at_line(ended, 6) == text
    with pytest.raises(UsageError, match="lines 2 to 6 can be completed"):
        cut_at_line(ended, 7)


def test_context_before_keeps_the_files_line_numbers(tmp_path):
    # the loader collapses blank-line runs and drops leading blank lines; --at counts the file's lines
    path = tmp_path / "f.py"
    path.write_text("\n\nimport os\n\n\n\n\ndef f():\n    return 1\n")
    doc = load_document(str(path))
    assert doc.text.count("\n") < 8  # normalised
    # line 9 of the file is "    return 1": the context is everything before it (then normalised)
    assert context_before(doc, 9) == "import os\n\n\ndef f():"
    with pytest.raises(UsageError):
        cut_at_line(doc.text, 9)  # the normalised text has fewer lines
    with pytest.raises(UsageError):
        context_before(doc, 3)  # lines 1-2 are blank: nothing to complete from


def test_max_new_tokens_grows_with_lines():
    assert max_new_tokens_for(5, 120) == 120
    assert max_new_tokens_for(20, 120) == 480
