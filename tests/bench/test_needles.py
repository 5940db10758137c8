"""NeedleBench-style case generator: needles at the requested depth, answers recoverable, real text."""

from __future__ import annotations

import re

import pytest

from cake_cli.bench.datasets import haystack_text
from cake_cli.bench.needles import NEEDLE_TASKS, insert_at_depths, make_needle_case, needle_facts
from cake_cli.bench.splits import NEEDLE_GAP, needle_depths
from tests.helpers.tiny import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def build(tok, task, depth, index=0, split="eval", doc_tokens=900):
    return make_needle_case(
        task,
        split,
        index,
        depth,
        1024,
        doc_tokens,
        tokenizer=tok,
        haystack=haystack_text("python-docs"),
        haystack_name="python-docs",
    )


def span(case):
    start, end = map(int, re.fullmatch(r"python-docs\[(\d+):(\d+)\]", case.source).groups())
    return start, end


@pytest.mark.parametrize("task", NEEDLE_TASKS)
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_needles_sit_at_the_requested_depth(tok, task, depth):
    """Depth = the fraction of the haystack (needles excluded) before a needle, as NeedleBench
    defines it, in characters and in tokens."""
    case = build(tok, task, depth, index=3, doc_tokens=1500)
    facts = needle_facts(task, "eval", 3)
    doc = case.document
    inserted = [len(f" {n} ") for n in facts.needles]
    hay_chars = len(doc) - sum(inserted)
    hay_tokens = len(tok(doc, add_special_tokens=False)["input_ids"]) - sum(
        len(tok(f" {n} ", add_special_tokens=False)["input_ids"]) for n in facts.needles
    )
    targets = needle_depths(depth, len(facts.needles))
    for i, (needle, offset, target) in enumerate(zip(facts.needles, case.insert_offsets, targets)):
        assert doc[offset : offset + len(needle)] == needle  # inserted verbatim where it says
        before = offset - 1 - sum(inserted[:i])  # haystack characters before this needle
        assert abs(before / hay_chars - target) <= 0.025  # character fraction
        before_tokens = len(tok(doc[: offset - 1], add_special_tokens=False)["input_ids"]) - sum(
            len(tok(f" {n} ", add_special_tokens=False)["input_ids"]) for n in facts.needles[:i]
        )
        assert abs(before_tokens / hay_tokens - target) <= 0.04  # token fraction
    assert list(case.insert_offsets) == sorted(case.insert_offsets)  # needles keep their order
    assert abs(len(tok(doc, add_special_tokens=False)["input_ids"]) - 1500) <= 30  # sized as asked


@pytest.mark.parametrize("task", NEEDLE_TASKS)
def test_answer_is_recoverable_from_the_document(tok, task):
    for index in range(4):  # every phrasing
        case = build(tok, task, 0.4, index=index)
        facts = needle_facts(task, "eval", index)
        for needle in facts.needles:
            assert needle in case.document
        for keyword in case.keywords:
            assert keyword in case.document
        if task in ("s-rt", "m-rt"):
            assert all(ref in case.document for ref in case.references)  # the reference is the needle
            assert len(case.keywords) == len(case.references) == (1 if task == "s-rt" else 3)
            for ref, keyword in zip(case.references, case.keywords):
                assert keyword in ref
        else:  # two hops: the question names the first needle's subject, the answer is in the second
            first, second = facts.needles
            bridge = (
                set(re.findall(r"[A-Z][a-z]+(?: [A-Z][a-z]+)?", first))
                & set(re.findall(r"[A-Z][a-z]+(?: [A-Z][a-z]+)?", second))
            ) - {"The"}
            assert bridge, (first, second)
            assert case.keywords[0] in second and case.keywords[0] not in first
            assert not any(b in case.question for b in bridge)  # the question does not give the bridge away
            assert case.keywords[0] not in case.question


def test_haystack_is_real_text_from_the_source(tok):
    case = build(tok, "m-rt", 0.5)
    start, end = span(case)
    text = case.document
    for needle in reversed(needle_facts("m-rt", "eval", 0).needles):
        text = text.replace(f" {needle} ", "", 1)
    assert text == haystack_text("python-docs")[start:end]


def test_insert_at_depths_snaps_to_sentence_ends():
    text = "One two three. Four five six. Seven eight nine. Ten eleven twelve."
    doc, offsets = insert_at_depths(text, ["NEEDLE."], [0.5])
    assert doc[offsets[0] :].startswith("NEEDLE.")
    assert doc[: offsets[0]].rstrip().endswith(".")  # after a full sentence, no word split
    assert doc.replace(" NEEDLE. ", "") == text


def test_facts_are_deterministic_and_vary():
    assert needle_facts("s-rt", "eval", 5) == needle_facts("s-rt", "eval", 5)
    assert len({needle_facts("s-rt", "eval", i).needles for i in range(20)}) == 20
    assert all(len(set(needle_facts("m-rt", "tune", i).keywords)) == 3 for i in range(20))
    with pytest.raises(ValueError):
        needle_facts("qa", "eval", 0)
    with pytest.raises(ValueError):
        needle_facts("s-rt", "test", 0)


def test_gap_between_needles(tok):
    case = build(tok, "m-rt", 0.2, doc_tokens=1500)
    fractions = [o / len(case.document) for o in case.insert_offsets]
    for a, b in zip(fractions, fractions[1:]):
        assert abs((b - a) - NEEDLE_GAP) <= 0.05
