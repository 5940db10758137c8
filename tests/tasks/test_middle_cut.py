"""The middle cut keeps slices of the document and says what it dropped (characters, share, PDF pages)."""

from __future__ import annotations

import pytest

from cake_cli.tasks.inputs.documents import Document, pages_of_range
from cake_cli.tasks.templates import build_prompt, cut_middle, load_template, middle_cut
from tests.helpers.texts import license_text
from tests.helpers.tiny import build_tiny_tokenizer

TEXT = license_text()[:6000]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.mark.parametrize("keep", [2, 101, 1000])
def test_the_kept_parts_are_slices_of_the_text(tokenizer, keep):
    cut, (start, end) = cut_middle(tokenizer, TEXT, keep)
    assert 0 < start < end < len(TEXT)
    assert cut == TEXT[:start] + " … " + TEXT[end:] and middle_cut(tokenizer, TEXT, keep) == cut
    head = len(tokenizer(TEXT[:start], add_special_tokens=False)["input_ids"])
    assert abs(head - keep // 2) <= 2  # the head is about half the kept tokens


def test_the_warning_names_the_dropped_characters_and_pages(tokenizer):
    pages = lambda a, b: f"{1 + a // 1000}-{1 + (b - 1) // 1000}"  # noqa: E731 - a PDF of 1000-character pages
    prompt = build_prompt(
        tokenizer, load_template("qa"), TEXT, max_prompt_tokens=800, pages=pages, question="Who holds the copyright?"
    )
    start, end = prompt.dropped
    assert prompt.document_text == TEXT[:start] + " … " + TEXT[end:]
    (warning,) = prompt.warnings
    share = f"{100 * start / len(TEXT):.1f}%-{100 * end / len(TEXT):.1f}% of the document"
    assert f"characters {start}-{end} ({share}, pages {pages(start, end)})" in warning
    assert "were not read" in warning and "--long sections" in warning
    whole = build_prompt(tokenizer, load_template("qa"), TEXT[:300], max_prompt_tokens=800, question="Who?")
    assert whole.dropped is None and whole.warnings == ()


def test_pages_of_range():
    pdf = Document(text="a" * 30, source="x.pdf", kind="pdf", page_offsets=(0, 10, 20))
    assert pages_of_range(pdf, 0, 10) == "1" and pages_of_range(pdf, 5, 25) == "1-3"
    assert pages_of_range(pdf, 25, 99) == "3"  # clamped to the text
    assert pages_of_range(Document(text="abc", source="x.txt", kind="text"), 0, 2) is None
