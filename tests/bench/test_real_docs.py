"""The real-document QA set (cake_cli.bench.real_docs, data/real_qa.yaml), its scoring, and
`cake bench quality --suite real` end to end on the tiny random model.

The per-document tests read the documents where they are installed: CPython's standard library
always, the Debian documents when their packages are (`.ci/run` installs them); a document whose
package is absent is skipped with the package named.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import pytest
import yaml
from typer.testing import CliRunner

import cake_cli.bench.quality.real as real
import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
from cake_cli.bench.bootstrap import paired_interval
from cake_cli.bench.quality.real import RealCase, _row, common_prefix, selected
from cake_cli.bench.quality.report import keep_checks, real_intervals, select_checks
from cake_cli.bench.real_docs import (
    QUESTION_TYPES,
    SPLITS,
    UNANSWERABLE,
    check_document,
    data_path,
    find_quote,
    load_set,
    present_terms,
    read_document,
    text_sha256,
)
from cake_cli.bench.scoring import normalize_answer, real_scores
from cake_cli.bench.suites import REAL_TASKS, RealSuite, Variant
from cake_cli.cli.bench_options import real_suite_from
from cake_cli.cli.main import app
from cake_cli.engine.replay import prefix_cache
from cake_cli.errors import CakeError
from cake_cli.tasks.answers.cite import parse_cited
from cake_cli.tasks.inputs.documents import page_of_offset
from cake_cli.tasks.templates import load_template

REAL = load_set()
IDS = [d.id for d in REAL.documents]
runner = CliRunner()


# ---- the set ------------------------------------------------------------------------------


def test_the_set_is_large_enough_and_its_ids_unique():
    questions = REAL.questions
    assert len(REAL.documents) >= 12 and len(questions) >= 150
    assert sum(not q.answerable for q in questions) >= 30
    assert {q.type for q in questions} <= set(QUESTION_TYPES)
    assert len({q.type for q in questions}) == len(QUESTION_TYPES)  # every kind of question is asked
    ids = [q.id for q in questions]
    assert len(set(ids)) == len(ids)
    assert all(2000 <= d.tokens <= 42000 for d in REAL.documents)
    assert (
        sum(d.tokens <= 6000 for d in REAL.documents) >= 4
        and sum(8000 <= d.tokens <= 20000 for d in REAL.documents) >= 4
    )
    for doc in REAL.documents:
        assert any(q.answerable for q in doc.questions) and any(not q.answerable for q in doc.questions)
        assert (doc.source == "debian") == (doc.package is not None)
        assert all(bool(q.absent) == (not q.answerable) for q in doc.questions)  # version 2: key terms listed
    # every gold answer keeps words after SQuAD normalisation (an answer of punctuation alone can never be exact)
    assert all(normalize_answer(a) for q in questions for a in q.answers)
    # and no gold answer is already in its question (restating the question would score exact), but for a
    # question that names its options
    choices = {"python-heapq-05"}  # "Does heappop() return the smallest or the largest item?"
    given = [
        (q.id, a)
        for q in questions
        for a in q.answers
        if f" {normalize_answer(a)} " in f" {normalize_answer(q.question)} " and q.id not in choices
    ]
    assert given == []


def test_the_split_is_by_document_and_both_halves_are_large_enough():
    assert REAL.version == 2 and {d.split for d in REAL.documents} == set(SPLITS)
    halves = {s: [d for d in REAL.documents if d.split == s] for s in SPLITS}
    assert sorted(i for s in SPLITS for i in REAL.split_ids(s)) == sorted(IDS)  # each document in one half
    for split, docs in halves.items():
        assert list(REAL.split_ids(split)) == [d.id for d in docs]
        questions = [q for d in docs for q in d.questions]
        assert len(docs) >= 6 and len(questions) >= 70, split
        assert sum(not q.answerable for q in questions) >= 14, split
        assert min(d.tokens for d in docs) <= 6000 and max(d.tokens for d in docs) >= 14000, split  # short and long
        assert {d.source for d in docs} == {"debian", "python"}, split
    sizes = [sum(len(d.questions) for d in docs) for docs in halves.values()]
    assert max(sizes) <= 1.25 * min(sizes)  # roughly half each
    with pytest.raises(CakeError, match="unknown split"):
        REAL.split_ids("test")


def _write(tmp_path, data) -> object:
    path = tmp_path / "set.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _good() -> dict:
    return yaml.safe_load(data_path().read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "spoil, words",
    [
        (lambda d: d.update(version=3), "version"),
        (lambda d: d.update(version=1), "need version 2"),  # a version 1 file has no split
        (lambda d: d["documents"][0].update(split="dev"), "split"),
        (lambda d: d["documents"][0].pop("split"), "no split"),
        (lambda d: d["documents"][0]["questions"][-1].pop("absent"), "absent key terms"),
        (lambda d: d["documents"][0]["questions"][0].update(absent=["x y"]), "only an unanswerable"),
        (lambda d: d["documents"][0].update(colour="blue"), "colour"),
        (lambda d: d["documents"][0]["questions"][0].pop("evidence"), "needs answers and evidence"),
        (lambda d: d["documents"][0]["questions"][0].update(type="guess"), "type"),
        (lambda d: d["documents"][0]["questions"][-1].update(answers=["x"]), "no answers and no evidence"),
        (lambda d: d["documents"][1]["questions"][0].update(id=d["documents"][0]["questions"][0]["id"]), "twice"),
        (lambda d: d["documents"][0].update(sha256="abc"), "sha256"),
        (lambda d: d["documents"][0]["questions"][0]["evidence"].update(offset="12"), "offset"),
        (lambda d: d["documents"][0].pop("package"), "package"),
    ],
)
def test_the_loader_is_strict(tmp_path, spoil, words):
    data = _good()
    spoil(data)
    with pytest.raises(CakeError) as info:
        load_set(_write(tmp_path, data))
    assert words in str(info.value)


def test_a_version_1_file_still_loads_without_a_split(tmp_path):
    data = _good()
    data["version"] = 1
    for doc in data["documents"]:
        doc.pop("split")
        for q in doc["questions"]:
            q.pop("absent", None)
    old = load_set(_write(tmp_path, data))
    assert old.version == 1 and len(old.questions) == len(REAL.questions)
    assert all(d.split is None for d in old.documents) and all(not q.absent for q in old.questions)
    with pytest.raises(CakeError, match="has no split"):
        old.split_ids("held-out")


# ---- every quote at its offset, per document ----------------------------------------------


@pytest.mark.parametrize("doc_id", IDS)
def test_every_quote_is_in_its_document_at_its_offset(doc_id):
    spec = next(d for d in REAL.documents if d.id == doc_id)
    reason = spec.missing()
    if reason:
        pytest.skip(reason)
    doc = read_document(spec)
    checked = check_document(spec, doc)
    if checked.changed:  # another package version: the quotes must still be found (fuzzily or moved)
        assert not checked.skipped, checked.skipped
        pytest.skip(f"{spec.path} differs from the set's version (sha256 {text_sha256(doc.text)[:12]}…)")
    assert len(doc.text) == spec.chars
    assert (len(doc.page_offsets) if doc.kind == "pdf" else None) == spec.pages
    for q in spec.questions:
        if q.evidence is None:
            assert not q.answerable and q.type == UNANSWERABLE
            continue
        found = checked.found[q.id]
        assert found.how == "at offset" and found.start == q.evidence.offset, q.id
        assert page_of_offset(doc, found.start) == q.evidence.page, q.id
        assert " ".join(doc.text[found.start : found.end].split()) == " ".join(q.evidence.quote.split())
    # an unanswerable question's key terms are nowhere in the text (case and line breaks aside)
    for q in spec.questions:
        if not q.answerable:
            assert q.absent and present_terms(doc.text, q.absent) == [], q.id


def test_present_terms_ignores_case_and_line_breaks():
    text = "The Debian\nProject Leader is elected yearly."
    assert present_terms(text, ["project leader", "debian project", "salary", "yearly."]) == [
        "project leader",
        "debian project",
        "yearly.",
    ]


def test_a_missing_package_is_skipped_with_its_name(tmp_path):
    data = _good()
    data["documents"][0]["path"] = "/usr/share/doc/not-a-package/none.pdf"
    data["documents"][0]["package"] = "not-a-package"
    spec = load_set(_write(tmp_path, data)).documents[0]
    assert "apt-get install not-a-package" in spec.missing()
    with pytest.raises(CakeError, match="not-a-package"):
        read_document(spec)


def test_find_quote_at_offset_moved_and_fuzzy():
    text = "Intro.\n\nThe quick brown fox jumps over\nthe lazy dog near the river bank. End."
    quote = "The quick brown fox jumps over the lazy dog"
    at = text.index("The quick")
    assert find_quote(text, quote, at).how == "at offset"
    moved = find_quote("x" * 50 + text, quote, at)
    assert moved.how == "moved" and moved.start == at + 50
    fuzzy = find_quote(text.replace("brown", "browm"), quote, at)  # extraction differs by a letter
    assert fuzzy.how == "fuzzy" and abs(fuzzy.start - at) <= 2 and fuzzy.similarity >= 90
    assert find_quote(text, "An entirely different sentence about cats", at) is None


# ---- scoring ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, answers, expected",
    [
        ("Answer: not in the document", (), (1.0, 1.0)),  # unanswerable, abstained: right
        ("The document does not say.", (), (1.0, 1.0)),
        ('Answer: Bruce Perens\nPassage: "Bruce Perens led Debian"', (), (0.0, 0.0)),  # should have abstained
        ("Answer: not in the document", ("Bruce Perens",), (0.0, 0.0)),  # answerable, abstained: wrong
        ('Answer: Bruce Perens\nPassage: "Bruce Perens led Debian from April 1996"', ("Bruce Perens",), (1.0, 1.0)),
        ("Answer: Perens", ("Bruce Perens",), (pytest.approx(2 / 3), 0.0)),  # partly right: F1, not exact
        ("Answer: Ian Murdock", ("Bruce Perens",), (0.0, 0.0)),
    ],
)
def test_scores_of_hand_made_replies(reply, answers, expected):
    cited = parse_cited(reply)
    assert real_scores(cited.answer, cited.abstained, answers) == expected


@pytest.fixture(scope="module")
def heapq_doc():
    spec = next(d for d in REAL.documents if d.id == "python-heapq")
    return check_document(spec, read_document(spec))


def _case(doc, qid: str, task: str, dropped=None) -> RealCase:
    question = next(q for q in doc.questions if q.id == qid)
    return RealCase(doc, question, 32768, task, (1, 2, 3), dropped)


def test_rows_score_cited_replies_and_abstentions(heapq_doc):
    cake = Variant("cake", "cake", "cake")

    def row(qid: str, task: str, reply: str, dropped=None):
        return _row(_case(heapq_doc, qid, task, dropped), cake, 256, None, reply, 1.0, 0.5)

    quote = "# Original code by Kevin O'Connor, augmented by Tim Peters and Raymond Hettinger"
    cited = f'Answer: Kevin O\'Connor\nPassage: "{quote}"'
    right = row("python-heapq-02", "real", cited)
    assert (right.score, right.exact, right.support, right.abstained) == (1.0, 1.0, "located", False)
    made_up = row("python-heapq-02", "real", 'Answer: Guido\nPassage: "Guido wrote it"')
    assert (made_up.exact, made_up.support) == (0.0, "unsupported")
    # --abstain unsupported: an invented answer is withheld, scored as an abstention (still "unsupported")
    case = _case(heapq_doc, "python-heapq-08", "real-absent")
    invented = 'Answer: Guido\nPassage: "Guido wrote it"'
    kept = _row(case, cake, 256, None, invented, 1.0, 0.5, "never")
    withheld = _row(case, cake, 256, None, invented, 1.0, 0.5, "unsupported")
    assert (kept.exact, kept.abstained, kept.support) == (0.0, False, "unsupported")
    assert (withheld.exact, withheld.abstained, withheld.support) == (1.0, True, "unsupported")
    assert withheld.prediction == invented  # the model's reply is kept as it was
    lost = _row(_case(heapq_doc, "python-heapq-02", "real"), cake, 256, None, "Answer: Guido", 1.0, 0.5, "unsupported")
    assert (lost.exact, lost.abstained) == (0.0, True)
    absent = row("python-heapq-08", "real-absent", "Answer: not in the document")
    assert (absent.score, absent.exact, absent.support, absent.abstained) == (1.0, 1.0, "abstained", True)
    # the passage was cut: an abstention is right, and an answer quoting the unread part is unsupported
    start = heapq_doc.found["python-heapq-02"].start
    unread = (start - 10, start + 200)
    assert row("python-heapq-02", "real-cut", "not in the document", unread).exact == 1.0
    quoted = row("python-heapq-02", "real-cut", cited, unread)
    assert (quoted.exact, quoted.support) == (0.0, "unsupported")


def test_with_sections_the_first_located_section_answers(heapq_doc):
    question = next(q for q in heapq_doc.questions if q.id == "python-heapq-02")
    at = heapq_doc.found[question.id].start
    sections = ((0, at - 5), (at - 5, len(heapq_doc.doc.text)))
    case = RealCase(heapq_doc, question, 600, "real-middle", (), None, sections, ((1,), (2,)))
    quote = "# Original code by Kevin O'Connor, augmented by Tim Peters and Raymond Hettinger"
    cake = Variant("cake", "cake", "cake")
    replies = ["Answer: not in the document", f'Answer: Kevin O\'Connor\nPassage: "{quote}"']
    row = _row(case, cake, 256, None, replies, 1.0, 0.5)
    assert (row.exact, row.support, row.prediction) == (1.0, "located", replies[1]) and row.prompt_tokens == 2
    assert row.sections == [[replies[0], "abstained"], [replies[1], "located"]]  # every section's reply, kept
    # the same quote from the wrong section is not found there: unsupported (scored on its content all the same)
    swapped = _row(case, cake, 256, None, replies[::-1], 1.0, 0.5)
    assert (swapped.exact, swapped.support) == (1.0, "unsupported")
    silent = _row(case, cake, 256, None, ["not in the document"] * 2, 1.0, 0.5)
    assert (silent.exact, silent.support) == (0.0, "abstained")
    assert _row(replace(case, sections=()), cake, 256, None, replies[1], 1.0, 0.5).sections is None


def test_the_step_count_counts_each_section(heapq_doc):
    """With --long sections each section is a prefill and its replays: heapq's 6,142 tokens (the set's count)
    make 2 sections of a 4,096-token context, 1 of an 8,192-token one (what `split_sections` cuts for the
    default model, whose tokenizer the set counts with)."""
    cells = [Variant("full", None, None), Variant("cake", "cake", "cake")]
    n = len(heapq_doc.questions)
    for long, length, parts in (("sections", 4096, 2), ("sections", 8192, 1), ("middle", 4096, 1)):
        suite = RealSuite(lengths=(length,), long=long)
        assert real.prompts_per_question(heapq_doc, length, long) == parts
        assert real.count_steps([heapq_doc], suite, cells, [64, 256], set()) == (n * parts, n * parts * 3)


def test_quick_picks_one_answerable_and_one_unanswerable(heapq_doc):
    picked = selected(heapq_doc, quick=True)
    assert [q.answerable for q in picked] == [True, False]
    assert len(selected(heapq_doc, quick=False)) == len(heapq_doc.questions)


# ---- the command --------------------------------------------------------------------------

TINY_REAL = ["bench", "quality", "--suite", "real", "--model", "tiny-test", "--threads", "1"]


def test_real_suite_end_to_end_then_resume(cli_env):
    out = cli_env / "real.json"
    args = [*TINY_REAL, "--documents", "python-textwrap", "--split", "tune", "--quick", "--lengths", "600"]
    args += ["--budgets", "32", "--methods", "full,cake,h2o", "--output", str(out)]  # h2o: records every query
    args += ["--markdown", str(cli_env / "real.md")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert len(rows) == 2 * 3  # 2 questions (quick) x (full + cake + h2o at one budget)
    assert data["meta"]["split"] == "real" and data["meta"]["documents"] == ["python-textwrap"]
    assert data["meta"]["subset"] == "tune" and data["meta"]["abstain"] == "doubt"  # the default
    assert {r["task"] for r in rows} <= set(REAL_TASKS) and {r["source"] for r in rows} == {"python-textwrap"}
    assert all(r["support"] in ("located", "unsupported", "abstained") for r in rows)
    assert all(0.0 <= r["score"] <= 1.0 and r["exact"] in (0.0, 1.0) for r in rows)
    assert all(r["prompt_tokens"] <= 600 for r in rows)
    assert "real documents" in result.stdout and "overall" in result.stdout
    # the paired intervals of cake against full and h2o, by question, on the tune documents
    assert "tune documents" in result.stdout and "paired bootstrap by question" in result.stdout
    assert "all questions (2)" in result.stdout and "answerable (1)" in result.stdout
    table = (cli_env / "real.md").read_text()
    assert "tune documents · cake - other method" in table and "| h2o | answerable (1) |" in table
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "resuming" in again.stderr
    assert json.loads(out.read_text())["rows"] == rows


def test_real_suite_with_sections(cli_env):
    args = [*TINY_REAL, "--documents", "python-heapq", "--quick", "--lengths", "700", "--budgets", "32"]
    result = runner.invoke(app, [*args, "--methods", "cake", "--long", "sections", "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["meta"]["long"] == "sections"
    tasks = {s["task"] for s in data["summary"]["scores"]}
    assert "real-cut" not in tasks and tasks & {"real", "real-middle"}  # nothing is cut: every passage is read
    assert "section 2/" in result.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--documents", "nope"], "unknown document 'nope'"),
        (["--long", "sideways"], "unknown --long mode"),
        (["--depths", "0.5"], "--depths apply to --suite needle only"),
        (["--tasks", "qa"], "--tasks apply to --suite needle only"),
        (["--split", "dev"], "unknown --split 'dev'"),
        (["--abstain", "maybe"], "unknown --abstain mode 'maybe'"),
        (["--split", "held-out", "--documents", "python-shlex"], "python-shlex is not in the held-out split"),
    ],
)
def test_real_suite_usage_errors(cli_env, extra, message):
    result = runner.invoke(app, [*TINY_REAL, "--budgets", "32", *extra])
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr and result.stdout == ""


def test_documents_needs_the_real_suite(cli_env):
    result = runner.invoke(app, ["bench", "quality", "--model", "tiny-test", "--documents", "python-heapq"])
    assert result.exit_code == 2 and "--suite real" in result.stderr
    unknown = runner.invoke(app, ["bench", "quality", "--model", "tiny-test", "--suite", "rael"])
    assert unknown.exit_code == 2 and "did you mean 'real'" in unknown.stderr
    needle = runner.invoke(app, ["bench", "quality", "--model", "tiny-test", "--long", "sections"])
    assert needle.exit_code == 2 and "--long applies to --suite real only" in needle.stderr
    split = runner.invoke(app, ["bench", "quality", "--model", "tiny-test", "--split", "held-out"])
    assert split.exit_code == 2 and "--split applies to --suite real only" in split.stderr


@pytest.mark.parametrize("split", SPLITS)
def test_split_asks_that_half_of_the_documents(split):
    suite = real_suite_from(None, None, False, split=split)
    assert suite.subset == split and suite.documents == REAL.split_ids(split)
    assert {next(d.split for d in REAL.documents if d.id == i) for i in suite.documents} == {split}
    one = REAL.split_ids(split)[-1]
    assert real_suite_from(None, one, False, split=split).documents == (one,)  # --documents within the half
    everything = real_suite_from(None, None, False)
    assert everything.subset is None and everything.documents == ()  # no split: every installed document


def test_real_intervals_pair_by_question_against_full_and_each_baseline():
    """`report.real_intervals` against `bootstrap.paired_interval` on the questions paired by hand."""
    exact = {  # question -> (task, full, cake at 64, snapkv at 64)
        "q1": ("real", 1.0, 1.0, 0.0),
        "q2": ("real", 1.0, 0.0, 0.0),
        "q3": ("real-absent", 0.0, 1.0, 1.0),
        "q4": ("real", 0.0, 1.0, 1.0),
        "q5": ("real-cut", 1.0, 1.0, 0.0),
    }
    rows = []
    for q, (task, *scores) in exact.items():
        for (method, budget), x in zip([("full", None), ("cake", 64), ("snapkv", 64)], scores):
            rows.append(dict(task=task, case_id=q, length=32768, method=method, budget=budget, exact=x, score=x))
    got = {(iv.other, iv.questions): iv.interval for iv in real_intervals(rows, ["full", "cake", "snapkv"], [64])}
    assert set(got) == {(m, g) for m in ("full", "snapkv") for g in ("all questions", "answerable")}
    answerable = [q for q, v in exact.items() if v[0] == "real"]
    for other, col in (("full", 1), ("snapkv", 3)):
        for group, qs in (("all questions", sorted(exact)), ("answerable", sorted(answerable))):
            want = paired_interval([exact[q][2] for q in qs], [exact[q][col] for q in qs])
            assert got[(other, group)] == want, (other, group)
    assert got[("full", "answerable")].cases == 3 and got[("snapkv", "all questions")].mean == pytest.approx(0.4)
    assert real_intervals(rows, ["full", "snapkv"], [64]) == []  # no cake in the run: nothing to compare


def test_keep_checks_print_issue_45s_shares_and_the_lower_bound():
    """40 answerable questions: the full cache right on 20; the method right on 19 at 1024 (95%: PASS on
    the share, but its interval against full must also have a lower bound >= -5) and on 17 at 512 (85%)."""
    rows = []
    for i in range(40):
        q = f"q{i}"
        rows.append(dict(task="real", case_id=q, length=32768, method="full", budget=None, exact=float(i < 20)))
        rows.append(dict(task="real", case_id=q, length=32768, method="m", budget=1024, exact=float(i < 19)))
        rows.append(dict(task="real", case_id=q, length=32768, method="m", budget=512, exact=float(i < 17)))
    rows.append(dict(task="real-absent", case_id="u", length=32768, method="m", budget=1024, exact=1.0))  # not counted
    intervals = real_intervals(rows, ["full", "m"], [512, 1024], versus="m")
    low = next(iv.interval for iv in intervals if (iv.other, iv.budget, iv.questions) == ("full", 1024, "answerable"))
    lines = keep_checks(rows, intervals, "m")
    want = "PASS" if low.low >= -0.05 else "FAIL"
    assert lines[0].startswith(f"{want} B=1024: on the 40 answerable questions m keeps 95% of the full cache's")
    assert f"m - full -2.5 [{100 * low.low:+.1f}, +0.0] (target: lower bound >= -5)" in lines[0]
    assert (
        lines[1]
        == "FAIL B=512: on the 40 answerable questions m keeps 85% of the full cache's exact answers (target 90%)"
    )
    assert keep_checks([r for r in rows if r["method"] != "full"], intervals, "m") == []  # no full cache: no lines


def test_select_checks_compare_the_selected_prompt_with_its_method_on_the_full_prefill():
    """50 answerable questions: m right on 25; m@select right on 24 of them at 256 (-2.0: PASS, within 2
    points) and on 23 at 1024 (-4.0: FAIL); an unanswerable row is not counted."""
    rows = []
    for i in range(50):
        q = f"q{i}"
        for budget, right in ((256, 24), (1024, 23)):
            rows.append(dict(task="real", case_id=q, length=32768, method="m", budget=budget, exact=float(i < 25)))
            rows.append(dict(task="real", case_id=q, length=32768, method="m@select", budget=budget,
                             exact=float(i < right)))  # fmt: skip
    rows.append(dict(task="real-absent", case_id="u", length=32768, method="m@select", budget=256, exact=0.0))
    rows.append(dict(task="real-absent", case_id="u", length=32768, method="m", budget=256, exact=1.0))
    intervals = real_intervals(rows, ["m", "m@select"], [256, 1024], versus="m@select")
    lines = select_checks(rows, intervals, "m@select")
    assert [line.split(":")[0] for line in lines] == ["PASS B=256", "FAIL B=1024"]
    want = "on the 50 answerable questions m@select answers 48.0% right, m on the full prefill 50.0%: -2.0 ["
    assert want in lines[0]
    assert lines[0].endswith("(target: within 2 points)") and ": -4.0 [" in lines[1]
    assert select_checks(rows, real_intervals(rows, ["m", "m@select"], [256], versus="m"), "m") == []  # no @select


def test_page_of_offset_is_the_evidence_page():  # a PDF's evidence names its page
    spec = next(d for d in REAL.documents if d.id == "debian-history")
    if spec.missing():
        pytest.skip(spec.missing())
    doc = read_document(spec)
    q = spec.questions[0]
    assert partial(page_of_offset, doc)(q.evidence.offset) == q.evidence.page >= 1


def test_common_prefix_leaves_every_prompt_a_token_of_its_own():
    assert common_prefix([(1, 2, 3, 4), (1, 2, 3, 5), (1, 2, 9)]) == 2
    assert common_prefix([(1, 2, 3), (1, 2, 3, 4)]) == 2  # the shorter prompt keeps its last token
    assert common_prefix([(7, 8), (6, 8)]) == 0


@pytest.mark.parametrize("long", ["middle", "sections"])
def test_questions_sharing_their_document_prefill_answer_as_alone(cli_env, long):
    """Sharing the document block's prefill (each section's, with sections) changes nothing in the
    rows (predictions, scores)."""
    base = [*TINY_REAL, "--documents", "python-textwrap", "--quick", "--lengths", "600", "--budgets", "32"]
    base += ["--methods", "full,cake,snapkv", "--long", long]
    shared, alone = cli_env / "shared.json", cli_env / "alone.json"
    made = []
    # 8 new tokens, not the template's: what is compared is the prefill, and the tiny model never stops early
    # (with sections, every section's replies ran to the limit: 6 minutes of the suite)
    short = lambda name: replace(load_template(name), max_new_tokens=8)  # noqa: E731
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(real, "load_template", short)
        mp.setattr(real, "prefix_cache", lambda model, ids: made.append(ids.shape[1]) or prefix_cache(model, ids))
        assert runner.invoke(app, [*base, "--output", str(shared)]).exit_code == 0
    # one prefill of the document block for both questions; with sections, of each section the two
    # questions split alike (a longer question leaves less room, so sections may split elsewhere)
    assert (len(made) == 1 and made[0] > 64) if long == "middle" else len(made) >= 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(real, "load_template", short)
        mp.setattr(real, "can_share", lambda *a: False)
        assert runner.invoke(app, [*base, "--output", str(alone)]).exit_code == 0
    key = lambda r: (r["case_id"], r["method"], r["budget"])  # noqa: E731
    a = sorted(json.loads(shared.read_text())["rows"], key=key)
    b = sorted(json.loads(alone.read_text())["rows"], key=key)
    assert len(a) == len(b) == 2 * 3
    assert [(r["prediction"], r["score"], r["support"]) for r in a] == [
        (r["prediction"], r["score"], r["support"]) for r in b
    ]
