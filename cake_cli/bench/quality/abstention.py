"""The real suite's abstention figures, and its rows rescored under another `--abstain` mode.

A reply to a real-suite question is right, wrong, an abstention or (with `--abstain foreign` or
`unsupported`) an answer withheld because no passage of the document holds it. What the issue's
targets ask of the default (issue 45): the exact accuracy on the answerable questions, the share
of the unanswerable ones abstained on, and the share of the right answers that cite a located
passage. The abstention rule is applied after the reply is read (`tasks.answers.abstain.decide`),
so a run scored with `--abstain never` holds everything another mode needs: `rescore` applies it
to the stored rows without decoding again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cake_cli.bench.scoring import ABSTAIN_TASKS
from cake_cli.tasks.answers.abstain import NEVER, counts_as_abstention, decide
from cake_cli.tasks.answers.cite import parse_cited
from cake_cli.tasks.results import Support

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


def rescore(rows: list[dict], mode: str, documents: Mapping[str, str], questions: Mapping[str, str]) -> list[dict]:
    """`rows` of a run scored with `--abstain never`, as `--abstain mode` would have scored them:
    an answer the rule withholds becomes an abstention (exact 1 on an unanswerable question, 0 on
    an answerable one); every other row is unchanged.

    Args:
        rows: real-suite rows (task, case_id, source, prediction, exact, score, abstained, support).
        mode: an `abstain.ABSTAIN_MODES` name.
        documents: document id -> its text (the rule "foreign" looks for the answer's words there).
        questions: question id -> the question.

    Raises:
        ValueError: an unknown mode, or a row already withheld (the run was not scored with "never").
    """
    out = []
    for row in rows:
        if row.get("support") == "unsupported" and row.get("abstained"):
            raise ValueError(f"{row['case_id']}: already withheld; rescore a run scored with --abstain {NEVER}")
        support = Support(row.get("support") or "", parse_cited(row["prediction"]).answer, "")
        decided = decide(support, mode, documents[row["source"]], questions[row["case_id"]])
        if decided.withheld and counts_as_abstention(decided):
            right = 1.0 if row["task"] in ABSTAIN_TASKS else 0.0
            row = {**row, "abstained": True, "exact": right, "score": right}
        out.append(row)
    return out
