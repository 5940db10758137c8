"""Where the real set's points go (`cake bench quality --suite real --diagnose survival`): for each
question the full cache answers right and a method answers wrong, which of the gold passage's and
gold answer's tokens each layer kept, and the likely cause of the loss.

Each diagnosed row carries `survival` [L][2] (per layer, the share of the passage's and of the
answer's prompt tokens kept, averaged over KV heads, `bench.survival.fact_survival`) and `kept` [L]
(the tokens each layer kept per KV head: its budget plus the window). The cause is read from them:

- decode: the answer's tokens and most of its passage survived in every layer; the tokens were
  there and the reply still differs (the decode, or what the rest of the cache lost).
- span: the answer's tokens survived but most of its passage did not: scattered tokens where the
  answer needs its sentence.
- allocation: the answer survived in the layers with at least the median budget and was lost in
  the smaller ones: more slots there would have kept it.
- indicator: the answer was lost even in the layers with room: the indicator ranked it low.

The answer stands for itself where one of its gold forms is written verbatim in the passage;
otherwise the passage stands for it. "Survived" is a share >= KEPT.
"""

from __future__ import annotations

from dataclasses import dataclass

KEPT = 0.9  # a span counts as kept where at least this share of its tokens survived
SCATTERED = 0.5  # below this share of the passage kept, the answer's context is scattered
CAUSES = ("decode", "span", "allocation", "indicator")
BARS = " ▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Loss:
    """One answer the full cache got right and `method` got wrong, with what its layers kept."""

    question: str
    source: str
    method: str
    budget: int
    passage: float  # mean share of the passage's tokens kept over layers
    answer: float | None  # the same for the answer's tokens (None: not verbatim in the passage)
    roomy: float  # the answer's (or passage's) share kept in the layers with >= the median budget
    cause: str  # one of CAUSES
    passage_layers: tuple[float | None, ...]  # per layer
    answer_layers: tuple[float | None, ...]
    reply: str
    full_reply: str


def _mean(column) -> float | None:
    values = [v for v in column if v is not None]
    return sum(values) / len(values) if values else None


def cause_of(survival: list[list], kept: list[int]) -> tuple[float, float | None, float, str]:
    """(passage share, answer share, share in the roomy layers, cause) of one lost answer.

    Args:
        survival: [L][2] per layer, the share of the passage's and the answer's tokens kept (None
            where a span was not found in the prompt).
        kept: [L] tokens each layer kept per KV head.

    Returns:
        Means over layers (the answer's None when its span was not found) and one of CAUSES.

    Raises:
        ValueError: `survival` and `kept` differ in length, or the passage was found in no layer.
    """
    if len(survival) != len(kept):
        raise ValueError(f"{len(survival)} survival rows for {len(kept)} layers")
    passage = _mean(row[0] for row in survival)
    if passage is None:
        raise ValueError("the passage was not found in the prompt: nothing to diagnose")
    answer = _mean(row[1] for row in survival) if len(survival[0]) > 1 else None
    target = 1 if answer is not None else 0
    median = sorted(kept)[len(kept) // 2]
    roomy = _mean(row[target] for row, k in zip(survival, kept) if k >= median)
    held = answer if answer is not None else passage
    if held >= KEPT:
        cause = "span" if answer is not None and passage < SCATTERED else "decode"
    else:
        cause = "allocation" if roomy is not None and roomy >= KEPT else "indicator"
    return passage, answer, roomy if roomy is not None else 0.0, cause


def losses(rows: list[dict], method: str = "cake", reference: str = "full") -> list[Loss]:
    """Every (question, budget) where `reference` answered exactly right and `method` did not, with
    its cause (`cause_of`); rows without `survival`/`kept` (or whose passage was not found) are
    left out. Rows are the JSON rows of the real suite."""
    right = {(r["case_id"], r["length"]): r for r in rows if r["method"] == reference and r.get("exact") == 1.0}
    out = []
    for r in rows:
        ref = right.get((r["case_id"], r["length"]))
        if r["method"] != method or ref is None or r.get("exact") != 0.0:
            continue
        survival, kept = r.get("survival"), r.get("kept")
        if not survival or not kept or all(row[0] is None for row in survival):
            continue
        passage, answer, roomy, cause = cause_of(survival, kept)
        out.append(
            Loss(
                r["case_id"],
                r["source"],
                method,
                r["budget"],
                passage,
                answer,
                roomy,
                cause,
                tuple(row[0] for row in survival),
                tuple(row[1] if len(row) > 1 else None for row in survival),
                r["prediction"],
                ref["prediction"],
            )  # fmt: skip
        )
    return sorted(out, key=lambda x: (x.budget, x.source, x.question))


def outcome_rows(
    rows: list[dict], budgets: list[int], method: str = "cake", reference: str = "full"
) -> list[list[str]]:
    """Rows [outcome, "passage % / answer %" at each budget]: over the questions `reference` got
    exactly right, the mean share of the gold passage's and answer's tokens `method` kept (over
    layers and KV heads), for the answers it kept right and for those it lost, with their counts:
    how much less of the passage a lost answer kept than a kept one."""
    right = {(r["case_id"], r["length"]) for r in rows if r["method"] == reference and r.get("exact") == 1.0}
    cells: dict = {}
    for r in rows:
        survival = r.get("survival")
        if r["method"] != method or (r["case_id"], r["length"]) not in right or not survival:
            continue
        passage = _mean(row[0] for row in survival)
        if passage is None:
            continue
        answer = _mean(row[1] for row in survival) if len(survival[0]) > 1 else None
        cells.setdefault(("right" if r.get("exact") == 1.0 else "lost", r["budget"]), []).append((passage, answer))

    def cell(values) -> str:
        if not values:
            return "-"
        answers = [a for _, a in values if a is not None]
        a = f"{100 * sum(answers) / len(answers):.0f}" if answers else "-"
        return f"{100 * sum(p for p, _ in values) / len(values):.0f} / {a} ({len(values)})"

    return [[f"{outcome}", *(cell(cells.get((outcome, b), [])) for b in budgets)] for outcome in ("right", "lost")]


def cause_counts(found: list[Loss], budgets: list[int]) -> list[list[str]]:
    """Rows [cause, count at each budget] and a total row."""
    rows = [[c, *(str(sum(1 for x in found if x.budget == b and x.cause == c)) for b in budgets)] for c in CAUSES]
    return rows + [["lost answers", *(str(sum(1 for x in found if x.budget == b)) for b in budgets)]]


def bars(column: tuple[float | None, ...]) -> str:
    """Per layer, the share kept drawn as one block character (' ' none kept, '█' all; '·' not found)."""
    return "".join("·" if v is None else BARS[round(v * (len(BARS) - 1))] for v in column)


def loss_rows(found: list[Loss]) -> list[list[str]]:
    """Rows [question, B, passage %, answer %, roomy %, cause, passage per layer, answer per layer]."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f}"

    return [
        [
            x.question,
            str(x.budget),
            pct(x.passage),
            pct(x.answer),
            pct(x.roomy),
            x.cause,
            bars(x.passage_layers),
            bars(x.answer_layers),
        ]  # fmt: skip
        for x in found
    ]


LOSS_HEAD = ["question", "B", "passage %", "answer %", "roomy %", "cause", "passage per layer", "answer per layer"]
