"""NeedleBench-style cases: fictional facts ("needles") inserted into real text at a given depth.

Tasks (NeedleBench v1, Li et al. 2024, arXiv 2407.11963; CAKE paper Appendix on NeedleBench):
- `s-rt` single-needle retrieval: one fact, one question about it.
- `m-rt` multi-needle retrieval: three facts of one kind; the question asks for all three.
- `m-rs` multi-needle reasoning: two facts that must be chained (A -> B, B -> answer).

Facts are invented (made-up names, random codes), so the model cannot answer from memory. The
two splits draw from disjoint vocabularies: `eval` names start with the first half of the
syllable list and its codes lie in [10000, 54999]; `tune` uses the second half and
[55000, 99999]. Needles are placed like NeedleBench's generator: the first at `depth` (fraction of
the document), each further one `NEEDLE_GAP` later, each moved back to the nearest sentence end
so no word is split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cake_cli.bench.splits import Case, case_id, check_split, needle_depths, split_range

NEEDLE_TASKS = ("s-rt", "m-rt", "m-rs")
SNAP_CHARS = 400  # a needle moves back at most this many characters to a sentence end

_ONSETS = (
    "Bar",
    "Cor",
    "Dal",
    "Fen",
    "Gar",
    "Hol",
    "Jor",
    "Kel",
    "Lor",
    "Mar",
    "Nor",
    "Per",
    "Quin",
    "Ros",
    "Sel",
    "Tor",
    "Val",
    "Wen",
    "Zan",
    "Brel",
)
_MIDDLES = ("a", "e", "i", "o", "u", "an", "en", "is", "or", "ul")
_ENDINGS = ("brook", "moor", "hollow", "ford", "wick", "stead", "mere", "vale", "holt", "crest", "dun", "ridge")
_FIRST_ENDINGS = ("do", "na", "rik", "via", "los", "mira", "ten", "sa", "vin", "rel")
_COLORS = ("amber", "silver", "crimson", "jade", "cobalt", "ivory", "golden", "violet")
_OBJECTS = ("compass", "lantern", "chalice", "hourglass", "astrolabe", "music box", "sextant", "telescope")
_CODE_RANGE = {"eval": (10000, 54999), "tune": (55000, 99999)}


@dataclass(frozen=True)
class Facts:
    """The needles of one case and what to ask about them."""

    needles: tuple[str, ...]
    question: str
    references: tuple[str, ...]
    keywords: tuple[str, ...]


class _Names:
    """Invented words from one split's half of the syllable list (disjoint between splits)."""

    def __init__(self, rng: random.Random, split: str):
        half = len(_ONSETS) // 2
        self.onsets = _ONSETS[:half] if split == "eval" else _ONSETS[half:]
        self.rng = rng
        self.codes = _CODE_RANGE[split]
        self.used: set[str] = set()

    def _unique(self, make) -> str:
        while True:
            word = make()
            if word not in self.used:
                self.used.add(word)
                return word

    def place(self) -> str:
        r = self.rng
        return self._unique(lambda: r.choice(self.onsets) + r.choice(_MIDDLES) + r.choice(_ENDINGS))

    def person(self) -> str:
        r = self.rng
        return self._unique(
            lambda: f"{r.choice(self.onsets)}{r.choice(_FIRST_ENDINGS)} "
            f"{r.choice(self.onsets)}{r.choice(_MIDDLES)}{r.choice(_ENDINGS)}"
        )

    def code(self) -> str:
        return self._unique(lambda: str(self.rng.randint(*self.codes)))

    def treasure(self) -> str:
        return self._unique(lambda: f"{self.rng.choice(_COLORS)} {self.rng.choice(_OBJECTS)}")


def needle_facts(task: str, split: str, index: int) -> Facts:
    """The needles, question, references and keywords of case `index` of a needle task.

    Deterministic in (task, split, index); three (S-RT) or two (M-RT, M-RS) phrasings rotate with
    `index`. Raises ValueError for an unknown task or split.
    """
    check_split(split)
    if task not in NEEDLE_TASKS:
        raise ValueError(f"unknown needle task {task!r}; choose one of {NEEDLE_TASKS}")
    rng = random.Random(f"{task}/{split}/{index}")
    n = _Names(rng, split)
    kind = index % (3 if task == "s-rt" else 2)
    if task == "s-rt":
        if kind == 0:
            place, code = n.place(), n.code()
            needle = f"The secret passcode of the {place} vault is {code}."
            return Facts((needle,), f"What is the secret passcode of the {place} vault?", (needle,), (code,))
        if kind == 1:
            place, treasure = n.place(), n.treasure()
            needle = f"The hidden treasure of {place} island is a {treasure}."
            return Facts((needle,), f"What is the hidden treasure of {place} island?", (needle,), (treasure,))
        person, code = n.person(), n.code()
        needle = f"The lucky number of {person} is {code}."
        return Facts((needle,), f"What is the lucky number of {person}?", (needle,), (code,))
    if task == "m-rt":
        if kind == 0:
            places, codes = [n.place() for _ in range(3)], [n.code() for _ in range(3)]
            needles = tuple(f"The secret passcode of the {p} vault is {c}." for p, c in zip(places, codes))
            question = f"What are the secret passcodes of the {places[0]}, {places[1]} and {places[2]} vaults?"
            return Facts(needles, question, needles, tuple(codes))
        people, codes = [n.person() for _ in range(3)], [n.code() for _ in range(3)]
        needles = tuple(f"The lucky number of {p} is {c}." for p, c in zip(people, codes))
        question = f"What are the lucky numbers of {people[0]}, {people[1]} and {people[2]}?"
        return Facts(needles, question, needles, tuple(codes))
    if kind == 0:
        guild, person, town = n.place(), n.person(), n.place()
        needles = (f"The delegate of the {guild} guild is named {person}.", f"{person} was born in the town of {town}.")
        return Facts(
            needles,
            f"In which town was the delegate of the {guild} guild born?",
            (f"The delegate of the {guild} guild was born in the town of {town}.",),
            (town,),
        )
    person, ship, port = n.person(), n.place(), n.place()
    needles = (f"{person} is the captain of the ship {ship}.", f"The ship {ship} is anchored in the harbour of {port}.")
    return Facts(
        needles,
        f"In which harbour is the ship of captain {person} anchored?",
        (f"The ship of captain {person} is anchored in the harbour of {port}.",),
        (port,),
    )


def _sentence_end_before(text: str, pos: int) -> int:
    """The offset just after the last sentence end ('.', '!', '?' + space) at or before `pos`,
    if within SNAP_CHARS or 2% of the text, whichever is smaller; else the last space before
    `pos` (same window); else `pos`."""
    floor = max(pos - min(SNAP_CHARS, max(int(0.02 * len(text)), 8)), 0)
    best = max(text.rfind(p, floor, pos + 1) for p in (". ", "! ", "? ", ".\n"))
    if best >= 0:
        return best + 1
    space = text.rfind(" ", floor, pos + 1)
    return space if space >= 0 else pos


def insert_at_depths(text: str, pieces: list[str], depths: list[float], sep: str = " ") -> tuple[str, tuple[int, ...]]:
    """Insert each piece at its depth (fraction of `text`'s characters), snapped back to a
    sentence end; pieces keep their order.

    Returns:
        (new text, character offset of each piece in the new text).
    """
    points = [_sentence_end_before(text, int(round(d * len(text)))) for d in depths]
    for i in range(1, len(points)):
        points[i] = max(points[i], points[i - 1])  # keep the order even after snapping
    out, offsets, last = [], [], 0
    for point, piece in zip(points, pieces):
        out.append(text[last:point])
        offset = sum(len(s) for s in out) + len(sep)
        out.append(f"{sep}{piece}{sep}")
        offsets.append(offset)
        last = point
    out.append(text[last:])
    return "".join(out), tuple(offsets)


def haystack_slice(
    text: str, lo: int, hi: int, rng: random.Random, tokens: int, tokenizer, chars_per_token: int = 8
) -> tuple[str, int, int]:
    """`tokens` tokens of real text from `text[lo:hi]`, starting at a random sentence start.

    Returns:
        (text of exactly `tokens` tokens, decoded; start offset; end offset in `text`).

    Raises:
        ValueError: the range holds fewer than `tokens` tokens.
    """
    span = tokens * chars_per_token
    if hi - lo < span:
        span = hi - lo
    start = lo + int(rng.random() * (hi - lo - span))
    dot = text.find(". ", start, start + SNAP_CHARS)
    start = dot + 2 if dot >= 0 else start
    end = min(start + span, hi)
    ids = tokenizer(text[start:end], add_special_tokens=False)["input_ids"]
    if len(ids) < tokens:
        raise ValueError(f"the haystack range [{lo}, {hi}) has {len(ids)} tokens from {start}, fewer than {tokens}")
    piece = tokenizer.decode(ids[:tokens])
    return piece, start, start + len(piece)


def make_needle_case(
    task: str,
    split: str,
    index: int,
    depth: float,
    length: int,
    doc_tokens: int,
    *,
    tokenizer,
    haystack: str,
    haystack_name: str,
    facts: Facts | None = None,
) -> Case:
    """Build one needle case: a haystack slice of about `doc_tokens` tokens with the needles inside.

    Args:
        task, split, index: which facts (see `needle_facts`); `index` also picks the haystack offset.
        depth: where the first needle goes, fraction of the document.
        length: nominal prompt length recorded in the case, tokens.
        doc_tokens: tokens the document (haystack + needles) may take.
        tokenizer: the model's tokenizer (sizes are in its tokens).
        haystack: the haystack source text; haystack_name: its name for `Case.source`.
        facts: precomputed `needle_facts(task, split, index)` (optional).

    Raises:
        ValueError: the needles alone do not fit, or the split's range is too short.
    """
    facts = facts or needle_facts(task, split, index)
    needle_tokens = sum(len(tokenizer(" " + s + " ", add_special_tokens=False)["input_ids"]) for s in facts.needles)
    hay_tokens = doc_tokens - needle_tokens
    if hay_tokens < 16:
        raise ValueError(f"length {length} leaves {hay_tokens} tokens of haystack for {task}; use a longer length")
    lo, hi = split_range(len(haystack), split)
    rng = random.Random(f"haystack/{task}/{split}/{index}/{depth}")
    hay, start, end = haystack_slice(haystack, lo, hi, rng, hay_tokens, tokenizer)
    document, offsets = insert_at_depths(hay, list(facts.needles), needle_depths(depth, len(facts.needles)))
    return Case(
        task=task,
        case_id=case_id(index, depth),
        split=split,
        length=length,
        depth=depth,
        document=document,
        question=facts.question,
        references=facts.references,
        keywords=facts.keywords,
        insert_offsets=offsets,
        source=f"{haystack_name}[{start}:{end}]",
    )
