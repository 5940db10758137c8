"""The real suite's abstention figures, and its rows rescored under another `--abstain` mode.

A reply to a real-suite question is right, wrong, an abstention or (with `--abstain foreign` or
`unsupported`) an answer withheld because no passage of the document holds it. What the issue's
targets ask of the default (issue 45): the exact accuracy on the answerable questions, the share
of the unanswerable ones abstained on, and the share of the right answers that cite a located
passage. The abstention rule is applied after the reply is read (`tasks.answers.abstain.decide`),
so a run's stored replies hold everything any mode needs: `rescore` reads and scores them again
without decoding, and `rescore_answers` scores the answers again after a change of the scorer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cake_cli.bench.real_docs import RealSet, load_set, read_document
from cake_cli.bench.scoring import ABSTAIN_TASKS, real_scores
from cake_cli.errors import UsageError
from cake_cli.tasks.answers.abstain import DOUBT, NEVER, counts_as_abstention, decide
from cake_cli.tasks.answers.cite import find_support, parse_cited

ANSWERABLE_TASKS = ("real", "real-middle")


@dataclass(frozen=True)
class AbstentionFigures:
    """One method x budget of a real-suite run: counts of questions."""

    answerable: int  # questions whose answer is in the text read
    right: int  # of those, answered right (exact)
    located: int  # of the right ones, citing a passage found in the document
    false_abstentions: int  # answerable questions abstained on or withheld
    unanswerable: int  # questions whose answer is not in the text read
    abstained: int  # of those, abstained on or withheld (right)

    @property
    def exact(self) -> float:
        """Exact accuracy on the answerable questions, 0-1."""
        return self.right / self.answerable if self.answerable else 0.0

    @property
    def right_abstentions(self) -> float:
        """Share of the unanswerable questions abstained on, 0-1."""
        return self.abstained / self.unanswerable if self.unanswerable else 0.0

    @property
    def located_share(self) -> float:
        """Share of the right answers whose passage is located, 0-1."""
        return self.located / self.right if self.right else 0.0


def abstention_figures(rows: list[dict], method: str, budget: int | None) -> AbstentionFigures:
    """The figures of `method` at `budget` (None: the full cache) over real-suite result rows
    (dicts with task, method, budget, exact, abstained, support)."""
    mine = [r for r in rows if r["method"] == method and r["budget"] == budget]
    answerable = [r for r in mine if r["task"] in ANSWERABLE_TASKS]
    unanswerable = [r for r in mine if r["task"] in ABSTAIN_TASKS]
    right = [r for r in answerable if r["exact"] >= 1.0]
    return AbstentionFigures(
        answerable=len(answerable),
        right=len(right),
        located=sum(r.get("support") == "located" for r in right),
        false_abstentions=sum(bool(r.get("abstained")) for r in answerable),
        unanswerable=len(unanswerable),
        abstained=sum(bool(r.get("abstained")) for r in unanswerable),
    )


def rescore_inputs(rows: list[dict]) -> tuple[dict[str, str], dict[str, tuple]]:
    """What `rescore` reads for `rows`, from the installed real set: document id -> its text (the rows'
    documents only), question id -> (the question, its gold answers)."""
    real = load_set()
    wanted = {r["source"] for r in rows}
    texts = {d.id: read_document(d).text for d in real.documents if d.id in wanted}
    return texts, real_questions(real)


def real_questions(real: RealSet | None = None) -> dict[str, tuple]:
    """Question id -> (the question, its gold answers) of `real` (None: the set's question file, read now; no
    document is read)."""
    return {q.id: (q.question, q.answers) for q in (real or load_set()).questions}


def rescore(
    rows: list[dict], mode: str, documents: Mapping[str, str], questions: Mapping[str, str],
    threshold: float | None = None,
) -> list[dict]:  # fmt: skip
    """`rows` of a run (scored with any `--abstain` mode), as this code with `--abstain mode` would
    score them: each stored reply is read again (`cite.find_support` on the whole document) and scored
    (`scoring.real_scores`), an answer the rule withholds scored as an abstention.

    Args:
        rows: real-suite rows (task, case_id, source, prediction, ...) of documents read whole.
        mode: an `abstain.ABSTAIN_MODES` name.
        documents: document id -> its text.
        questions: question id -> (the question, its gold answers).
        threshold: "checked" and "doubt": the threshold the stored checks are set against (None: the
            mode's own, `abstain.decide`).

    Raises:
        ValueError: an unknown mode; a row of a middle-cut or sectioned document (its reading needs
            what the model read).
    """
    out = []
    for row in rows:
        if row["task"] not in ("real", *ABSTAIN_TASKS) or row["task"] == "real-cut":
            raise ValueError(f"{row['case_id']}: task {row['task']} (a cut or sectioned document) cannot be rescored")
        question, answers = questions[row["case_id"]]
        text = documents[row["source"]]
        support = find_support(row["prediction"], text, query=question)[1]
        support = decide(support, mode, text, question, row.get("check"), threshold)  # the stored check
        abstained = counts_as_abstention(support)
        score, exact = real_scores(support.answer, abstained, answers if row["task"] == "real" else ())
        out.append({**row, "support": support.status, "abstained": abstained, "score": score, "exact": exact})
    return out


def rescore_answers(rows: list[dict], questions: Mapping[str, tuple]) -> list[dict]:
    """`rows` of a run with each answerable question's (score, exact) computed again by this code's
    scorer (`scoring.real_scores` on the reply's short answer, `cite.parse_cited`), every row's support
    and abstention kept as the run decided them. For a change of the scorer only: it needs neither the
    document nor what the model read, so it also takes the middle cut's and the sections' rows.

    Args:
        rows: real-suite rows (task, case_id, prediction, abstained, ...).
        questions: question id -> (the question, its gold answers).
    """
    out = []
    for row in rows:
        if row["task"] in ANSWERABLE_TASKS:
            answers = questions[row["case_id"]][1]
            score, exact = real_scores(parse_cited(row["prediction"]).answer, bool(row["abstained"]), answers)
            row = {**row, "score": score, "exact": exact}
        out.append(row)
    return out


def check_same_rule(path: Path, old: dict, new: dict) -> None:
    """Raise UsageError when a real-suite results file (meta `old`) was scored with another `--abstain` mode, or
    with another doubt threshold under `doubt`, than this run (meta `new`): resuming it would count its stored
    rows under one rule and the new ones under another. A file from before the mode was stored was scored with
    `never`. Nothing is checked for a new file or a run of another suite (no "abstain" in `new`)."""
    if "abstain" not in new or not old:
        return
    was, mode = old.get("abstain", NEVER), new["abstain"]
    threshold = old.get("doubt_threshold"), new.get("doubt_threshold")
    if was != mode or (mode == DOUBT and threshold[0] != threshold[1]):
        said = [f" (doubt threshold {t})" if mode == DOUBT and was == mode else "" for t in threshold]
        raise UsageError(
            f"{path} was scored with --abstain {was}{said[0]}, this run scores with --abstain {mode}{said[1]}",
            f"give --abstain {was}, or score the file again first: python scripts/real_merge.py {path} "
            f"--abstain {mode} -o NEW.json",
        )
