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
from collections import Counter

from rapidfuzz import fuzz

from cake_cli.tasks.results import Location

THRESHOLD = 80.0  # least partial-ratio similarity (0-100) for a location to be reported
MIN_CHARS = 12  # shorter candidates (e.g. "Yes") match somewhere in any long text: not telling

_QUOTED = re.compile(rf"[\"“«'‘]([^\"”»'’]{{{MIN_CHARS},}})[\"”»'’]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_EDGE = " \t\n\"'“”‘’«».,;:!?()[]"


def candidates(answer: str) -> list[str]:
    """Pieces of `answer` that may be the quoted passage, longest first, each >= MIN_CHARS: the whole
    answer, quoted parts, lines, sentences, and what follows a lead-in ending in a colon."""
    pieces = [answer, *_QUOTED.findall(answer), *answer.splitlines(), *_SENTENCE_END.split(answer)]
    pieces += [line.split(": ", 1)[1] for line in answer.splitlines() if ": " in line]
    seen: dict[str, None] = {}
    for piece in pieces:
        piece = piece.strip(_EDGE)
        if len(piece) >= MIN_CHARS:
            seen.setdefault(piece, None)
    return sorted(seen, key=len, reverse=True)


_WORD = re.compile(r"[^\W_]+")
STOPWORDS = frozenset(
    "a an the is are was were be been of to in on at for from by with and or but not no it its this that these "
    "those there here as so than then which who whom whose what when where why how do does did i you we they he "
    "she his her their our your my me us them sentence document query answer passage".split()
)
MIN_COVERAGE = 0.75  # share of an answer's content words (4 or more) the located passage must hold
_WORD_SIMILARITY = 85.0  # a content word of 5+ letters counts as found when this close (rapidfuzz ratio)


def content_words(answer: str, query: str = "") -> list[str]:
    """The words of `answer` that answer something: lower-cased, without the query's own words
    (an answer that echoes the question) and without common function words."""
    asked = set(_WORD.findall(query.lower()))
    return [w for w in _WORD.findall(answer.lower()) if w not in asked and w not in STOPWORDS]


def missing_words(passage: str, words: list[str]) -> list[str]:
    """The content words not in `passage` (matched exactly, or fuzzily for words of 5+ letters)."""
    have = set(_WORD.findall(passage.lower()))
    close = lambda w: len(w) >= 5 and any(fuzz.ratio(w, h) >= _WORD_SIMILARITY for h in have)  # noqa: E731
    return [w for w in words if w not in have and not close(w)]


def covers(passage: str, words: list[str]) -> bool:
    """Whether `passage` holds the answer's content: all of 1-3 content words, at least
    MIN_COVERAGE of more (a quote may end in words of its own, "… and sit on the beach")."""
    if not words:
        return False
    found = len(words) - len(missing_words(passage, words))
    return found == len(words) or (len(words) > 3 and found >= MIN_COVERAGE * len(words))


_SENTENCE_MARK = re.compile(r"[.!?](?=\s)|\n\s*\n")
MAX_WIDEN = 300  # characters a span may grow on each side to reach its sentence's ends


def _sentence_around(text: str, start: int, end: int) -> tuple[int, int]:
    """Widen [start, end) to the sentence(s) it touches (ends: . ! ? before a space or line break,
    or a blank line), by at most MAX_WIDEN characters on each side: a PDF's text may run for pages
    without a sentence end, and a located passage must stay a passage."""
    lo = max(0, start - MAX_WIDEN)
    left = [m.end() for m in _SENTENCE_MARK.finditer(text, lo, start)]
    right = _SENTENCE_MARK.search(text, end, min(len(text), end + MAX_WIDEN))
    return (left[-1] if left else lo), (right.start() + 1 if right else min(len(text), end + MAX_WIDEN))


def _whole_words(text: str, start: int, end: int) -> tuple[int, int]:
    """Widen [start, end) so that it neither starts nor ends inside a word: an alignment may stop at
    "December 199" when the document says "December 1997", and the number check must see "1997"."""
    while start > 0 and text[start - 1].isalnum() and text[start].isalnum():
        start -= 1
    while end < len(text) and text[end].isalnum() and text[end - 1].isalnum():
        end += 1
    return start, end


_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")


def numbers(text: str) -> Counter:
    """The numbers written in `text` ("1996", "3.12", "10,000"), counted: a located passage must hold
    each number of the answer as often as the answer says it."""
    return Counter(_NUMBER.findall(text))


def missing_numbers(passage: str, answer: str) -> list[str]:
    """The numbers of `answer` that `passage` does not hold (as often as the answer has them)."""
    return sorted((numbers(answer) - numbers(passage)).elements())


def locate(
    answer: str, text: str, page_of=None, threshold: float = THRESHOLD, query: str = ""
) -> tuple[Location | None, float]:
    """Where in `text` the passage quoted by `answer` is, if it holds the answer's content.

    Each candidate piece of the answer is aligned to the text; a location is reported only when
    the aligned passage contains the answer's content words (`content_words`: not the query's
    words echoed back, so "The launch code is 18." is not located at "The launch code for …" when
    the document says TANGO-417-ECHO). When the best alignment lacks them, the content words
    themselves are aligned and widened to their sentence.

    Args:
        answer: the generated quote (any length; may carry prose or quotes around it).
        text: the document text the offsets refer to.
        page_of: optional function offset -> 1-based page (PDF) or None.
        threshold: least similarity (0-100) to report a location.
        query: what the user asked (its words are not content).

    Returns:
        (location or None, best similarity found, 0-100). The location's span is trimmed of
        surrounding spaces and punctuation; on a tie the longer candidate wins.
    """
    aligned = []  # (score, start, end, the content words that span must hold)
    for piece in candidates(answer):
        found = fuzz.partial_ratio_alignment(piece, text) if len(piece) <= len(text) else None
        if found is not None:
            aligned.append((found.score, found.dest_start, found.dest_end, content_words(piece, query)))
    best_score = max((a[0] for a in aligned), default=0.0)
    spans = sorted((a for a in aligned if a[0] >= threshold and a[3]), key=lambda a: a[0], reverse=True)
    words = content_words(answer, query)
    joined = " ".join(words)
    if len(joined) >= MIN_CHARS:  # shorter content ("18", "yes") matches somewhere in any long text
        found = fuzz.partial_ratio_alignment(joined, text, processor=str.lower)
        if found is not None and found.score >= threshold:
            spans.append((found.score, *_sentence_around(text, found.dest_start, found.dest_end), words))
    for score, start, end, needed in spans:
        start, end = _whole_words(text, start, end)
        if covers(text[start:end], needed):
            return _location(text, start, end, score, page_of), score
    return None, best_score


def _location(text: str, start: int, end: int, score: float, page_of) -> Location:
    """The Location of text[start:end], trimmed of spaces and punctuation at both ends."""
    while start < end and text[start] in _EDGE:
        start += 1
    while end > start and text[end - 1] in _EDGE:
        end -= 1
    percent = 100.0 * start / len(text) if text else 0.0
    page = page_of(start) if page_of is not None else None
    return Location(start, end, percent, page, score, text[start:end])


MAX_SENTENCE = 400  # characters: a longer "sentence" (code, a table) is read line by line


def sentences(text: str) -> list[tuple[int, int]]:
    """The [start, end) spans of `text`'s sentences (ends: . ! ? before a space, or a blank line);
    one longer than MAX_SENTENCE characters is split into its lines."""
    bounds = [0, *(m.end() for m in _SENTENCE_MARK.finditer(text)), len(text)]
    spans = []
    for start, end in zip(bounds, bounds[1:]):
        if end - start <= MAX_SENTENCE:
            spans.append((start, end))
            continue
        at = start
        for line in text[start:end].split("\n"):
            spans.append((at, at + len(line)))
            at += len(line) + 1
    return [(a, b) for a, b in spans if text[a:b].strip()]


def supporting_sentence(answer: str, text: str, query: str = "", page_of=None) -> Location | None:
    """The sentence of `text` that holds the answer, when the model quoted none that is found: every
        content word (`content_words`) and every number of `answer`, and the most of the question's own
        content words (half of them and at least one, unless the answer has two or more content words of
    3+ letters: "8" is placed only in a sentence about what was asked).

        For a short answer ("Greg Ward", "70") that no quote backs, this is the passage a user can check
        it against; an answer whose words are in no one sentence is not located.

        Returns:
            The Location of the best sentence (most question words, then the shortest), or None.
    """
    words = content_words(answer, query)
    if not words:
        return None
    asked = content_words(query)
    telling = sum(len(w) >= 3 for w in words) >= 2
    best = None  # (question words found, -length, start, end)
    for start, end in sentences(text):
        piece = text[start:end]
        if missing_words(piece, words) or missing_numbers(piece, answer):
            continue
        found = len(asked) - len(missing_words(piece, asked)) if asked else 0
        if not telling and (found == 0 or 2 * found < len(asked)):  # "8": a sentence about the question
            continue
        key = (found, -(end - start), start, end)
        best = key if best is None or key[:2] > best[:2] else best
    if best is None:
        return None
    return _location(text, best[2], best[3], 100.0, page_of)
