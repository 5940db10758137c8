"""The eval / tune splits and the benchmark case: what every case builder shares.

The two splits are disjoint by construction (`tests/bench/test_splits.py` checks it): haystack
text by character range, SQuAD articles and HotpotQA items by index (see `bench.datasets`).
"""

from __future__ import annotations

from dataclasses import dataclass

SPLITS = ("eval", "tune")
HAYSTACK_SPLIT = {"eval": (0.0, 0.7), "tune": (0.7, 1.0)}  # fractions of a source's characters
TUNE_EVERY = 5  # SQuAD article / HotpotQA item index % 5 == 4 -> tune
NEEDLE_GAP = 0.1  # fraction of the document between consecutive needles (NeedleBench's `diff`)


def check_split(split: str) -> None:
    """Raise ValueError unless `split` is one of SPLITS."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")


def split_of(index: int) -> str:
    """The split of SQuAD article / HotpotQA item `index`: every TUNE_EVERY-th is `tune`."""
    return "tune" if index % TUNE_EVERY == TUNE_EVERY - 1 else "eval"


def split_range(text_len: int, split: str) -> tuple[int, int]:
    """[start, end) character range of a haystack that `split` may draw from."""
    check_split(split)
    lo, hi = HAYSTACK_SPLIT[split]
    return int(text_len * lo), int(text_len * hi)


@dataclass(frozen=True)
class Case:
    """One benchmark prompt: a document, a question, and what a right answer contains.

    Attributes:
        task: "s-rt", "m-rt", "m-rs" or "qa".
        case_id: stable id within (task, split), independent of the length, e.g. "d50-n3".
        split: "eval" or "tune".
        length: nominal prompt length, tokens (the prompt is built to about this size).
        depth: where the first needle / gold paragraph starts, fraction of the document.
        document: the haystack with the needles (or gold paragraphs) inserted.
        question: asked after the document (inside CAKE's observation window).
        references: needle sentences (needle tasks; M-RS: the answer sentence) or gold answers (qa).
        keywords: per reference, the text a right answer contains (needle tasks); () for qa.
        insert_offsets: character offsets of the needles / gold paragraphs in `document`.
        source: where the haystack came from, e.g. "essays[120033:151100]" or "squad:<id>".
    """

    task: str
    case_id: str
    split: str
    length: int
    depth: float
    document: str
    question: str
    references: tuple[str, ...]
    keywords: tuple[str, ...]
    insert_offsets: tuple[int, ...]
    source: str


def case_id(index: int, depth: float) -> str:
    """The id of a case, the same at every length: depth in percent and index, e.g. "d50-n3"."""
    return f"d{round(depth * 100):02d}-n{index}"


def needle_depths(depth: float, count: int) -> list[float]:
    """Target depths of `count` needles: `depth`, then `NEEDLE_GAP` apart, capped at 1.

    Raises ValueError for a depth outside [0, 1].
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be a fraction in [0, 1], got {depth}")
    return [min(depth + i * NEEDLE_GAP, 1.0) for i in range(count)]
