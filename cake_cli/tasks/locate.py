"""Find where a generated quote is in the document (needle search).

The model is asked to copy the passage that answers the query, but a small model paraphrases,
adds a lead-in ("The sentence is: …") or quotes. So every candidate piece of the answer (the
whole answer, each quoted part, each sentence, each line) is aligned to the document with
rapidfuzz's `partial_ratio_alignment` (the best-matching window of the document, similarity
0-100), and the best one wins. Below `THRESHOLD` (or for an answer too short to be telling) no
location is reported: the answer is probably not from the document.
"""

from __future__ import annotations

import re

from cake_cli.tasks.results import Location

THRESHOLD = 80.0  # least partial-ratio similarity (0-100) for a location to be reported
MIN_CHARS = 12  # shorter candidates (e.g. "Yes") match somewhere in any long text: not telling

_QUOTED = re.compile(rf"[\"“«'‘]([^\"”»'’]{{{MIN_CHARS},}})[\"”»'’]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_EDGE = " \t\n\"'“”‘’«».,;:!?()[]"


def candidates(answer: str) -> list[str]:
    """Pieces of `answer` that may be the quoted passage, longest first, each >= MIN_CHARS."""
    pieces = [answer, *_QUOTED.findall(answer), *answer.splitlines(), *_SENTENCE_END.split(answer)]
    seen: dict[str, None] = {}
    for piece in pieces:
        piece = piece.strip(_EDGE)
        if len(piece) >= MIN_CHARS:
            seen.setdefault(piece, None)
    return sorted(seen, key=len, reverse=True)


def locate(answer: str, text: str, page_of=None, threshold: float = THRESHOLD) -> tuple[Location | None, float]:
    """Where in `text` the passage quoted by `answer` is.

    Args:
        answer: the generated quote (any length; may carry prose or quotes around it).
        text: the document text the offsets refer to.
        page_of: optional function offset -> 1-based page (PDF) or None.
        threshold: least similarity (0-100) to report a location.

    Returns:
        (location or None, best similarity found, 0-100). The location's span is trimmed of
        surrounding spaces and punctuation; on a tie the longer candidate wins.
    """
    from rapidfuzz import fuzz

    best, best_score = None, 0.0
    for piece in candidates(answer):
        if len(piece) > len(text):
            continue
        found = fuzz.partial_ratio_alignment(piece, text)
        if found is not None and found.score > best_score:
            best, best_score = found, found.score
    if best is None or best_score < threshold:
        return None, best_score
    start, end = best.dest_start, best.dest_end
    while start < end and text[start] in _EDGE:
        start += 1
    while end > start and text[end - 1] in _EDGE:
        end -= 1
    percent = 100.0 * start / len(text) if text else 0.0
    page = page_of(start) if page_of is not None else None
    return Location(start, end, percent, page, best_score, text[start:end]), best_score
