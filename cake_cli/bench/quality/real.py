"""`cake bench quality --suite real`: the real-document QA set, per method x budget x context length.

Each question is asked as `cake qa` asks it (the qa template: answer, cite the passage or say
"not in the document"), on its document middle-cut to the context length when it is longer.
One prefill per (question, length) is recorded (`engine.replay.record`) and every (method,
budget) replays its eviction on it and decodes greedily, as the other suites do. The reply is
read apart and its passage looked for in the document (`tasks.answers.cite.find_support`), then
scored (`scoring.real_scores`): F1 and exact against the gold answers when the passage was read,
abstention accuracy when the answer is not in the document or in the part the cut left out.
A `NAME@select` method answers on the prompt `cake qa --prefill select` reads (`quality.selected`).

With `--long sections` a document longer than the context is read as `cake qa --long sections`
reads it (`tasks.sections.split_sections`): each section is recorded and replayed on its own, and
the reply of the first section whose cited passage is found is the answer (every section
abstaining: an abstention). A question whose passage the middle cut would have left out is then
task "real-middle", scored against its gold answers, so the two modes can be compared.

Rows are `suites.CaseResult`s with task "real", "real-absent", "real-cut" or "real-middle", the
question id as case id and the document id as source; an interrupted run resumes by the same keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch

from cake_cli.bench.quality.run import Model, recording_accumulates, replay_cells, uses_taus
from cake_cli.bench.quality.selected import replay_selected
from cake_cli.bench.real_docs import OpenDocument, RealQuestion
from cake_cli.bench.scoring import real_scores
from cake_cli.bench.suites import REAL_TASKS, REAL_TEMPLATE, CaseResult, RealSuite, Variant, result_key
from cake_cli.bench.survival import cache_positions, fact_survival, fact_token_spans
from cake_cli.engine.families import attention_layout
from cake_cli.engine.replay import prefix_cache, record
from cake_cli.errors import CakeError
from cake_cli.tasks.answers.abstain import CHECKED, DOUBT, NEVER, counts_as_abstention, decide
from cake_cli.tasks.answers.check import check_answer, check_tokens, doubt_answer, doubt_tokens
from cake_cli.tasks.answers.cite import LOCATED, UNSUPPORTED, find_support
from cake_cli.tasks.inputs.documents import page_of_offset
from cake_cli.tasks.question_window import question_rows
from cake_cli.tasks.request import SECTIONS
from cake_cli.tasks.results import Support
from cake_cli.tasks.sections import SLACK, split_sections
from cake_cli.tasks.templates import build_prompt, load_template


@dataclass(frozen=True)
class RealCase:
    """One question on its document at one context length, with the prompt built."""

    document: OpenDocument
    question: RealQuestion
    length: int  # nominal (the suite's)
    task: str  # "real" (the passage is read), "real-absent", "real-cut" (cut: abstain) or "real-middle"
    input_ids: tuple[int, ...]  # the prompt (middle cut); () with sections
    dropped: tuple[int, int] | None  # document characters the middle cut left out
    sections: tuple[tuple[int, int], ...] = ()  # --long sections: the sections' character spans
    section_ids: tuple[tuple[int, ...], ...] = ()  # and their prompts
    prefix_tokens: int = 0  # the prompt's chat opening + document block (what --prefill select may drop)

    @property
    def answers(self) -> tuple[str, ...]:
        """The gold answers a right reply gives; () when it should abstain."""
        return self.question.answers if self.task in ("real", "real-middle") else ()

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.section_ids) if self.sections else len(self.input_ids)

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


def build_case(
    model: Model, doc: OpenDocument, question: RealQuestion, length: int, long: str = "middle", sized_for: str = ""
) -> RealCase:
    """The prompt of one question (middle-cut to `length` tokens, clamped to the model), or with
    `long` "sections" the prompts of its sections, and its task.

    `sized_for` (the document's longest question, `longest_question`) sizes the cut and the sections
    instead of this question, so every question of a document reads the same text and they share one
    prefill of it (`SharedPrefixes`); a shorter question then reads a few tokens fewer than `cake qa`
    would give it. "" sizes them for this question, as `cake qa` does.

    Raises:
        CakeError: the question alone does not fit the model.
    """
    template = load_template(REAL_TEMPLATE)
    limit = min(length, model.max_prompt_tokens)
    text, ask = doc.doc.text, dict(question=question.question)
    sizing = dict(question=sized_for or question.question)
    sized = build_prompt(model.tokenizer, template, text, max_prompt_tokens=limit, truncate="middle", **sizing)
    prompt = sized  # sized for this very question: the prompt itself
    if sizing != ask:
        prompt = build_prompt(
            model.tokenizer, template, sized.document_text, max_prompt_tokens=10**9, truncate="error", **ask
        )
    task, cut = "real-absent", sized.dropped
    if question.answerable:
        found = doc.found[question.id]
        in_cut = cut is not None and found.start < cut[1] and found.end > cut[0]
        task = ("real-middle" if long == SECTIONS else "real-cut") if in_cut else "real"
    if long != SECTIONS or cut is None:
        return RealCase(doc, question, length, task, prompt.input_ids, cut, prefix_tokens=prompt.prefix_tokens)
    overhead = len(build_prompt(model.tokenizer, template, "", max_prompt_tokens=10**9, **sizing).input_ids)
    spans = tuple(split_sections(model.tokenizer, text, max(limit - overhead - SLACK, 1)))
    ids = tuple(
        build_prompt(model.tokenizer, template, text[a:b], max_prompt_tokens=limit, truncate="middle", **ask).input_ids
        for a, b in spans
    )
    return RealCase(doc, question, length, task, (), None, spans, ids)


def longest_question(model: Model, doc: OpenDocument) -> str:
    """The question of `doc` with the most tokens (the one every prompt's cut is sized for)."""
    return max((q.question for q in doc.questions), key=lambda q: len(model.tokenizer(q)["input_ids"]), default="")


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
    """(prefills, replays) still to run: for the progress bar and its ETA (with sections, each section is
    one prefill and its replays: `prompts_per_question`, an estimate)."""
    todo = pending(documents, suite, variants, budgets, done)
    parts = [prompts_per_question(doc, length, suite.long) for doc, _, length, _ in todo]
    replays = sum(n * (len(cells) + selection_steps(cells)) for n, (*_, cells) in zip(parts, todo))
    return sum(parts), replays


SECTION_OVERHEAD = 160  # tokens of a section's prompt that are not the document (template, question, SLACK)


def prompts_per_question(doc: OpenDocument, length: int, long: str) -> int:
    """How many prompts a question of `doc` takes at context `length`: 1, or with `--long sections` its
    sections, estimated from the set's token count before the model (and its tokenizer) is loaded:
    ceil(tokens / (length - SECTION_OVERHEAD)), what `split_sections` cuts for the default model."""
    tokens = doc.spec.tokens
    if long != SECTIONS or tokens <= length - SECTION_OVERHEAD:
        return 1
    return -(-tokens // max(length - SECTION_OVERHEAD, 1))


def selection_steps(cells: list) -> int:
    """Progress steps of a prompt's `@select` cells besides their replays (`quality.selected`): one
    cut-off forward per selection layer named (the default once) and one prefill per (layer, budget)."""
    chosen = [(v.select_layer, b) for v, b in cells if v.select]
    return len({layer for layer, _ in chosen}) + len(set(chosen))


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
    diagnose: bool = False,
) -> list[CaseResult]:
    """Run every pending cell; one recorded prefill per (question, length), or per section with
    `suite.long` "sections". Arguments as `quality.run.run_grid`, with the opened documents
    (`real_docs.open_documents`) for the cases; `diagnose` also stores, per row of a question whose
    passage was read whole (not with sections), the survival of its gold passage and answer
    (`evidence_spans`) and the tokens each layer kept (`bench.real_diagnosis`). A question-window
    variant (cake-qwin) replays each prompt with `score_rows` = its tokens from the question on
    (`tasks.question_window.question_rows`). An `@select` variant answers on its selected prompt
    (`quality.selected.replay_selected`, after the shared prefix); its row's `record_seconds` is that
    prompt's prefill and its `seconds` include the selection.

    Raises:
        ValueError: no budget, or an `@select` variant with `--long sections`.
        CakeError: an `@select` layer past the model's (`check_selections`).
    """
    if not budgets:
        raise ValueError("run_real needs at least one budget")
    check_selections(model, suite, variants)
    configs = {b: config_for_budget(b) for b in budgets}
    window = configs[budgets[0]].window
    accumulate = recording_accumulates(variants)  # H2O replays every prompt query's attention
    device = model.model.get_input_embeddings().weight.device
    new_tokens = load_template(REAL_TEMPLATE).max_new_tokens
    rows: list[CaseResult] = []
    longest = {doc.spec.id: longest_question(model, doc) for doc in documents}
    todo = [(build_case(model, doc, q, length, suite.long, longest[doc.spec.id]), cells) for doc, q, length, cells
            in pending(documents, suite, variants, budgets, done)]  # fmt: skip
    order = {doc.spec.id: i for i, doc in enumerate(documents)}
    todo.sort(key=lambda item: (order[item[0].document.spec.id], item[0].length))  # a document's questions together
    shared = SharedPrefixes(model, todo, window) if can_share(model, accumulate) else None
    asks_rows = any(v.question_window for v in variants)  # cake-qwin: score_rows from each prompt's question
    check = None
    if suite.long != SECTIONS:  # a sectioned reply is checked by none (foreign's rule)
        if suite.abstain == CHECKED:
            check = partial(check_answer, model.model, tokens=check_tokens(model.tokenizer))
        elif suite.abstain == DOUBT:
            check = partial(doubt_answer, model.model, tokens=doubt_tokens(model.tokenizer))
    for case, cells in todo:
        question, length = case.question, case.length
        prompts = _prompts(case)
        replies: dict = {}  # (variant name, budget) -> [reply of each section]
        seconds: dict = {}
        seen: dict = {}  # (variant name, budget) -> (survival [L][2], kept [L]) with diagnose
        checks: dict = {}  # (variant name, budget) -> its check (`--abstain checked` or `doubt`, read whole)
        selected_prefill: dict = {}  # (variant name, budget) -> its selected prompt's prefill (@select)
        spans = evidence_spans(model, case) if diagnose and not case.sections else None
        inspect = partial(_inspect, spans=spans) if spans and spans[0] is not None else None
        recorded = 0.0
        for part, input_ids in enumerate(prompts, 1):
            ids = torch.tensor([list(input_ids)], device=device)  # [1, n]
            label = f"{question.id} @ {length}" + (f" section {part}/{len(prompts)}" if case.sections else "")
            if on_step:
                on_step(f"{label}: prefill {ids.shape[1]} tokens")
            prefix = shared.prefix(case, part - 1) if shared is not None else None
            plain = [cell for cell in cells if not cell[0].select]
            rec = None
            if plain:
                rec = record(model.model, ids, window, accumulate=accumulate, prefix=prefix)
                recorded += rec.seconds
            rows_q = question_rows(model.tokenizer, input_ids, question.question) if asks_rows else None
            for variant, budget, _, text, spent, inspected, checked in replay_cells(
                model, ids, rec, plain, configs, new_tokens, label, on_step, inspect, rows_q, check,
                check_before_decode=suite.abstain == DOUBT,
            ):  # fmt: skip
                replies.setdefault((variant.name, budget), []).append(text)
                seen[(variant.name, budget)] = inspected
                checks[(variant.name, budget)] = checked
                seconds[(variant.name, budget)] = seconds.get((variant.name, budget), 0.0) + spent
            chosen = [cell for cell in cells if cell[0].select]
            if chosen:
                for variant, budget, _, text, spent, prefilled in replay_selected(
                    model, ids, case.prefix_tokens, chosen, configs, new_tokens, label,
                    window=window, prefix=prefix, whole=rec, on_step=on_step,
                ):  # fmt: skip
                    replies[(variant.name, budget)] = [text]
                    checks[(variant.name, budget)] = None
                    seconds[(variant.name, budget)] = spent
                    selected_prefill[(variant.name, budget)] = prefilled
            del rec
        case_rows = []
        for variant, budget in cells:
            config = variant.config(configs[budget]) if budget is not None else None
            key = (variant.name, budget)
            prefilled = selected_prefill.get(key, recorded)
            row = _row(
                case, variant, budget, config, replies[key], seconds[key], prefilled, suite.abstain, checks[key],
                suite.doubt_threshold,
            )  # fmt: skip
            if seen.get(key) is not None:
                row = replace(row, survival=seen[key][0], kept=seen[key][1])
            case_rows.append(row)
        rows.extend(case_rows)
        if on_case:
            on_case(case_rows)
    return rows


def check_selections(model: Model, suite: RealSuite, variants: list[Variant]) -> None:
    """Refuse `@select` variants the run cannot answer.

    Raises:
        ValueError: an `@select` variant with `--long sections` (a selection is made on one prompt).
        CakeError: a selection layer past the model's layers.
    """
    if suite.long == SECTIONS and any(v.select for v in variants):
        raise ValueError("@select methods run on one prompt per question: not with --long sections")
    layers = model.model.config.num_hidden_layers
    for v in variants:
        if v.select_layer is not None and v.select_layer >= layers:
            raise CakeError(f"'{v.name}': layer {v.select_layer} is past this model's {layers} layers",
                            f"give a selection layer in 0..{layers - 1}")  # fmt: skip


def evidence_spans(model: Model, case: RealCase) -> list[tuple[int, int] | None]:
    """[passage span, answer span]: the prompt token spans [start, end) of a question's gold passage
    (its evidence quote, where found in the document) and of the first gold answer written verbatim
    (case-insensitive) inside it; None for a span not found (not verbatim, or outside the prompt:
    the middle cut). Both None for a question without a passage (unanswerable, or its passage cut).
    Spans as `survival.fact_token_spans` finds them."""
    found = case.document.found.get(case.question.id)
    if case.task != "real" or found is None:
        return [None, None]
    text = case.document.doc.text
    low = text[found.start : found.end].lower()
    at = next(((found.start + i, len(a)) for a in case.question.answers if (i := low.find(a.lower())) >= 0), None)
    offsets, facts = [found.start], [text[found.start : found.end]]
    if at is not None:
        offsets.append(at[0])
        facts.append(text[at[0] : at[0] + at[1]])
    spans = fact_token_spans(model.tokenizer, list(case.input_ids), text, offsets, facts)
    return spans + [None] * (2 - len(spans))


def _inspect(state, spans) -> tuple[list, list[int]]:
    """(survival [L][2] of the passage and answer, tokens kept per KV head [L]) of a replayed prefill."""
    positions = cache_positions(state.cache)
    kept = [0 if p is None else int(p.shape[-1]) for p in positions]
    return fact_survival(positions, spans), kept


def can_share(model: Model, accumulate: bool) -> bool:
    """Whether the questions of one document can share the prefill of its document block
    (`engine.replay.record(prefix=...)`): not for H2O (it scores every prompt query), not on models
    with local (sliding-window) layers."""
    windows = attention_layout(model.model.config).windows
    return not accumulate and all(w is None for w in windows)


class SharedPrefixes:
    """The full cache of each document's shared prompt prefix (the document block every question's
    prompt starts with, up to where the prompts first differ; with sections, one per section),
    prefilled once and kept while that document's questions run. A middle cut that depends on the
    question's length ends the shared part early; a document asked once shares nothing."""

    def __init__(self, model: Model, todo: list[tuple[RealCase, list]], window: int):
        self.model = model
        self.shared: dict[tuple, int] = {}  # (document id, length, section) -> shared tokens
        groups: dict[tuple, list[tuple[int, ...]]] = {}
        for case, _ in todo:
            for part, ids in enumerate(_prompts(case)):
                groups.setdefault((case.document.spec.id, case.length, part), []).append(ids)
        for key, prompts in groups.items():
            n = common_prefix(prompts) if len(prompts) > 1 else 0
            if n > 2 * window:
                self.shared[key] = n
        self.held: dict[tuple, object] = {}  # the current document's prefilled prefixes

    def prefix(self, case: RealCase, part: int = 0):
        """The prefilled shared prefix of `case`'s prompt (section `part`), a `CakeCache`, or None."""
        key = (case.document.spec.id, case.length, part)
        n = self.shared.get(key)
        if n is None:
            return None
        if key not in self.held:
            self.held = {k: v for k, v in self.held.items() if k[:2] == key[:2]}  # free the previous document's
            device = self.model.model.get_input_embeddings().weight.device
            ids = torch.tensor([list(_prompts(case)[part][:n])], device=device)
            self.held[key] = prefix_cache(self.model.model, ids)
        return self.held[key]


def _prompts(case: RealCase) -> tuple[tuple[int, ...], ...]:
    return case.section_ids if case.sections else (case.input_ids,)


def common_prefix(prompts: list[tuple[int, ...]]) -> int:
    """Length of the longest token prefix shared by every prompt (each keeps >= 1 token of its own)."""
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return max(n, 0)


def _support(case: RealCase, replies: list[str]) -> tuple[str, Support, list | None]:
    """The reply that answers and its support: the one reply (middle cut), or with sections the
    first section reply whose passage is found in its section (all abstaining: an abstention; else
    the first unsupported one), with every section's [reply, support status] (None without sections)."""
    doc = case.document
    text, page_of = doc.doc.text, partial(page_of_offset, doc.doc)
    ask = dict(query=case.question.question, page_of=page_of, length=len(text))
    if not case.sections:
        return replies[0], find_support(replies[0], text, unread=case.dropped, **ask)[1], None
    found = []
    for (start, end), reply in zip(case.sections, replies):
        found.append((reply, find_support(reply, text[start:end], offset=start, **ask)[1]))
    each = [[reply, support.status] for reply, support in found]
    for status in (LOCATED, UNSUPPORTED):
        hit = next(((r, s) for r, s in found if s.status == status), None)
        if hit:
            return *hit, each
    return *found[0], each


def _row(
    case: RealCase, variant: Variant, budget, config, replies, seconds: float, recorded: float, abstain: str = NEVER,
    check: float | None = None, threshold: float | None = None,
) -> CaseResult:  # fmt: skip
    """The scored row of one method's reply (a list: one reply per section with sections); an
    unsupported answer is withheld (scored as an abstention) as `abstain.decide` rules with `abstain`
    and `check` (the check pass's P(yes), `--abstain checked`, or the abstention probability,
    `--abstain doubt`, set against `threshold`: the model profile's, None for the mode's own), which the row
    keeps."""
    text, support, sections = _support(case, [replies] if isinstance(replies, str) else list(replies))
    support = decide(support, abstain, case.document.doc.text, case.question.question, check, threshold)
    abstained = counts_as_abstention(support)
    score, exact = real_scores(support.answer, abstained, case.answers)
    return CaseResult(
        task=case.task,
        case_id=case.question.id,
        split="real",
        length=case.length,
        method=variant.name,
        budget=budget,
        prompt_tokens=case.prompt_tokens,
        depth=case.depth,
        score=round(score, 6),
        exact=exact,
        prediction=text,
        tau1=config.tau1 if uses_taus(config) else None,
        tau2=config.tau2 if uses_taus(config) else None,
        seconds=round(seconds, 3),
        record_seconds=round(recorded, 3),
        source=case.document.spec.id,
        abstained=abstained,
        support=support.status,
        check=None if check is None else round(check, 6),
        sections=sections,
    )
