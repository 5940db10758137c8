"""Needle location (cake_cli.tasks.answers.locate): the quote's passage, its offset, depth and PDF page."""

from __future__ import annotations

import pytest

from cake_cli.tasks.answers.locate import (
    THRESHOLD,
    candidates,
    content_words,
    locate,
    missing_words,
    sentences,
    supporting_sentence,
)
from tests.helpers.texts import license_text

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


LAUNCH = "The launch code for the vault is TANGO-417-ECHO."
QUERY = "What is the launch code?"


def launch_text() -> tuple[str, int]:
    text = license_text()
    at = text.find("\n\n", len(text) // 2) + 2
    return text[:at] + LAUNCH + "\n\n" + text[at:], at


@pytest.mark.parametrize(
    "answer",
    [
        "The launch code is 18.",  # the newcomer's case: the query's words echoed, a wrong value
        "The launch code.",  # nothing but the query's words
        "What is the launch code?",
    ],
)
def test_an_echo_of_the_query_with_a_wrong_value_is_not_located(answer):
    text, _ = launch_text()
    location, _ = locate(answer, text, query=QUERY)
    assert location is None


@pytest.mark.parametrize(
    "answer", ["The launch code is TANGO-417-ECHO.", "TANGO-417-ECHO", f"The sentence is: {LAUNCH}"]
)
def test_the_right_value_is_located_at_its_sentence(answer):
    text, at = launch_text()
    location, _ = locate(answer, text, query=QUERY)
    assert location is not None and "TANGO-417-ECHO" in location.text
    assert at - 3 <= location.start <= at + len(LAUNCH) and location.end <= at + len(LAUNCH) + 1


def test_content_words_drop_the_query_and_function_words():
    assert content_words("The launch code is 18.", QUERY) == ["18"]
    assert content_words("It is TANGO-417-ECHO", QUERY) == ["tango", "417", "echo"]


def test_a_quote_with_a_made_up_ending_is_located_and_its_extra_words_named():
    text, at = planted(0.5)
    answer = "The best thing to do in San Francisco is eat a sandwich and sit on the beach."  # SmolLM2's
    query = "What is the best thing to do in San Francisco?"
    location, _ = locate(answer, text, query=query)
    assert location is not None and abs(location.start - at) <= 3
    assert missing_words(location.text, content_words(answer, query)) == ["beach"]
    assert locate("The best thing to do in San Francisco is to sit on the beach.", text, query=query)[0] is None


# ---- the sentence that holds a short answer nobody quoted ------------------------------------

SOURCE = (
    '"""Text wrapping and filling.\n"""\n\n# Copyright (C) 1999-2001 Gregory P. Ward.\n'
    "# Written by Greg Ward <gward@python.net>\n\nimport re\n\n"
    'class TextWrapper:\n    """\n    Several instance attributes control various aspects of wrapping:\n'
    "      width (default: 70)\n        the maximum width of wrapped lines.\n"
    "      tabsize (default: 8)\n        Expand tabs in input text to 0 .. 'tabsize' spaces.\n"
    "    Lines are counted from 1 in the messages.\n"
    '    """\n'
)


def test_sentences_cover_prose_and_split_long_code_into_lines():
    prose = "Hello world. This is\na test of it.\n\nNew para here! x=1\n"
    assert [prose[a:b].strip() for a, b in sentences(prose)] == [
        "Hello world.", "This is\na test of it.", "New para here!", "x=1",
    ]  # fmt: skip
    code = "\n".join(f"    value_{i} = {i}" for i in range(40))  # no sentence end: longer than MAX_SENTENCE
    spans = sentences(code)
    assert len(spans) == 40 and all(code[a:b].startswith("    value_") for a, b in spans)


@pytest.mark.parametrize(
    ("answer", "question", "holds"),
    [
        ("Greg Ward", "Who wrote the textwrap module?", "# Written by Greg Ward <gward@python.net>"),
        ("70", "What is the default width of a TextWrapper?", "width (default: 70)"),
        ("8", "What is the default tabsize?", "tabsize (default: 8)"),
        ("1", "How many lines per second can TextWrapper wrap?", None),  # "1" is there, not about that
        ("Sam Hocevar", "Who wrote the textwrap module?", None),  # not in the text
        ("9", "What is the default tabsize?", None),  # the wrong number
    ],
)
def test_supporting_sentence_holds_the_answer_and_is_about_the_question(answer, question, holds):
    found = supporting_sentence(answer, SOURCE, question)
    if holds is None:
        assert found is None
    else:
        assert holds in found.text and SOURCE[found.start : found.end] == found.text
