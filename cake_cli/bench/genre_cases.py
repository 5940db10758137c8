"""`--suite genres`: cases whose haystacks come from five genres of real text (`bench.genres`),
with varied invented facts (`bench.facts`), and QA on Wikipedia (SQuAD / HotpotQA).

A case is (task, genre, index, depth, length). Its id names the genre ("code/d50-n3"), so one
results file holds every genre; its row's `split` is the genre's ("tune" or "held-out").
Haystack offset and facts are seeded by (seed, task, genre, index): the suite is deterministic
given `seed`. Needles go in as sentences between sentences (prose) or as whole `#` comment lines
at a line start (source code, `genres.comment_lines`), first at `depth`, each further one
`splits.NEEDLE_GAP` later (NeedleBench's placement).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cake_cli.bench.facts import FACT_TASKS, genre_facts
from cake_cli.bench.genres import GENRES, comment_lines, genre_split, genre_text
from cake_cli.bench.needles import SNAP_CHARS, Facts, haystack_slice, insert_at_depths
from cake_cli.bench.splits import Case, case_id, needle_depths

GENRE_TASKS = (*FACT_TASKS, "qa")
QA_GENRE = "wiki"  # QA (SQuAD + HotpotQA paragraphs) is Wikipedia text: asked in that genre only
QA_SPLIT = "eval"  # of `datasets`' item split: the wiki genre is held out, and so are its QA items


@dataclass(frozen=True)
class GenreSuite:
    """Which genre cases to run: every task x genre x depth x repeat x length (QA: wiki only)."""

    tasks: tuple[str, ...]
    genres: tuple[str, ...]
    lengths: tuple[int, ...]  # nominal prompt lengths, tokens (clamped to the model's limit)
    depths: tuple[float, ...]  # fractions of the document
    repeats: int  # cases per (task, genre, depth); m-each: 3 consecutive cases share a document
    seed: int = 0
    split: str = "genres"

    def specs(self) -> list[tuple[str, int, float, int, str]]:
        """(task, index, depth, length, genre) of every case, in run order."""
        out = []
        for task in self.tasks:
            for genre in self.genres:
                if task == "qa" and genre != QA_GENRE:
                    continue
                for d_idx, depth in enumerate(self.depths):
                    for r in range(self.repeats):
                        index = d_idx * self.repeats + r
                        out.extend((task, index, depth, length, genre) for length in self.lengths)
        return out


GENRE_SUITE = GenreSuite(GENRE_TASKS, GENRES, (4096, 8192, 16384, 32768), (0.1, 0.5, 0.9), 3)
QUICK_GENRE_SUITE = GenreSuite(GENRE_TASKS, GENRES, (4096,), (0.5,), 1)
SEARCH_GENRE_SUITE = GenreSuite(FACT_TASKS, GENRES, (4096, 8192), (0.25, 0.75), 1)  # profile search


def genre_case_id(genre: str, index: int, depth: float) -> str:
    """The id of a genre case, the same at every length, e.g. "code/d50-n3"."""
    return f"{genre}/{case_id(index, depth)}"


def _line_start_before(text: str, pos: int) -> int:
    """The offset of the start of the line holding `pos` (at most SNAP_CHARS back), else `pos`."""
    nl = text.rfind("\n", max(pos - SNAP_CHARS, 0), pos)
    return nl + 1 if nl >= 0 else pos


def insert_lines(text: str, pieces: list[str], depths: list[float]) -> tuple[str, tuple[int, ...]]:
    """Insert each piece as its own comment line ("# piece") at the line start nearest before its
    depth (fraction of `text`'s characters); pieces keep their order.

    Returns:
        (new text, character offset of each piece (after "# ") in the new text).
    """
    points = [_line_start_before(text, int(round(d * len(text)))) for d in depths]
    for i in range(1, len(points)):
        points[i] = max(points[i], points[i - 1])
    out, offsets, last, size = [], [], 0, 0
    for point, piece in zip(points, pieces):
        out.append(text[last:point])
        size += point - last
        line = f"# {piece}\n" if point == 0 or text[point - 1] == "\n" else f"\n# {piece}\n"
        offsets.append(size + line.index("# ") + 2)
        out.append(line)
        size += len(line)
        last = point
    out.append(text[last:])
    return "".join(out), tuple(offsets)


def make_genre_case(
    task: str,
    genre: str,
    index: int,
    depth: float,
    length: int,
    doc_tokens: int,
    *,
    tokenizer,
    seed: int = 0,
    facts: Facts | None = None,
) -> Case:
    """One fact case of the genre suite: a slice of about `doc_tokens` tokens of the genre's text
    (`genres.genre_text`) with the facts inside (QA cases: `datasets.make_qa_case`).

    Raises:
        ValueError: the facts alone do not fit; CakeError: the genre's package is missing.
    """
    facts = facts or genre_facts(task, genre, index, seed)
    pieces = [f"# {s}\n" if comment_lines(genre) else f" {s} " for s in facts.needles]
    fact_tokens = sum(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in pieces)
    hay_tokens = doc_tokens - fact_tokens
    if hay_tokens < 16:
        raise ValueError(f"length {length} leaves {hay_tokens} tokens of haystack for {task}; use a longer length")
    text = genre_text(genre)
    doc = index // 3 if task == "m-each" else index  # m-each: the cases of one document share its haystack
    rng = random.Random(f"genre-haystack/{seed}/{task}/{genre}/{doc}/{depth}")
    hay, start, end = haystack_slice(text, 0, len(text), rng, hay_tokens, tokenizer, chars_per_token=6)
    depths = needle_depths(depth, len(facts.needles))
    if comment_lines(genre):
        document, offsets = insert_lines(hay, list(facts.needles), depths)
    else:
        document, offsets = insert_at_depths(hay, list(facts.needles), depths)
    return Case(
        task=task,
        case_id=genre_case_id(genre, index, depth),
        split=genre_split(genre),
        length=length,
        depth=depth,
        document=document,
        question=facts.question,
        references=facts.references,
        keywords=facts.keywords,
        insert_offsets=offsets,
        source=f"{genre}[{start}:{end}]",
    )
