"""Task templates: strict YAML, the question at the end of the QA prompt, document-only truncation."""

from __future__ import annotations

import pytest

from cake_cli.errors import CakeError, UsageError
from cake_cli.tasks import templates as tasks
from cake_cli.tasks.templates import build_prompt, load_template
from tests.helpers.texts import license_text
from tests.helpers.tiny import build_tiny_tokenizer

QUESTION = "Who wrote the letter on Monday morning, and why?"
ASSISTANT_TAIL = "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def decoded(tokenizer, prompt) -> str:
    return tokenizer.decode(list(prompt.input_ids))


def test_every_shipped_template_loads():
    names = sorted(path.stem for path in tasks.template_dir().glob("*.yaml"))
    assert {"summarize", "qa", "needle", "complete"} <= set(names)
    for name in names:
        template = load_template(name)
        assert template.task == name and template.max_new_tokens > 0


def test_template_flags():
    assert load_template("qa").fields == ("question",)
    assert load_template("needle").fields == ("query",) and load_template("needle").locate
    complete = load_template("complete")
    assert not complete.chat and complete.output == "code" and complete.fields == ()
    assert load_template("summarize").chat and load_template("summarize").output == "text"


@pytest.mark.parametrize(
    "body, words",
    [
        ("version: 1\ntask: t\nuser: '{document}'\nmax_new_tokens: 5\ncolour: red\n", "unknown or missing keys"),
        ("version: 2\ntask: t\nuser: '{document}'\nmax_new_tokens: 5\n", "version 2"),
        ("version: 1\ntask: t\nuser: 'no document here'\nmax_new_tokens: 5\n", "must use {document}"),
        ("version: 1\ntask: t\nuser: '{document} {question}'\nmax_new_tokens: 5\n", "declared fields"),
        ("version: 1\ntask: t\nuser: '{document}'\nmax_new_tokens: 5\noutput: html\n", "'output'"),
        ("version: 1\ntask: t\nuser: '{document}'\nmax_new_tokens: 5\nchat: maybe\n", "'chat'"),
        ("version: 1\ntask: t\nuser: '{document}'\nmax_new_tokens: 5\nfields: question\n", "'fields'"),
        ("version: 1\ntask: t\nuser: '{document}'\n", "unknown or missing keys"),
        ("- a list\n", "unknown or missing keys"),
        ("version: true\ntask: t\nuser: '{document}'\nmax_new_tokens: 5\n", "has version True, expected 1"),
        ("version: 1\ntask: t\nuser: '{document}'\nmax_new_tokens: '64'\n", "'max_new_tokens' must be a positive"),
        ("version: 1\ntask: t\nuser: '{document}'\nmax_new_tokens: true\n", "'max_new_tokens' must be a positive"),
        ("version: 1\ntask: t\nuser: '{document}'\nmax_new_tokens: 0\n", "'max_new_tokens' must be a positive"),
        ("version: 1\ntask: t\nuser: 5\nmax_new_tokens: 5\n", "'user' must be text"),
        ("version: 1\ntask: t\nuser: '{document}'\nmax_new_tokens: 5\nlocate: 1\n", "'locate' must be true"),
        ("version: 1\ntask: t\nuser: '{document}'\nmax_new_tokens: 5\nno_repeat_ngram_size: -1\n", "non-negative"),
        ("version: 1\ntask: !!python/object/apply:os.system [echo hi]\n", "not valid YAML"),  # nothing runs
    ],
)
def test_bad_templates_are_one_line_errors(tmp_path, monkeypatch, body, words):
    (tmp_path / "t.yaml").write_text(body)
    monkeypatch.setattr(tasks, "template_dir", lambda: tmp_path)
    with pytest.raises(CakeError) as err:
        load_template("t")
    assert words in err.value.one_line() and "\n" not in err.value.one_line()
    assert "t.yaml" in err.value.message


def test_template_keys_hint_lists_the_allowed_keys(tmp_path, monkeypatch):
    (tmp_path / "t.yaml").write_text("version: 1\ntask: t\nuser: '{document}'\nmax_new_tokens: 5\ncolour: red\n")
    monkeypatch.setattr(tasks, "template_dir", lambda: tmp_path)
    with pytest.raises(CakeError) as err:
        load_template("t")
    assert err.value.hint == (
        "allowed keys: chat, description, fields, locate, max_new_tokens, no_repeat_ngram_size, output, system, "
        "task, user, version"
    )


def test_minimal_template_gets_the_defaults(tmp_path, monkeypatch):
    (tmp_path / "t.yaml").write_text(
        "version: 1\ntask: t\nuser: 'Sum up: {document}'\nmax_new_tokens: 5\nfields: null\n"
    )
    monkeypatch.setattr(tasks, "template_dir", lambda: tmp_path)
    assert load_template("t") == tasks.Template(
        task="t", description="", system=None, user="Sum up: {document}", max_new_tokens=5
    )


def test_qa_question_ends_the_prompt(tokenizer):
    prompt = build_prompt(
        tokenizer, load_template("qa"), "A short document.", max_prompt_tokens=1000, question=QUESTION
    )
    assert decoded(tokenizer, prompt).endswith(f"Question: {QUESTION}{ASSISTANT_TAIL}")
    assert not prompt.truncated and prompt.warnings == ()


def test_qa_truncates_only_the_document(tokenizer):
    document = license_text()
    prompt = build_prompt(tokenizer, load_template("qa"), document, max_prompt_tokens=400, question=QUESTION)
    text = decoded(tokenizer, prompt)
    assert len(prompt.input_ids) <= 400
    assert prompt.truncated and prompt.document_tokens < prompt.original_document_tokens
    assert "truncated in the middle" in prompt.warnings[0]
    assert text.endswith(f"Question: {QUESTION}{ASSISTANT_TAIL}"), "the question survives whole, at the end"
    assert " … " in text  # the document's middle was cut
    head = document[:40]
    assert head in text and document.strip()[-40:] in text, "the document's head and tail are kept"


def test_qa_truncate_error_refuses(tokenizer):
    with pytest.raises(CakeError) as err:
        build_prompt(
            tokenizer, load_template("qa"), license_text(), max_prompt_tokens=400, truncate="error", question=QUESTION
        )
    assert err.value.exit_code == 1 and "--truncate middle" in err.value.one_line()


def test_qa_question_too_long_to_fit(tokenizer):
    with pytest.raises(CakeError) as err:
        build_prompt(tokenizer, load_template("qa"), "doc", max_prompt_tokens=100, question=QUESTION * 40)
    assert "shorten the question" in err.value.one_line()


def test_missing_field_is_a_usage_error(tokenizer):
    with pytest.raises(UsageError):
        build_prompt(tokenizer, load_template("qa"), "doc", max_prompt_tokens=1000)
    with pytest.raises(UsageError):
        build_prompt(tokenizer, load_template("needle"), "doc", max_prompt_tokens=1000, query="  ")


def test_complete_prompt_is_raw_and_ends_in_the_code(tokenizer):
    code = "def f(x):\n    return x + 1\n\nprint(f(2))"
    text = decoded(tokenizer, build_prompt(tokenizer, load_template("complete"), code, max_prompt_tokens=1000))
    assert text == "Please complete the code given below.\n" + code  # no chat markers, no final newline


CHAT_TASKS = ("qa", "summarize", "needle")


def test_chat_tasks_share_one_prefix_and_split_tokenization_changes_no_id(tokenizer):
    """Every chat task starts with the document block, so one compressed prefix serves them all; the
    split (prefix ids + suffix ids) gives exactly the ids of the unsplit prompt."""
    document = license_text()[:3000]
    prefixes = set()
    for name in (*CHAT_TASKS, "bench_needle", "bench_qa", "complete"):
        template = load_template(name)
        fields = {f: QUESTION for f in template.fields}
        prefix, suffix = tasks.render_split(tokenizer, template, document, **fields)
        user = template.user.format(document=document, **fields)
        if template.chat:
            messages = [{"role": "user", "content": user}]
            whole = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
            whole = list(whole["input_ids"])
        else:
            whole = tokenizer(user)["input_ids"]
        assert prefix + suffix == whole, name
        prompt = build_prompt(tokenizer, template, document, max_prompt_tokens=10**6, **fields)
        assert prompt.prefix_tokens == len(prefix) and list(prompt.input_ids) == whole
        if name in CHAT_TASKS:
            assert template.user.startswith(tasks.DOCUMENT_BLOCK.split("{document}")[0] + "{document}")
            assert template.user[: tasks.split_at(template)] == tasks.DOCUMENT_BLOCK
            prefixes.add(tuple(prefix))
            assert suffix and tokenizer.decode(prefix).endswith("</document>\n\n")
    assert len(prefixes) == 1
    complete = load_template("complete")
    assert tasks.split_at(complete) == len(complete.user), "raw code completion has no shared prefix"


def test_build_prefix_truncates_the_document_to_fit(tokenizer):
    template = load_template("qa")
    prefix = tasks.build_prefix(tokenizer, template, license_text(), max_prompt_tokens=300, truncate="middle")
    assert len(prefix.input_ids) <= 300 and prefix.prefix_tokens == len(prefix.input_ids) and prefix.truncated
    assert " … " in prefix.document_text
    again = build_prompt(tokenizer, template, prefix.document_text, max_prompt_tokens=10**6, question=QUESTION)
    assert list(again.input_ids[: prefix.prefix_tokens]) == list(prefix.input_ids)
