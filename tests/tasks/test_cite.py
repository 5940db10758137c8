"""Cited answers (cake_cli.tasks.answers.cite): the reply read apart into answer, passage and abstention."""

from __future__ import annotations

import pytest

from cake_cli.tasks.answers.cite import LOCATED, UNSUPPORTED, find_support, is_abstention, parse_cited
from cake_cli.tasks.answers.locate import MAX_WIDEN, _sentence_around
from tests.helpers.texts import license_text

PASSAGE = "Bruce Perens took over as project leader in April 1996"


@pytest.mark.parametrize(
    "reply",
    [
        f'Answer: Bruce Perens\nPassage: "{PASSAGE}"',
        f"answer: Bruce Perens\npassage: {PASSAGE}",
        f'**Answer:** Bruce Perens\n**Passage:** "{PASSAGE}."',
        f'Answer: Bruce Perens\nQuote: "{PASSAGE}"',
        f'Bruce Perens. "{PASSAGE}"',  # no markers: the quoted part is the passage
        f'Answer: Bruce Perens\nSupporting passage: "{PASSAGE}"\nPassage: something else',  # the first one counts
    ],
)
def test_answer_and_passage_are_read_apart(reply):
    cited = parse_cited(reply)
    assert not cited.abstained
    assert cited.answer.rstrip(".") == "Bruce Perens"
    assert cited.passage.rstrip(".") == PASSAGE
    assert cited.evidence == cited.passage


def test_a_bare_quote_is_its_own_answer_and_evidence():  # needle search: the quote is the answer
    cited = parse_cited(f"{PASSAGE}.")
    assert cited.answer == f"{PASSAGE}." and cited.passage == "" and cited.evidence == cited.answer
    quoted = parse_cited(f'"{PASSAGE}."')
    assert quoted.answer == f"{PASSAGE}." and quoted.passage == ""


@pytest.mark.parametrize(
    "reply",
    [
        "Answer: not in the document",
        "not in the document",
        "Not in the document.",
        "Answer: Not in the document.\nPassage: none",
        "The document does not mention when he died.",
        "The text doesn't say.",
        "This information is not mentioned in the document.",
        "Answer: The answer cannot be found in the document.",
        "I don't know.",
        "Unknown",
        "Answer: No information about that is given.",
        "Passage: not in the document",  # only a passage marker, and it abstains
    ],
)
def test_abstentions_are_recognised(reply):
    cited = parse_cited(reply)
    assert cited.abstained and cited.answer == "" and cited.passage == ""


@pytest.mark.parametrize(
    "reply",
    [
        "Answer: Bruce Perens",
        "Bruce Perens. The document does not give the year.",  # an answer first, a caveat after
        "Answer: December 2015\nPassage: Ian Murdock died in December 2015.",
        "The document is a history of the Debian project.",
        "Answer: It is not a Linux distribution in the usual sense.",
        "",
    ],
)
def test_answers_are_not_abstentions(reply):
    assert not parse_cited(reply).abstained


def test_is_abstention_reads_the_first_sentence_only():
    assert is_abstention("Not in the document. Perhaps Bruce Perens.")
    assert not is_abstention("Bruce Perens. It is not in the document whether he liked it.")
    assert not is_abstention("")


# --- find_support: is the answer backed by the passage it is located at? -------------------------

LEADERS = (
    "Debian has had several leaders since its beginnings in 1993.\n"
    "Ian Murdock founded Debian in August 1993 and led it until March 1996.\n"
    "Bruce Perens led Debian from April 1996 until December 1997.\n"
    "Ian Jackson led Debian from January 1998 until December 1998.\n"
    "The project adopted the Constitution for the Debian Project in 1998.\n"
)
QUESTION = "Who led Debian after Ian Murdock?"


def leaders_doc() -> str:
    """Real prose around the planted lines, which end in line breaks as a PDF's text does."""
    text = license_text()
    middle = text.find("\n\n", len(text) // 2) + 2
    return text[:middle] + LEADERS + "\n" + text[middle:]


@pytest.mark.parametrize(
    "reply",
    [
        # the words are all there, the year is not: the alignment (similarity 98) used to call it located
        "Answer: Bruce Perens led Debian from April 1996 until December 1996.\n"
        'Passage: "Bruce Perens led Debian from April 1996 until December 1996."',
        "Bruce Perens led Debian from April 1996 until December 1996.",
    ],
)
def test_a_wrong_number_near_the_right_words_is_unsupported(reply):
    location, support, notes = find_support(reply, leaders_doc(), query=QUESTION)
    assert location is None and support.status == UNSUPPORTED
    assert "number 1996" in support.reason and "December 1997" in support.reason
    assert notes == [f"unsupported answer: {support.reason}"]


def test_the_right_number_is_located_on_whole_words():
    text = leaders_doc()
    reply = 'Answer: Bruce Perens\nPassage: "Bruce Perens led Debian from April 1996 until December 1997."'
    location, support, _ = find_support(reply, text, query=QUESTION)
    assert support.status == LOCATED and support.answer == "Bruce Perens"
    assert location.text == "Bruce Perens led Debian from April 1996 until December 1997"
    assert text[location.start : location.end] == location.text


def test_a_paraphrased_quote_falls_back_to_the_answer_words():
    reply = 'Answer: the Constitution for the Debian Project\nPassage: "Debian is governed by a written charter"'
    location, support, notes = find_support(reply, leaders_doc(), query="What governs Debian?")
    assert support.status == LOCATED
    assert "Constitution for the Debian Project" in location.text
    assert notes == ["the quoted passage is not in the document; the answer's own words are, at the location given"]


def test_a_sentence_is_widened_by_at_most_max_widen_where_the_text_has_no_sentence_end():
    filler = " ".join(f"word{i}" for i in range(2000))  # 15K characters without a sentence end
    text = filler + " the launch code is TANGO-417-ECHO. " + filler
    at = text.index("TANGO")
    start, end = _sentence_around(text, at, at + 14)
    assert (start, end) == (at - MAX_WIDEN, text.index(".", at) + 1)  # no end on the left: the cap
    assert _sentence_around("One. Two three. Four", 8, 10) == (4, 15)  # sentence ends (the space is trimmed later)
