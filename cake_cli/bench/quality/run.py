"""`cake bench quality`: answer quality of every method x budget x context length (NeedleBench + QA).

One prefill per (case, length) is recorded (`engine.replay.record`); every (method, budget) then
replays its eviction on that recording and decodes the short answer greedily (`engine.replay`,
tested equal to a live prefill). Results are rows keyed by (task, case id, length, method,
budget), saved after every case so an interrupted run resumes where it stopped.

The suites, variants and result rows are in `bench.suites`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch

from cake_cli.bench.datasets import haystack_text, make_qa_case, qa_item
from cake_cli.bench.facts import FACTS_PER_DOCUMENT, genre_facts
from cake_cli.bench.genre_cases import QA_SPLIT, GenreSuite, genre_case_id, make_genre_case
from cake_cli.bench.genres import genre_split
from cake_cli.bench.needles import make_needle_case, needle_facts
from cake_cli.bench.scoring import exact_answer, score_answer
from cake_cli.bench.splits import Case
from cake_cli.bench.suites import TEMPLATES, CaseResult, Suite, Variant, result_key, spec_id
from cake_cli.bench.survival import cache_positions, fact_survival, fact_token_spans
from cake_cli.engine.allocation import ALLOCATIONS
from cake_cli.engine.generate import decode
from cake_cli.engine.indicators import accumulates
from cake_cli.engine.replay import record, replay
from cake_cli.tasks.templates import build_prompt, load_template

PROMPT_SLACK = 16  # tokens kept free for re-tokenisation where document and template meet


@dataclass
class Model:
    """What the runner needs from a loaded model: weights, tokenizer, prompt limit, EOS ids."""

    model: object
    tokenizer: object
    max_prompt_tokens: int
    stop_ids: frozenset[int]


def build_case(model: Model, task: str, split: str, index: int, depth: float, length: int, haystack_name: str) -> Case:
    """Build the document and question of one case, sized to `length` tokens (clamped to the model).

    Raises:
        ValueError / CakeError: from the needle or QA builders.
    """
    template = load_template(TEMPLATES[task])
    target = min(length, model.max_prompt_tokens)

    def overhead(question: str) -> int:
        return len(build_prompt(model.tokenizer, template, "", max_prompt_tokens=10**9, question=question).input_ids)

    if task == "qa":
        doc_tokens = target - overhead(qa_item(split, index, length).question) - PROMPT_SLACK
        return make_qa_case(split, index, depth, length, doc_tokens, tokenizer=model.tokenizer)
    facts = needle_facts(task, split, index)
    doc_tokens = target - overhead(facts.question) - PROMPT_SLACK
    return make_needle_case(
        task,
        split,
        index,
        depth,
        length,
        doc_tokens,
        tokenizer=model.tokenizer,
        haystack=haystack_text(haystack_name),
        haystack_name=haystack_name,
        facts=facts,
    )


def build_genre_case(
    model: Model, task: str, genre: str, index: int, depth: float, length: int, seed: int, *, one_haystack: bool = False
) -> Case:
    """One case of the multi-genre suite (`bench.genre_cases`), sized to `length` tokens (clamped).

    QA (wiki genre only) is `datasets.make_qa_case` on the eval items, renamed into the genre. The haystack
    is sized so that the prompt with the case's own question fits; `one_haystack` sizes an `m-each` case's
    haystack for the longest question of its document's three facts instead, so the three cases share one
    document, as questions asked of one compressed file do (the suite's own cases differ by a few tokens).

    Raises:
        ValueError / CakeError: from the case builders.
    """
    template = load_template(TEMPLATES[task])
    target = min(length, model.max_prompt_tokens)

    def overhead(question: str) -> int:
        return len(build_prompt(model.tokenizer, template, "", max_prompt_tokens=10**9, question=question).input_ids)

    if task == "qa":
        doc_tokens = target - overhead(qa_item(QA_SPLIT, index, length).question) - PROMPT_SLACK
        case = make_qa_case(QA_SPLIT, index, depth, length, doc_tokens, tokenizer=model.tokenizer)
        return replace(case, case_id=genre_case_id(genre, index, depth), split=genre_split(genre))
    facts = genre_facts(task, genre, index, seed)
    asked = [facts.question]
    if one_haystack and task == "m-each":
        first = index - index % FACTS_PER_DOCUMENT
        asked = [genre_facts(task, genre, first + k, seed).question for k in range(FACTS_PER_DOCUMENT)]
    doc_tokens = target - max(map(overhead, asked)) - PROMPT_SLACK
    return make_genre_case(
        task, genre, index, depth, length, doc_tokens, tokenizer=model.tokenizer, seed=seed, facts=facts
    )


def prompt_ids(model: Model, case: Case) -> list[int]:
    """The chat-rendered prompt of a case (never truncated: CakeError if it does not fit)."""
    template = load_template(TEMPLATES[case.task])
    return list(
        build_prompt(
            model.tokenizer,
            template,
            case.document,
            max_prompt_tokens=model.max_prompt_tokens,
            truncate="error",
            question=case.question,
        ).input_ids
    )


def pending_cells(suite: Suite | GenreSuite, variants: list[Variant], budgets: list[int], done: set) -> list[tuple]:
    """[(spec, [(variant, budget), ...])] still to run, in suite order; `spec` is one of
    `suite.specs()`: (task, index, depth, length) or, for the genre suite, (…, genre)."""
    out = []
    for spec in suite.specs():
        task, length, cid = spec[0], spec[3], spec_id(spec)
        cells = [
            (v, b)
            for v in variants
            for b in ([None] if v.allocation is None else budgets)
            if result_key(task, cid, length, v.name, b) not in done
        ]
        if cells:
            out.append((spec, cells))
    return out


def run_grid(
    model: Model,
    suite: Suite | GenreSuite,
    variants: list[Variant],
    budgets: list[int],
    config_for_budget: Callable[[int], object],
    *,
    haystack: str,
    done: set = frozenset(),
    on_case: Callable[[list[CaseResult]], None] | None = None,
    on_step: Callable[[str], None] | None = None,
    diagnose: bool = False,
) -> list[CaseResult]:
    """Run every pending cell of the grid; one recorded prefill per (case, length).

    Args:
        model: weights switched to a CAKE attention function, tokenizer, limits.
        suite: the cases; variants: the methods; budgets: B values, tokens per layer.
        config_for_budget: CakeConfig (profile taus, window, gamma, pooling) for a budget.
        haystack: haystack source name (`datasets.HAYSTACKS`).
        done: keys (`result_key`) already in the results file: skipped.
        on_case: called with the new rows of each case as soon as it finishes (save them).
        on_step: called with a label before the recording and before each replay (progress).
        diagnose: also store each row's per-layer fact survival (`bench.survival`, [L][F]).

    Returns:
        The new rows, in run order.
    """
    if not budgets:
        raise ValueError("run_grid needs at least one budget")
    configs = {b: config_for_budget(b) for b in budgets}
    window = configs[budgets[0]].window
    accumulate = recording_accumulates(variants)  # H2O replays every prompt query's attention
    device = model.model.get_input_embeddings().weight.device
    rows: list[CaseResult] = []
    for spec, cells in pending_cells(suite, variants, budgets, done):
        task, index, depth, length = spec[:4]
        genre = spec[4] if isinstance(suite, GenreSuite) else None
        if genre is None:
            case = build_case(model, task, suite.split, index, depth, length, haystack)
        else:
            case = build_genre_case(model, task, genre, index, depth, length, suite.seed)
        ids_list = prompt_ids(model, case)
        spans = _fact_spans(model, ids_list, case) if diagnose else None
        ids = torch.tensor([ids_list], device=device)
        if on_step:
            on_step(f"{task} {case.case_id} @ {length}: prefill {len(ids_list)} tokens")
        rec = record(model.model, ids, window, accumulate=accumulate)
        new_tokens = _max_new_tokens(task)
        case_rows = []
        label = f"{task} {case.case_id} @ {length}"
        inspect = partial(_survival, spans=spans) if diagnose else None
        for variant, budget, config, text, seconds, survival, _ in replay_cells(
            model, ids, rec, cells, configs, new_tokens, label, on_step, inspect
        ):
            case_rows.append(
                CaseResult(
                    task=task,
                    case_id=case.case_id,
                    split=case.split,
                    length=length,
                    method=variant.name,
                    budget=budget,
                    prompt_tokens=len(ids_list),
                    depth=depth,
                    score=round(score_answer(task, text, case.references, case.keywords), 6),
                    exact=exact_answer(task, text, case.references, case.keywords),
                    prediction=text,
                    tau1=config.tau1 if uses_taus(config) else None,
                    tau2=config.tau2 if uses_taus(config) else None,
                    seconds=round(seconds, 3),
                    record_seconds=round(rec.seconds, 3),
                    source=case.source,
                    genre=genre,
                    survival=survival,
                )
            )
        del rec
        rows.extend(case_rows)
        if on_case:
            on_case(case_rows)
    return rows


def replay_cells(
    model: Model,
    ids,
    rec,
    cells,
    configs: dict,
    new_tokens: int,
    label: str,
    on_step=None,
    inspect=None,
    question_rows: int | None = None,
    check=None,
    check_before_decode: bool = False,
) -> list:
    """Every (variant, budget) cell of one recorded prefill, replayed and answered.

    Args:
        ids: [1, n] the prompt; rec: its `engine.replay.Recording`.
        cells: (variant, budget) pairs (budget None: the full cache); configs: budget -> CakeConfig.
        new_tokens: most tokens an answer may have; label, on_step: progress (a label per replay).
        inspect: optional function of the replayed prefill state (`engine.generate.Prefilled`),
            called before the decode; its value ends each tuple (None without it).
        question_rows: the prompt's tokens from the question on (`tasks.question_window.question_rows`),
            the `score_rows` of a `question_window` variant (cake-qwin).
        check: optional function (replayed prefill state, answer token ids) -> the check pass's P(yes)
            (`tasks.answers.check.check_answer`), run on a second replay of the cell (decoding changed the
            first); its value ends each tuple (None without it).
        check_before_decode: the check reads no answer (`tasks.answers.check.doubt_answer`, given `[]`): it
            runs on the cell's own replay before decoding (it works on a copy), with no second replay.

    Returns:
        [(variant, budget, config, answer, seconds, inspected, checked)] in cell order. Cells that keep the same
        tokens with the same decode settings share one decode (their answers and checks are identical).

    Raises:
        ValueError: a `question_window` variant without `question_rows`.
    """
    answers: dict = {}
    out = []
    for variant, budget in cells:
        if on_step:
            on_step(f"{label}: {variant.name} B={budget or '-'}")
        if variant.question_window and question_rows is None:
            raise ValueError(f"{variant.name} scores with the question's rows: pass question_rows for this prompt")
        config = variant.config(configs[budget], question_rows) if budget is not None else None
        start = time.perf_counter()
        state = replay(rec, config)
        seen = inspect(state) if inspect else None
        same = kept_key(state, config)
        if same not in answers:
            early = check(state, []) if check and check_before_decode else None
            generated = decode(model.model, ids, state, config, max_new_tokens=new_tokens, stop_ids=model.stop_ids)
            text = model.tokenizer.decode(list(generated.token_ids), skip_special_tokens=True).strip()
            checked = early
            if check and not check_before_decode:
                checked = check(replay(rec, config), list(generated.token_ids))
            answers[same] = (text, checked)
        text, checked = answers[same]
        out.append((variant, budget, config, text, time.perf_counter() - start, seen, checked))
    return out


def _survival(state, spans) -> list:
    """[L][F] fact survival of a replayed prefill (`survival.fact_survival`)."""
    return fact_survival(cache_positions(state.cache), spans)


def _fact_spans(model: Model, ids_list: list[int], case: Case) -> list:
    """The prompt token spans of a case's facts (`survival.fact_token_spans`): each inserted fact
    runs from its offset to its first full stop (every fact is one sentence with no other stop);
    QA: the first 200 characters of each gold paragraph stand for it."""
    doc = case.document
    if case.task == "qa":
        facts = [doc[o : o + 200] for o in case.insert_offsets]
    else:
        facts = [doc[o : (doc.find(".", o, o + 300) + 1) or o + 300] for o in case.insert_offsets]
    return fact_token_spans(model.tokenizer, ids_list, doc, case.insert_offsets, facts)


def recording_accumulates(variants: list[Variant]) -> bool:
    """Whether a recording must keep H2O's accumulated attention: some variant's indicator reads it."""
    return any(accumulates(v.indicator) for v in variants)


def expected_taus(variants: list[Variant], configs: dict) -> dict:
    """(method, budget) -> the (tau1, tau2) a run with `configs` (budget -> CakeConfig) gives that
    variant's rows, or None where it reads no taus (see `uses_taus`)."""
    out: dict = {}
    for v in variants:
        for b in [None] if v.allocation is None else list(configs):
            config = None if b is None else v.config(configs[b])
            out[(v.name, b)] = (config.tau1, config.tau2) if uses_taus(config) else None
    return out


def uses_taus(config) -> bool:
    """Whether a run's budgets depend on the layer preferences, hence on the taus (Eq. 7)."""
    return config is not None and ALLOCATIONS[config.allocation].uses_stats


def kept_key(state, config) -> tuple:
    """What determines a greedy answer after prefill: the tokens each layer kept (positions of
    every KV head) and the settings the decode policy reads (indicator, pooling, gamma, chunk, window,
    and the budget, which sets the decode capacity when nothing was evicted), plus score_rows, so a
    question-window variant's cells never share another method's decode."""
    kept = tuple(hash(layer.positions.cpu().numpy().tobytes()) for layer in state.cache.layers)
    settings = (
        None
        if config is None
        else (
            config.indicator,
            config.gamma,
            config.pool_kind,
            config.pool_kernel,
            config.chunk,
            config.window,
            config.decode_policy,
            config.budget,
            config.score_rows,
        )
    )
    return settings, tuple(state.lengths), kept


def _max_new_tokens(task: str) -> int:
    return load_template(TEMPLATES[task]).max_new_tokens


def count_steps(suite: Suite, variants: list[Variant], budgets: list[int], done: set) -> tuple[int, int]:
    """(prefills, replays) still to run: for the progress bar and its ETA."""
    pending = pending_cells(suite, variants, budgets, done)
    return len(pending), sum(len(cells) for *_, cells in pending)
