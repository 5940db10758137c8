"""`cake bench quality --suite real`: the real-document QA set, per method x budget x context length.

Each question is asked as `cake qa` asks it (the qa template: answer, cite the passage or say
"not in the document"), on its document middle-cut to the context length when it is longer.
One prefill per (question, length) is recorded (`engine.replay.record`) and every (method,
budget) replays its eviction on it and decodes greedily, as the other suites do. The reply is
read apart and its passage looked for in the document (`tasks.answers.cite.find_support`), then
scored (`scoring.real_scores`): F1 and exact against the gold answers when the passage was read,
abstention accuracy when the answer is not in the document or in the part the cut left out.

Rows are `suites.CaseResult`s with task "real", "real-absent" or "real-cut", the question id as
case id and the document id as source; an interrupted run resumes by the same keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from cake_cli.bench.quality.run import Model, kept_key, uses_taus
from cake_cli.bench.real_docs import OpenDocument, RealQuestion
from cake_cli.bench.scoring import real_scores
from cake_cli.bench.suites import REAL_TASKS, REAL_TEMPLATE, CaseResult, RealSuite, Variant, result_key
from cake_cli.engine.generate import decode
from cake_cli.engine.replay import record, replay
from cake_cli.tasks.answers.cite import ABSTAINED, find_support
from cake_cli.tasks.inputs.documents import page_of_offset
from cake_cli.tasks.templates import build_prompt, load_template


@dataclass(frozen=True)
class RealCase:
    """One question on its document at one context length, with the prompt built."""

    document: OpenDocument
    question: RealQuestion
    length: int  # nominal (the suite's)
    task: str  # "real" (the passage is in the prompt), "real-absent" or "real-cut"
    input_ids: tuple[int, ...]
    dropped: tuple[int, int] | None  # document characters the middle cut left out

    @property
    def answers(self) -> tuple[str, ...]:
        """The gold answers a right reply gives; () when it should abstain."""
        return self.question.answers if self.task == "real" else ()

    @property
    def depth(self) -> float:
        """Where the passage starts, fraction of the document (0 for an unanswerable question)."""
        found = self.document.found.get(self.question.id)
        return round(found.start / max(len(self.document.doc.text), 1), 4) if found else 0.0


def selected(doc: OpenDocument, quick: bool) -> list[RealQuestion]:
    """The questions of a document the suite asks: all, or (quick) its first answerable and first
    unanswerable one."""
    questions = list(doc.questions)
    if not quick:
        return questions
    first = [next((q for q in questions if q.answerable == want), None) for want in (True, False)]
    return [q for q in first if q is not None]


def build_case(model: Model, doc: OpenDocument, question: RealQuestion, length: int) -> RealCase:
    """The prompt of one question (middle-cut to `length` tokens, clamped to the model) and its task.

    Raises:
        CakeError: the question alone does not fit the model.
    """
    template = load_template(REAL_TEMPLATE)
    limit = min(length, model.max_prompt_tokens)
    prompt = build_prompt(
        model.tokenizer, template, doc.doc.text, max_prompt_tokens=limit, truncate="middle", question=question.question
    )
    task = "real-absent"
    if question.answerable:
        found, cut = doc.found[question.id], prompt.dropped
        task = "real-cut" if cut is not None and found.start < cut[1] and found.end > cut[0] else "real"
    return RealCase(doc, question, length, task, prompt.input_ids, prompt.dropped)


def _done(done: set, question: RealQuestion, length: int, method: str, budget: int | None) -> bool:
    return any(result_key(task, question.id, length, method, budget) in done for task in REAL_TASKS)


def pending(
    documents: list[OpenDocument], suite: RealSuite, variants: list[Variant], budgets: list[int], done: set
) -> list[tuple]:
    """[(document, question, length, [(variant, budget), ...])] still to run, in set order."""
    out = []
    for doc in documents:
        for question in selected(doc, suite.quick):
            for length in suite.lengths:
                cells = [
                    (v, b)
                    for v in variants
                    for b in ([None] if v.allocation is None else budgets)
                    if not _done(done, question, length, v.name, b)
                ]
                if cells:
                    out.append((doc, question, length, cells))
    return out


def count_steps(documents, suite: RealSuite, variants, budgets, done) -> tuple[int, int]:
    """(prefills, replays) still to run: for the progress bar and its ETA."""
    todo = pending(documents, suite, variants, budgets, done)
    return len(todo), sum(len(cells) for *_, cells in todo)


def run_real(
    model: Model,
    documents: list[OpenDocument],
    suite: RealSuite,
    variants: list[Variant],
    budgets: list[int],
    config_for_budget: Callable[[int], object],
    *,
    done: set = frozenset(),
    on_case: Callable[[list[CaseResult]], None] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> list[CaseResult]:
    """Run every pending cell; one recorded prefill per (question, length). Arguments as
    `quality.run.run_grid`, with the opened documents (`real_docs.open_documents`) for the cases."""
    if not budgets:
        raise ValueError("run_real needs at least one budget")
    configs = {b: config_for_budget(b) for b in budgets}
    window = configs[budgets[0]].window
    device = model.model.get_input_embeddings().weight.device
    new_tokens = load_template(REAL_TEMPLATE).max_new_tokens
    rows: list[CaseResult] = []
    for doc, question, length, cells in pending(documents, suite, variants, budgets, done):
        case = build_case(model, doc, question, length)
        ids = torch.tensor([list(case.input_ids)], device=device)  # [1, n]
        label = f"{question.id} @ {length}"
        if on_step:
            on_step(f"{label}: prefill {ids.shape[1]} tokens")
        rec = record(model.model, ids, window)
        case_rows, answers = [], {}
        for variant, budget in cells:
            if on_step:
                on_step(f"{label}: {variant.name} B={budget or '-'}")
            config = variant.config(configs[budget]) if budget is not None else None
            start = time.perf_counter()
            state = replay(rec, config)
            same = kept_key(state, config)
            if same not in answers:  # identical kept tokens and decode settings -> identical answer
                out = decode(model.model, ids, state, config, max_new_tokens=new_tokens, stop_ids=model.stop_ids)
                answers[same] = model.tokenizer.decode(list(out.token_ids), skip_special_tokens=True).strip()
            case_rows.append(_row(case, variant, budget, config, answers[same], time.perf_counter() - start, rec))
        del rec
        rows.extend(case_rows)
        if on_case:
            on_case(case_rows)
    return rows


def _row(case: RealCase, variant: Variant, budget, config, text: str, seconds: float, rec) -> CaseResult:
    """The scored row of one reply."""
    doc = case.document
    _, support, _ = find_support(
        text,
        doc.doc.text,
        query=case.question.question,
        page_of=partial(page_of_offset, doc.doc),
        unread=case.dropped,
    )
    abstained = support.status == ABSTAINED
    score, exact = real_scores(support.answer, abstained, case.answers)
    return CaseResult(
        task=case.task,
        case_id=case.question.id,
        split="real",
        length=case.length,
        method=variant.name,
        budget=budget,
        prompt_tokens=len(case.input_ids),
        depth=case.depth,
        score=round(score, 6),
        exact=exact,
        prediction=text,
        tau1=config.tau1 if uses_taus(config) else None,
        tau2=config.tau2 if uses_taus(config) else None,
        seconds=round(seconds, 3),
        record_seconds=round(rec.seconds, 3),
        source=doc.spec.id,
        abstained=abstained,
        support=support.status,
    )
