"""Varied invented facts for the multi-genre suite (`bench.genre_cases`): names, numbers, dates,
phrases and quantities, single or chained, from a seeded generator.

NeedleBench's needles (`bench.needles`) are a few templates ("The secret passcode of the X vault
is N"); a profile tuned on them may learn the template. Here each fact draws one of `KINDS`
(each with its own sentence, question and answer shape) and every value is invented (made-up
places and surnames, random numbers, dates and word phrases), so the model cannot answer from
memory and no two facts of a case share an entity. Deterministic in (seed, task, genre, index).

Tasks (NeedleBench v1's names where they match, Li et al. 2024, arXiv 2407.11963):
- `s-rt`: one fact, one question.
- `m-rt`: three facts of different kinds, asked together in one question.
- `m-each`: three facts in the document, one asked per case (case `index` asks fact index % 3 of
  document index // 3, so three consecutive cases share one document).
- `m-rs`: a two-hop chain (A -> B, B -> answer); the question names A and asks for the answer.
"""

from __future__ import annotations

import random

from cake_cli.bench.needles import Facts

FACT_TASKS = ("s-rt", "m-rt", "m-each", "m-rs")
FACTS_PER_DOCUMENT = 3  # m-rt and m-each
KINDS = ("number", "date", "name", "phrase", "quantity")

_FIRST = ("Amara", "Tobias", "Ilse", "Henrik", "Noor", "Caspian", "Odile", "Radek", "Sunniva", "Matteo", "Yara", "Leif")
_SUR_ONSETS = ("Vash", "Oster", "Quill", "Brenn", "Tamsk", "Ulver", "Drach", "Pell", "Myrr", "Skov", "Fenn", "Galt")
_SUR_ENDS = ("ington", "ewicz", "hagen", "ard", "ovic", "mere", "stad", "well", "berg", "lund")
_PLACE_ONSETS = ("Ash", "Brim", "Cald", "Dorn", "Elm", "Frost", "Grey", "Hath", "Ivel", "Karn", "Lum", "Morrow")
_PLACE_ENDS = ("wick", "haven", "thorpe", "combe", "field", "mouth", "gate", "ley", "bury", "stow")
_INSTITUTIONS = ("archive", "observatory", "lighthouse", "library", "foundry", "museum", "reservoir", "academy")
_ADJECTIVES = ("quiet", "copper", "northern", "velvet", "hollow", "bright", "salted", "patient", "seventh", "amber")
_NOUNS = ("heron", "ladder", "orchard", "kettle", "compass", "harbour", "lantern", "meadow", "anvil", "thistle")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October")
_MATERIALS = ("basalt", "pewter", "walnut", "obsidian", "bronze", "cedar", "marble", "tin")
_OBJECTS = ("bell", "clock", "statue", "map", "drum", "loom")


class _Gen:
    """Fresh invented values; none repeats within one case."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _fresh(self, make) -> str:
        while True:
            value = make()
            if value not in self.used:
                self.used.add(value)
                return value

    def person(self) -> str:
        r = self.rng
        return self._fresh(lambda: f"{r.choice(_FIRST)} {r.choice(_SUR_ONSETS)}{r.choice(_SUR_ENDS)}")

    def place(self) -> str:
        r = self.rng
        return self._fresh(lambda: r.choice(_PLACE_ONSETS) + r.choice(_PLACE_ENDS))

    def number(self) -> str:
        return self._fresh(lambda: str(self.rng.randint(10000, 99999)))

    def date(self) -> str:
        r = self.rng
        return self._fresh(lambda: f"{r.randint(2, 28)} {r.choice(_MONTHS)} {r.randint(1620, 1890)}")

    def year(self) -> str:
        return self._fresh(lambda: str(self.rng.randint(1620, 1890)))

    def phrase(self) -> str:
        r = self.rng
        return self._fresh(lambda: f"{r.choice(_ADJECTIVES)} {r.choice(_NOUNS)} {r.choice(_NOUNS)}")

    def quantity(self) -> str:
        return self._fresh(lambda: str(self.rng.randint(120, 980)))

    def pick(self, pool: tuple[str, ...]) -> str:
        return self._fresh(lambda: self.rng.choice(pool))


def one_fact(gen: _Gen, kind: str) -> tuple[str, str, str]:
    """(fact sentence, question, answer) of one kind (`KINDS`); the answer is a substring of the fact.

    Raises:
        ValueError: an unknown kind.
    """
    place, where = gen.place(), gen.pick(_INSTITUTIONS)
    if kind == "number":
        code = gen.number()
        question = f"What is the access code of the {place} {where}?"
        return (f"The access code of the {place} {where} is {code}.", question, code)
    if kind == "date":
        person, date = gen.person(), gen.date()
        return (
            f"{person} opened the {place} {where} on {date}.",
            f"On what date did {person} open the {place} {where}?",
            date,
        )
    if kind == "name":
        person = gen.person()
        return (f"The keeper of the {place} {where} is {person}.", f"Who is the keeper of the {place} {where}?", person)
    if kind == "phrase":
        words = gen.phrase()
        return (
            f'The motto carved above the {place} {where} reads "{words}".',
            f"What motto is carved above the {place} {where}?",
            words,
        )
    if kind == "quantity":
        n = gen.quantity()
        return (
            f"The {place} {where} owns exactly {n} brass keys.",
            f"How many brass keys does the {place} {where} own?",
            n,
        )
    raise ValueError(f"unknown fact kind {kind!r}; choose one of {KINDS}")


def _chain(gen: _Gen, variant: int) -> Facts:
    """A two-hop chain; the question names the first entity and asks for the second fact's value."""
    if variant == 0:
        person, place, year = gen.person(), gen.place(), gen.year()
        facts = (
            f"{person} is the director of the {place} observatory.",
            f"The {place} observatory was founded in {year}.",
        )
        question = f"In which year was the observatory that {person} directs founded?"
        return Facts(facts, question, (f"The observatory that {person} directs was founded in {year}.",), (year,))
    if variant == 1:
        ship, person, village = gen.place(), gen.person(), gen.place()
        facts = (f"The schooner {ship} was built by {person}.", f"{person} lives in the village of {village}.")
        question = f"In which village does the builder of the schooner {ship} live?"
        return Facts(facts, question, (f"The builder of the schooner {ship} lives in {village}.",), (village,))
    place, thing, material = gen.place(), gen.pick(_OBJECTS), gen.pick(_MATERIALS)
    facts = (f"The {place} museum keeps the great {thing}.", f"The great {thing} is made of {material}.")
    question = f"What is the great object kept in the {place} museum made of?"
    return Facts(facts, question, (f"The great {thing} of the {place} museum is made of {material}.",), (material,))


def genre_facts(task: str, genre: str, index: int, seed: int = 0) -> Facts:
    """The facts, question, references and keywords of case `index` of a genre-suite task.

    Deterministic in (seed, task, genre, index); `m-each` cases of one document (index // 3)
    share its facts and differ in the fact asked. Raises ValueError for an unknown task.
    """
    if task not in FACT_TASKS:
        raise ValueError(f"unknown fact task {task!r}; choose one of {FACT_TASKS}")
    doc = index // FACTS_PER_DOCUMENT if task == "m-each" else index
    rng = random.Random(f"facts/{seed}/{task}/{genre}/{doc}")
    gen = _Gen(rng)
    if task == "m-rs":
        return _chain(gen, rng.randrange(3))
    if task == "s-rt":
        fact, question, answer = one_fact(gen, rng.choice(KINDS))
        return Facts((fact,), question, (fact,), (answer,))
    kinds = rng.sample(KINDS, FACTS_PER_DOCUMENT)
    triples = [one_fact(gen, k) for k in kinds]
    facts = tuple(t[0] for t in triples)
    if task == "m-each":
        fact, question, answer = triples[index % FACTS_PER_DOCUMENT]
        return Facts(facts, question, (fact,), (answer,))
    asks = " ".join(f"({i + 1}) {t[1]}" for i, t in enumerate(triples))
    return Facts(facts, f"Answer all three: {asks}", facts, tuple(t[2] for t in triples))
