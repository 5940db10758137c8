"""The abstention rule (`tasks.answers.abstain`): replies built so that their support is known.

Each case is a reply read by the real `cite.find_support` on a small document, then decided under
every mode; the oracle is what the reply was built to be (copied from the document, made of the
document's words, or brought from outside it)."""

from __future__ import annotations

import pytest

from cake_cli.bench.quality.abstention import abstention_figures, rescore, rescore_answers
from cake_cli.bench.quality.report import real_target_checks
from cake_cli.tasks.answers.abstain import (
    ABSTAIN_MODES,
    CHECK_THRESHOLD,
    CHECKED,
    DOUBT,
    DOUBT_THRESHOLD,
    FOREIGN,
    NEVER,
    WITHHELD,
    WITHHOLD_UNSUPPORTED,
    counts_as_abstention,
    decide,
    foreign_terms,
    shown_answer,
)
from cake_cli.tasks.answers.cite import find_support
from cake_cli.tasks.results import Support

DOC = (
    "The release team freezes the archive in January. During the freeze, only fixes for release-critical "
    "bugs are accepted. A maintainer who goes on vacation should post a message with the [VAC] tag to the "
    "debian-private mailing list. The keyring is updated every month by the keyring maintainers, and the "
    "key server at keyring.debian.org receives new keys."
)
QUESTION = "What tag does a vacation message carry?"

# reply, the status find_support gives it, whether a word or number of its answer is not in DOC
CASES = [
    (
        'Answer: [VAC]\nPassage: "A maintainer who goes on vacation should post a message with the [VAC] tag"',
        "located",
        False,
    ),
    ("Answer: [VAC]", "located", False),  # no quote, but one sentence about the question holds it
    ("Answer: freeze month", "unsupported", False),  # the document's words, in no one sentence
    (
        'Answer: every 3 months\nPassage: "The keyring is updated every month by the keyring maintainers"',
        "unsupported",
        True,
    ),
    ('Answer: Sam Hocevar\nPassage: "Sam Hocevar was the project leader in 2007."', "unsupported", True),
    ("Answer: not in the document", "abstained", False),
]


@pytest.mark.parametrize(("reply", "status", "foreign"), CASES)
def test_each_mode_withholds_exactly_the_answers_it_names(reply, status, foreign):
    support = find_support(reply, DOC, query=QUESTION)[1]
    assert support.status == status  # the reply is what it was built to be
    withheld = {mode: decide(support, mode, DOC, QUESTION).withheld for mode in ABSTAIN_MODES}
    assert withheld == {
        NEVER: False,
        FOREIGN: status == "unsupported" and foreign,
        CHECKED: status == "unsupported" and foreign,  # not asked (check None): foreign's rule
        DOUBT: status == "unsupported" and foreign,
        WITHHOLD_UNSUPPORTED: status == "unsupported",
    }
    for check in (0.0, CHECK_THRESHOLD - 1e-6, CHECK_THRESHOLD, 1.0):  # the model's own P(yes)
        says_no = check < CHECK_THRESHOLD
        assert decide(support, CHECKED, DOC, QUESTION, check).withheld == (
            status == "unsupported" and (foreign or says_no)
        )
    for check in (0.0, DOUBT_THRESHOLD - 1e-6, DOUBT_THRESHOLD, 1.0):  # the model's own P(abstaining)
        doubts = check >= DOUBT_THRESHOLD
        assert decide(support, DOUBT, DOC, QUESTION, check).withheld == (
            status == "unsupported" and (foreign or doubts)
        )
    for mode in ABSTAIN_MODES:
        decided = decide(support, mode, DOC, QUESTION)
        # the model's answer, passage and status stay as they were: only `withheld` changes
        assert (decided.status, decided.answer, decided.passage) == (support.status, support.answer, support.passage)
        assert counts_as_abstention(decided) == (status == "abstained" or decided.withheld)
        assert shown_answer(decided, support.answer) == (WITHHELD if decided.withheld else support.answer)


def test_foreign_terms_are_the_words_and_numbers_not_in_the_document():
    assert foreign_terms("every 3 months", DOC) == ["3"]
    assert foreign_terms("Sam Hocevar", DOC) == ["sam", "hocevar"]
    assert foreign_terms("keyring maintainer", DOC) == []  # "maintainer": close to "maintainers", fuzzily
    assert foreign_terms("vacation message", DOC, QUESTION) == []
    assert foreign_terms("", DOC) == []
    assert foreign_terms("January 2024", DOC) == ["2024"]


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown abstention mode 'maybe'"):
        decide(Support("unsupported", "x", ""), "maybe")


def _row(case_id: str, task: str, prediction: str) -> dict:
    # exact, support and abstained as a run scored them: rescore reads the reply again
    return dict(case_id=case_id, task=task, source="doc", method="cake", budget=1024, prediction=prediction,
                support="unsupported", exact=0.0, score=0.0, abstained=False)  # fmt: skip


ROWS = [
    _row("q1", "real", 'Answer: [VAC]\nPassage: "with the [VAC] tag"'),  # right, located
    _row("q2", "real", "Answer: the VAC tag of the freeze month"),  # right, unsupported, the document's words
    _row("q3", "real", "Answer: Sam Hocevar"),  # wrong, foreign
    _row("q4", "real-absent", "Answer: every 3 months"),  # invented: withheld by both rules
    _row("q5", "real-absent", "Answer: freeze month"),  # invented from the document's words
    _row("q6", "real-absent", "Answer: not in the document"),
]
GOLD = {"q1": ("[VAC]", "VAC"), "q2": ("[VAC]", "VAC"), "q3": ("[VAC]", "VAC")}


@pytest.mark.parametrize(
    ("mode", "right", "located", "lost", "abstained"),
    [(NEVER, 2, 1, 0, 1), (FOREIGN, 2, 1, 1, 2), (WITHHOLD_UNSUPPORTED, 1, 1, 2, 3)],
)
def test_rescore_and_figures_count_the_withheld_answers(mode, right, located, lost, abstained):
    questions = {r["case_id"]: (QUESTION, GOLD.get(r["case_id"], ())) for r in ROWS}
    rows = rescore(ROWS, mode, {"doc": DOC}, questions)
    f = abstention_figures(rows, "cake", 1024)
    assert (f.answerable, f.right, f.located, f.false_abstentions) == (3, right, located, lost)
    assert (f.unanswerable, f.abstained) == (3, abstained)
    assert f.exact == pytest.approx(right / 3) and f.right_abstentions == pytest.approx(abstained / 3)
    assert f.located_share == pytest.approx(located / right)
    assert abstention_figures(rows, "full", None).answerable == 0  # another cell: nothing


def test_rescore_reads_the_reply_again_and_refuses_a_cut_document():
    withheld = [{**ROWS[3], "abstained": True, "exact": 1.0}]  # as a run with --abstain unsupported stored it
    assert rescore(withheld, NEVER, {"doc": DOC}, {"q4": (QUESTION, ())})[0]["exact"] == 0.0
    with pytest.raises(ValueError, match="cannot be rescored"):
        rescore([{**ROWS[0], "task": "real-cut"}], NEVER, {"doc": DOC}, {"q1": (QUESTION, ())})


def test_the_real_report_checks_the_located_share_of_right_answers():
    class NoSummary:  # no B = 256 cells: only the B = 1024 lines
        def get(self, *args):
            return None

    questions = {r["case_id"]: (QUESTION, GOLD.get(r["case_id"], ())) for r in ROWS}
    lines = real_target_checks(rescore(ROWS, NEVER, {"doc": DOC}, questions), NoSummary())
    assert "FAIL B=1024: cake cites a located passage for 1 of its 2 right answers (50%; target 80%)" in lines
    located = [{**r, "support": "located"} for r in rescore(ROWS, NEVER, {"doc": DOC}, questions)]
    assert "PASS B=1024: cake cites a located passage for 2 of its 2 right answers (100%; target 80%)" in (
        real_target_checks(located, NoSummary())
    )


def test_rescore_answers_scores_the_answers_again_and_keeps_what_the_run_decided():
    sigma = [  # stored as the scorer before the number rule scored them: "1." against "1.0" read as "10"
        {**_row("s1", "real", "Answer: The default sigma is 1.\nPassage: sigma=1.0"), "support": "located"},
        {**_row("s2", "real-middle", "Answer: 10"), "exact": 1.0, "score": 1.0},
        {**_row("s3", "real", "Answer: 1.0"), "abstained": True},  # withheld by the run's rule: stays 0
        {**_row("s4", "real-cut", "Answer: 1.0"), "exact": 0.0},  # an abstention task: its score is not an answer's
    ]
    gold = {c: (QUESTION, ("1.0",)) for c in ("s1", "s2", "s3")} | {"s4": (QUESTION, ())}
    rows = rescore_answers(sigma, gold)
    assert [r["exact"] for r in rows] == [1.0, 0.0, 0.0, 0.0]
    assert [r["score"] for r in rows] == [pytest.approx(2 * 0.25 / 1.25), 0.0, 0.0, 0.0]  # "default sigma is 1" vs "1"
    assert [(r["support"], r["abstained"]) for r in rows] == [(r["support"], r["abstained"]) for r in sigma]
