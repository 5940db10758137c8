"""Needle location (cake_cli.tasks.locate): the quote's passage, its offset, depth and PDF page."""

from __future__ import annotations

import pytest

from cake_cli.tasks.locate import THRESHOLD, candidates, locate
from tests.conftest import license_text

NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."


def planted(fraction: float) -> tuple[str, int]:
    """LICENSE.txt with NEEDLE inserted at a paragraph break near `fraction` of its length."""
    text = license_text()
    at = text.find("\n\n", int(len(text) * fraction)) + 2
    return text[:at] + NEEDLE + "\n\n" + text[at:], at


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
@pytest.mark.parametrize(
    "answer",
    [
        NEEDLE,
        "The best thing to do in San Francisco is to eat a sandwich.",  # paraphrase, as SmolLM2 gives
        f'The sentence is: "{NEEDLE}"',  # lead-in and quotes
        "Sure.\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park",
    ],
)
def test_locates_the_planted_sentence(fraction, answer):
    text, at = planted(fraction)
    location, score = locate(answer, text)
    assert location is not None and score >= THRESHOLD
    assert abs(location.start - at) <= 3
    assert location.percent == pytest.approx(100 * location.start / len(text))
    assert location.text.startswith("The best thing") and location.text in NEEDLE
    assert location.page is None


@pytest.mark.parametrize("answer", ["The special magic number is 1234567890.", "Yes", "", "I don't know."])
def test_no_location_for_answers_not_in_the_document(answer):
    text, _ = planted(0.5)
    location, score = locate(answer, text)
    assert location is None and score < THRESHOLD


def test_page_comes_from_the_page_function():
    text, _ = planted(0.5)
    location, _ = locate(NEEDLE, text, page_of=lambda offset: 1 + offset // 1000)
    assert location.page == 1 + location.start // 1000


def test_candidates_prefer_quoted_and_sentence_pieces():
    pieces = candidates('Answer: "Blue Falcon is the code name." It was in the second part.')
    assert "Blue Falcon is the code name" in pieces
    assert all(len(p) >= 12 for p in pieces) and pieces == sorted(pieces, key=len, reverse=True)
