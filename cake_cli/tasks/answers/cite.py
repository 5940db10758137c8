"""Answers that cite their passage or abstain: reading the model's reply apart.

The qa and needle templates (`locate: true`) ask the model for its answer and the passage of the
document that supports it, and allow it to say the document does not hold the answer:

    Answer: Bruce Perens
    Passage: "Bruce Perens took over as project leader in 1996"

    Answer: not in the document

A small model follows that form loosely, so `parse_cited` reads it leniently: the ``Answer:`` and
``Passage:`` markers (or ``Quote:``, ``Evidence:``, ``Source:``, ``Supporting passage:``) in any
case, a passage in quotes when there is no marker, and a reply with neither is its own answer and
its own passage (needle search: the quote *is* the answer). An abstention is recognised when the
answer's first sentence says the document does not hold the answer (`ABSTAIN_PATTERNS`), so
"Bruce Perens. The document does not give the year." is an answer, not an abstention.

The runner then aligns the passage to the document (`tasks.answers.locate`) and calls the answer
"located", "unsupported" (no passage of the document holds it) or "abstained".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from cake_cli.tasks.answers.locate import (
    THRESHOLD,
    content_words,
    covers,
    locate,
    missing_numbers,
    missing_words,
    supporting_sentence,
)
from cake_cli.tasks.results import Location, Support

ABSTAIN = "not in the document"  # what the templates ask the model to write when it does not know
LOCATED, UNSUPPORTED, ABSTAINED = "located", "unsupported", "abstained"
SUPPORT_STATES = (LOCATED, UNSUPPORTED, ABSTAINED)

ABSTAIN_PATTERNS = re.compile(
    r"\bnot (?:\w+ )?(?:in|from|within|found in|given in|stated in|mentioned in|provided in|covered (?:by|in)|"
    r"included in|contained in|part of) (?:the|this) (?:document|text|passages?|context)"
    r"|\b(?:the|this) (?:document|text|passage|context) (?:does not|doesn't|did not|do not) "
    r"(?:say|state|mention|contain|include|provide|give|specify|tell|answer|cover|hold|have|discuss)"
    r"|\b(?:is|are) not (?:mentioned|stated|given|specified|provided|found|available|covered|discussed)\b"
    r"|\bno (?:information|mention|answer|details?|data)\b"
    r"|\b(?:cannot|can't|can not|could not|couldn't|unable to) (?:be )?(?:find|found|determine|determined|answer"
    r"|answered|tell|know|say)\b"
    r"|\b(?:i don't know|i do not know|unknown|unanswerable|not answerable|n/a)\b",
    re.IGNORECASE,
)
_MARKER = re.compile(
    r"^\s*[*_#>\-\s]*(answer|passage|supporting passage|supporting sentence|quote|quotation|evidence|source|"
    r"sentence|citation)\s*[*_]*\s*:\s*[*_]*",
    re.IGNORECASE | re.MULTILINE,
)
_QUOTED = re.compile(r"[\"“«]([^\"”»]{12,})[\"”»]")
_FIRST_SENTENCE = re.compile(r"^(.*?[.!?])(?:\s|$)", re.DOTALL)
_QUOTES = " \t\n\"'“”‘’«»*_`"


@dataclass(frozen=True)
class Cited:
    """A reply read apart: the short answer, the passage quoted for it, and whether it abstained."""

    answer: str  # the answer without its passage ("" when there is none)
    passage: str  # the passage the model quoted, without its quotes ("" when it quoted none)
    abstained: bool  # the answer says the document does not hold it

    @property
    def evidence(self) -> str:
        """What to look for in the document: the passage, else the answer itself (a needle's quote)."""
        return self.passage or self.answer


def is_abstention(answer: str) -> bool:
    """Whether `answer` (a short answer, not its passage) says the document does not hold the answer:
    its first sentence matches `ABSTAIN_PATTERNS` ("not in the document", "The document does not
    mention it.", "Unknown")."""
    text = answer.strip().strip(_QUOTES)
    if not text:
        return False
    first = _FIRST_SENTENCE.match(text)
    return bool(ABSTAIN_PATTERNS.search(first.group(1) if first else text))


def parse_cited(text: str) -> Cited:
    """Read a reply into (answer, passage, abstained); see the module docstring for the forms read.

    Args:
        text: the generated reply, as it was streamed (stripped or not).
    """
    marks = list(_MARKER.finditer(text))
    answer, passage = text.strip(), ""
    if marks:
        parts: dict[str, str] = {}
        head = text[: marks[0].start()].strip()
        for mark, following in zip(marks, [*marks[1:], None]):
            kind = "answer" if mark.group(1).lower() == "answer" else "passage"
            body = text[mark.end() : following.start() if following else len(text)].strip()
            parts.setdefault(kind, body)  # the first of each counts
        answer = parts.get("answer", head)
        passage = parts.get("passage", "")
    if not passage:
        quoted = _QUOTED.search(answer)
        if quoted and quoted.group(1).strip() != answer.strip(_QUOTES):
            passage = quoted.group(1)
            answer = (answer[: quoted.start()] + answer[quoted.end() :]).strip()
    answer, passage = answer.strip().strip(_QUOTES).strip(), passage.strip().strip(_QUOTES).strip()
    abstained = is_abstention(answer) or (not answer and is_abstention(passage))
    return Cited("" if abstained else answer, "" if abstained else passage, abstained)


def find_support(
    reply: str,
    text: str,
    *,
    query: str = "",
    page_of=None,
    offset: int = 0,
    length: int | None = None,
    unread: tuple[int, int] | None = None,
) -> tuple[Location | None, Support, list[str]]:
    """Read `reply` apart and find the passage that backs it in `text`.

    "located": the passage (or, without one or when the quote is not found, the answer itself)
    aligns with the text, holds the answer's content words and every number the answer gives (as
    often as it gives it), or, failing both, one sentence of the text holds them and is about the
    question (`locate.supporting_sentence`); "unsupported": it does not, or the quoted passage does not hold the
    answer's own words, or it lies in `unread` (a part the model never read); "abstained": the
    reply says the document does not hold the answer. A located passage is at most a sentence
    (widened by at most `locate.MAX_WIDEN` characters a side).

    Args:
        reply: the generated text.
        text: where to look: the document, or one of its sections.
        query: the question or query (its words are not content).
        page_of: offset in the document -> 1-based PDF page, or None.
        offset: where `text` starts in the document (location offsets are the document's).
        length: the document's characters (for the location's depth; default len(text)).
        unread: document characters [start, end) the model did not read (the middle cut).

    Returns:
        (location or None, Support, notes): notes are one-line warnings for the user.
    """
    cited = parse_cited(reply)
    if cited.abstained:
        return None, Support(ABSTAINED, "", ""), []
    pages = (lambda i: page_of(i + offset)) if page_of else None
    location, score = locate(cited.evidence, text, page_of=pages, query=query)
    notes: list[str] = []
    if location is None and cited.passage and cited.answer:
        # A paraphrased quote around an answer copied from the text: the answer's own words are found.
        location, score = locate(cited.answer, text, page_of=pages, query=query)
        if location is not None:
            notes.append("the quoted passage is not in the document; the answer's own words are, at the location given")
    if location is None and cited.answer:
        # No quote found (a short answer, "Greg Ward", rarely comes with one): the sentence that holds it.
        location = supporting_sentence(cited.answer, text, query, pages)
        if location is not None:
            notes.append(
                "the model quoted no passage found in the document; the sentence that holds the answer's words is "
                "at the location given"
            )
    if location is None:
        reason = (
            "no passage of the document holds the answer's content (best similarity "
            f"{score:.0f}, at least {THRESHOLD:.0f} needed, and the answer's own words beyond the query): no "
            "location reported"
        )
        return None, Support(UNSUPPORTED, cited.answer, cited.passage, reason), [f"unsupported answer: {reason}"]
    start, end, total = location.start + offset, location.end + offset, length or len(text)
    location = replace(location, start=start, end=end, percent=100.0 * start / total if total else 0.0)
    extra = missing_words(location.text, content_words(cited.evidence, query))
    if extra and not notes:
        notes.append(f"the quote differs from the document: {', '.join(extra)} not in the located passage")
    reason = ""
    words = content_words(cited.answer, query) if cited.passage and cited.answer else []
    wrong = missing_numbers(location.text, cited.answer)
    if wrong:  # the words are near but the figure is not: "until December 1996" where the text says 1997
        reason = (
            f"the located passage does not hold the answer's number {', '.join(wrong)} (it reads: {location.text!r})"
        )
    elif words and not covers(location.text, words) and not covers(cited.passage, words):
        reason = f"the quoted passage does not hold the answer ({', '.join(missing_words(location.text, words))})"
    elif unread is not None and unread[0] <= location.start < unread[1]:
        reason = "the quoted passage is in the part the middle cut left out: the model did not read it"
    if reason:
        notes.append(f"unsupported answer: {reason}")
        return None, Support(UNSUPPORTED, cited.answer, cited.passage, reason), notes
    return location, Support(LOCATED, cited.answer, cited.passage), notes
