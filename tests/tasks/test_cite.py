"""Cited answers (cake_cli.tasks.answers.cite): the reply read apart into answer, passage and abstention."""

from __future__ import annotations

import pytest

from cake_cli.tasks.answers.cite import is_abstention, parse_cited

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
