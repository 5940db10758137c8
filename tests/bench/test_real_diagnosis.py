"""The real set's loss diagnosis (`bench.real_diagnosis`) and the evidence spans it reads
(`bench.quality.real.evidence_spans`, `--diagnose survival` on the real suite)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
from cake_cli.bench.quality.real import RealCase, build_case, common_prefix, evidence_spans, longest_question
from cake_cli.bench.quality.run import Model
from cake_cli.bench.real_diagnosis import bars, cause_counts, cause_of, losses, outcome_rows
from cake_cli.bench.real_docs import check_document, load_set, read_document
from cake_cli.cli.main import app
from tests.helpers.tiny import build_tiny_tokenizer

runner = CliRunner()
L = 6
KEPT = [10, 10, 40, 40, 40, 10]  # median 40: layers 2-4 are the roomy ones


def grid(passage, answer):
    return [[p, a] for p, a in zip(passage, answer)]


@pytest.mark.parametrize(
    ("passage", "answer", "cause"),
    [
        ([1.0] * L, [1.0] * L, "decode"),  # everything there: the reply differs all the same
        ([0.3] * L, [1.0] * L, "span"),  # the answer without its sentence
        ([0.2, 0.2, 1.0, 1.0, 1.0, 0.2], [0.0, 0.0, 1.0, 1.0, 1.0, 0.0], "allocation"),  # kept where room
        ([0.2] * L, [0.0, 0.0, 0.5, 0.0, 0.0, 0.0], "indicator"),  # lost even where room
        ([1.0] * L, [None] * L, "decode"),  # no verbatim answer: the passage stands for it
        ([0.1] * L, [None] * L, "indicator"),
    ],
)
def test_the_cause_of_a_loss(passage, answer, cause):
    got = cause_of(grid(passage, answer), KEPT)
    assert got[3] == cause
    assert got[0] == pytest.approx(sum(passage) / L)
    assert got[1] == (None if answer[0] is None else pytest.approx(sum(answer) / L))


def test_cause_of_refuses_a_mismatch_or_no_passage():
    with pytest.raises(ValueError, match="layers"):
        cause_of(grid([1.0] * L, [1.0] * L), KEPT[:3])
    with pytest.raises(ValueError, match="passage"):
        cause_of(grid([None] * L, [None] * L), KEPT)


def test_losses_pair_the_full_cache_right_with_the_method_wrong():
    def row(qid, method, budget, exact, survival=None):
        r = {"case_id": qid, "length": 8, "method": method, "budget": budget, "exact": exact, "source": "doc"}
        return r | ({"survival": survival, "kept": KEPT} if survival else {}) | {"prediction": f"{method} {qid}"}

    lost = grid([0.3] * L, [1.0] * L)
    rows = [
        row("q1", "full", None, 1.0, grid([1.0] * L, [1.0] * L)),
        row("q1", "cake", 64, 0.0, lost),  # a loss
        row("q1", "cake", 128, 1.0, lost),  # right: not a loss
        row("q2", "full", None, 0.0),
        row("q2", "cake", 64, 0.0, lost),  # the full cache was wrong too: not a loss
        row("q3", "full", None, 1.0),
        row("q3", "cake", 64, 0.0),  # no survival stored: left out
    ]
    found = losses(rows)
    assert [(x.question, x.budget, x.cause, x.full_reply) for x in found] == [("q1", 64, "span", "full q1")]
    counts = cause_counts(found, [64, 128])
    assert counts[1] == ["span", "1", "0"] and counts[-1] == ["lost answers", "1", "0"]
    assert bars((0.0, 0.5, 1.0, None)) == " ▄█·"
    # q1 at 64 lost (passage 30%, answer 100%), at 128 kept right; q2 is not counted (the full cache was wrong)
    assert outcome_rows(rows, [64, 128]) == [["right", "-", "30 / 100 (1)"], ["lost", "30 / 100 (1)", "-"]]


@pytest.fixture(scope="module")
def heapq_doc():
    spec = next(d for d in load_set().documents if d.id == "python-heapq")
    return check_document(spec, read_document(spec))


def test_evidence_spans_cover_the_quote_and_the_answer(heapq_doc):
    tok = build_tiny_tokenizer()
    model = Model(None, tok, 10**6, frozenset())
    question = next(q for q in heapq_doc.questions if q.id == "python-heapq-02")
    case = build_case(model, heapq_doc, question, 10**6)
    passage, answer = evidence_spans(model, case)
    found = heapq_doc.found[question.id]
    quote = heapq_doc.doc.text[found.start : found.end]
    inner = tok.decode(list(case.input_ids[passage[0] : passage[1]]))
    assert inner.strip() and inner.strip() in quote and len(inner) >= len(quote) - 12
    assert passage[0] <= answer[0] < answer[1] <= passage[1]
    assert "O'Connor" in tok.decode(list(case.input_ids[answer[0] : answer[1] + 1]))
    absent = next(q for q in heapq_doc.questions if not q.answerable)
    assert evidence_spans(model, build_case(model, heapq_doc, absent, 10**6)) == [None, None]
    cut = RealCase(heapq_doc, question, 10, "real-cut", case.input_ids[:5], (0, 10))
    assert evidence_spans(model, cut) == [None, None]


def test_the_real_suite_diagnoses_on_request(cli_env):
    out = cli_env / "real.json"
    args = ["bench", "quality", "--suite", "real", "--model", "tiny-test", "--threads", "1"]
    args += ["--documents", "python-textwrap", "--split", "tune", "--quick", "--lengths", "600"]
    args += ["--budgets", "32", "--methods", "full,cake", "--diagnose", "survival", "--output", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    read = [r for r in rows if r["task"] == "real"]
    assert read and all(len(r["survival"]) == len(r["kept"]) for r in read)
    full = next(r for r in read if r["method"] == "full")
    assert all(v == 1.0 for layer in full["survival"] for v in layer if v is not None)
    cake = next(r for r in read if r["method"] == "cake")
    assert max(cake["kept"]) < full["kept"][0] and all(k >= 0 for k in cake["kept"])
    assert all("kept" not in r for r in rows if r["task"] != "real")  # no passage, nothing to diagnose
    assert "lost, by cause" in result.stdout


def test_every_question_of_a_document_reads_the_same_cut(heapq_doc):
    tok = build_tiny_tokenizer()
    model = Model(None, tok, 10**6, frozenset())
    longest = longest_question(model, heapq_doc)
    cases = [build_case(model, heapq_doc, q, 600, "middle", longest) for q in heapq_doc.questions]
    assert len({c.dropped for c in cases}) == 1 and cases[0].dropped is not None
    assert all(len(c.input_ids) <= 600 for c in cases)
    shared = common_prefix([c.input_ids for c in cases])
    question_part = max(len(tok(q.question)["input_ids"]) for q in heapq_doc.questions) + 8
    assert shared >= min(len(c.input_ids) for c in cases) - question_part  # all but the question is shared
    alone = [build_case(model, heapq_doc, q, 600) for q in heapq_doc.questions]  # sized per question: cuts differ
    assert len({c.dropped for c in alone}) > 1


def test_versus_picks_the_method_of_the_intervals(cli_env):
    out = cli_env / "real.json"
    args = ["bench", "quality", "--suite", "real", "--model", "tiny-test", "--threads", "1", "--documents"]
    args += ["python-textwrap", "--quick", "--lengths", "600", "--budgets", "32", "--methods", "full,cake,snapkv"]
    result = runner.invoke(app, [*args, "--split", "tune", "--versus", "snapkv", "--output", str(out)])
    assert result.exit_code == 0, result.stderr
    assert "snapkv - other method" in result.stdout and "│ cake " in result.stdout
    bad = runner.invoke(app, [*args, "--versus", "h2o"])
    assert bad.exit_code == 2 and "--versus method" in bad.stderr and "h2o" in bad.stderr
    wrong_suite = runner.invoke(app, ["bench", "quality", "--model", "tiny-test", "--versus", "cake"])
    assert wrong_suite.exit_code == 2 and "--suite real only" in wrong_suite.stderr
