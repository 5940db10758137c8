"""`question_rows`: the prompt's tokens from the question's first token (its last occurrence) to the end."""

from __future__ import annotations

import pytest

from cake_cli.tasks.question_window import question_rows
from cake_cli.tasks.templates import build_prompt, load_template
from tests.helpers.tiny import build_tiny_tokenizer

QUESTION = "who wrote the letter?"
CLOSING = "<|im_end|>\n<|im_start|>assistant\n"  # the tiny ChatML template's end of a user turn


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def qa_ids(tok, document: str, question: str = QUESTION) -> list[int]:
    prompt = build_prompt(tok, load_template("qa"), document, max_prompt_tokens=10**6, question=question)
    return list(prompt.input_ids)


def test_the_question_and_the_chat_templates_closing_on_a_qa_prompt(tok):
    ids = qa_ids(tok, "The quick brown fox jumps over the lazy dog. " * 20)
    r = question_rows(tok, ids, QUESTION)
    # byte-level BPE: the question's words are tokens of their own (" who" holds the space before it)
    want = len(tok(" " + QUESTION, add_special_tokens=False).input_ids) + len(tok(CLOSING).input_ids)
    assert r == want == 13
    assert tok.decode(ids[-r:]) == " " + QUESTION + CLOSING
    assert QUESTION not in tok.decode(ids[-(r - 1) :])  # the smallest suffix that holds it


def test_the_last_occurrence_counts_when_the_document_also_asks_it(tok):
    document = f"Question: {QUESTION} The secretary wrote it. " * 5
    ids = qa_ids(tok, document)
    assert tok.decode(ids).count(QUESTION) == 6
    assert question_rows(tok, ids, QUESTION) == question_rows(tok, qa_ids(tok, "The secretary wrote it."), QUESTION)


def test_surrounding_whitespace_is_ignored_and_a_missing_question_refused(tok):
    ids = qa_ids(tok, "Numbers like 1, 2, 3 appear in long documents too.")
    assert question_rows(tok, ids, f"  {QUESTION}\n") == question_rows(tok, ids, QUESTION)
    with pytest.raises(ValueError, match="not in the prompt"):
        question_rows(tok, ids, "what is the capital of France?")
    with pytest.raises(ValueError, match="empty"):
        question_rows(tok, ids, "  ")


def test_a_question_at_the_very_start_counts_every_token(tok):
    ids = tok(QUESTION, add_special_tokens=False).input_ids
    assert question_rows(tok, ids, QUESTION) == len(ids)
