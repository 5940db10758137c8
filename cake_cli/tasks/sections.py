"""`--long sections`: a document longer than the model's context, read in context-sized sections.

The middle cut (the default) keeps the head and tail of a too-long document and warns what it
left out. With ``--long sections`` nothing is left out: the document is split into consecutive
sections of about equal length that each fit the prompt with the task's template and question
(`split_sections`, at a paragraph or sentence boundary near each section's share), and each section is prefilled
(and compressed by CAKE to the budget) on its own:

- summarize: each section is summarized, then the section summaries, headed by their pages or
  characters, are summarized into one (the summarize template on them; this last answer streams);
- qa: the question is asked of each section, and the answers whose cited passage is found in that
  section are kept, with their pages (`tasks.answers.cite`); when none is, the answer is "not in
  the document" (every section abstained) or the first section's answer, flagged unsupported.

The result is one `RunResult`: the answer as above, `sections` with every section's span, answer
and support, and the figures of all the runs added up (times, tokens; memory: the largest).
A document that fits the context is one section: the task runs as usual.
"""

from __future__ import annotations

from dataclasses import replace

from cake_cli.tasks.answers.abstain import WITHHELD, decide
from cake_cli.tasks.answers.cite import ABSTAIN, ABSTAINED, LOCATED, UNSUPPORTED
from cake_cli.tasks.inputs.documents import Document, pages_of_range
from cake_cli.tasks.request import Callbacks, Plan
from cake_cli.tasks.results import RunResult, SectionAnswer, Support
from cake_cli.tasks.runner import ReadyModel, prompt_limit, ready_model, run_task
from cake_cli.tasks.templates import build_prompt

SLACK = 16  # tokens kept free in each section's prompt (re-tokenisation where the section is cut)
BOUNDARY_SHARE = 0.25  # a section may end this share of its length early, at a paragraph or sentence end
_BREAKS = ("\n\n", ". ", "\n", " ")  # preferred section ends, best first


def split_sections(tokenizer, text: str, room: int) -> list[tuple[int, int]]:
    """Consecutive (start, end) character spans of `text`, each at most `room` tokens, together the
    whole text, as few as fit (k = ceil(tokens / room)) and of about equal length: each section aims
    at an equal share of the tokens still left, and ends at the last paragraph break (else sentence end,
    line break, space) in the final quarter of that share (never so early that the rest would need
    another section), else exactly at the share. Equal sections, not a full one and a short remainder: the
    longest section, whose prefill's attention costs the most, is as short as the count allows (on the Debian
    FAQ it answered as many questions as the uneven split, benchmarks/real.md).

    Raises:
        ValueError: `room` below 1.
    """
    if room < 1:
        raise ValueError(f"a section needs room for at least one token (got {room})")
    try:
        spans = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    except (NotImplementedError, TypeError, KeyError, ValueError):  # a slow tokenizer has no offsets
        spans = None
    if not spans:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        per = len(text) / max(len(ids), 1)  # characters per token, on average
        spans = [(int(i * per), int((i + 1) * per)) for i in range(len(ids))]
    out, first, start = [], 0, 0
    while first < len(spans):
        left = len(spans) - first
        if left <= room:
            out.append((start, len(text)))
            break
        sections = -(-left // room)  # the fewest that hold what is left
        last = first + -(-left // sections)  # one past the section's last token: an equal share
        limit = spans[last - 1][1]
        earliest = spans[len(spans) - (sections - 1) * room][0]  # an earlier end leaves too much for the rest
        floor = max(start + int((limit - start) * (1 - BOUNDARY_SHARE)), earliest)
        cut = next((i + len(mark) for mark in _BREAKS if (i := text.rfind(mark, floor, limit)) > start), limit)
        out.append((start, cut))
        start = cut
        first = next((k for k in range(first, len(spans)) if spans[k][0] >= cut), len(spans))
    return [(a, b) for a, b in out if text[a:b].strip()]


def run_sections(plan: Plan, callbacks: Callbacks | None = None, model: ReadyModel | None = None) -> RunResult:
    """Run a summarize or qa plan over its document in sections (see the module docstring).

    Raises:
        CakeError: as `tasks.runner.run_task`.
    """
    cb = callbacks or Callbacks()
    ready = model or ready_model(plan.request, cb)
    tokenizer = ready.loaded.tokenizer
    limit = prompt_limit(ready.loaded, plan.max_new_tokens)
    fields = plan.request.fields
    overhead = len(build_prompt(tokenizer, plan.template, "", max_prompt_tokens=10**9, **fields).input_ids)
    room = limit - overhead - SLACK
    spans = split_sections(tokenizer, plan.text, max(room, 1)) if room > 0 else [(0, len(plan.text))]
    if len(spans) <= 1:
        cb.status("--long sections: the document fits the context, one section")
        return run_task(plan, cb, ready)
    quiet = Callbacks(on_status=cb.on_status, on_layer=cb.on_layer)  # a section's warnings go in its result
    runs: list[tuple[tuple[int, int], RunResult]] = []
    for index, (start, end) in enumerate(spans, 1):
        pages = pages_of_range(plan.doc, start, end)
        where = f"pages {pages}" if pages else f"characters {start}-{end}"
        cb.status(f"section {index}/{len(spans)}: {where}")
        section = replace(plan, text=plan.text[start:end], section=(start, end))
        runs.append(((start, end), run_task(section, quiet, ready)))
    answers = tuple(_section_answer(plan, i, span, r) for i, (span, r) in enumerate(runs, 1))
    if plan.template.locate:
        return _kept_answers(plan, cb, answers, [r for _, r in runs])
    return _combined_summary(plan, cb, ready, answers, [r for _, r in runs])


def _section_answer(plan: Plan, index: int, span: tuple[int, int], r: RunResult) -> SectionAnswer:
    kept = r.support is None or r.support.status == LOCATED
    pages = pages_of_range(plan.doc, *span)
    return SectionAnswer(
        index, span[0], span[1], pages, r.document_tokens, r.answer, r.support, r.location, kept,
        r.prefill_seconds, r.decode_seconds,
    )  # fmt: skip


def _kept_answers(plan: Plan, cb: Callbacks, answers, runs: list[RunResult]) -> RunResult:
    """qa: the answers whose passage was found, one line each with its page (or characters)."""
    warnings = list(plan.warnings)
    kept = [a for a in answers if a.kept]
    if kept:
        lines = [f"{a.support.answer or a.answer} ({_where(a)})" for a in kept]
        text, support, location, base = "\n".join(lines), kept[0].support, kept[0].location, runs[kept[0].index - 1]
    elif all(a.support is not None and a.support.status == ABSTAINED for a in answers):
        text, location, base = ABSTAIN, None, runs[0]
        reason = f"every one of the {len(answers)} sections says it does not hold the answer"
        support = Support(ABSTAINED, "", "", reason)
    else:
        first = next(a for a in answers if a.support is not None and a.support.status == UNSUPPORTED)
        reason = "no section's answer cites a passage found in that section"
        text, location, base = first.support.answer or first.answer, None, runs[first.index - 1]
        support = Support(UNSUPPORTED, first.support.answer, first.support.passage, reason)
        asked = plan.request.fields.get("question", "")
        support = decide(support, plan.request.abstain, plan.text[first.start : first.end], asked)
        shown = f"the answer shown is section {first.index}'s, {_where(first)}"
        if support.withheld:
            text, shown = WITHHELD, f"section {first.index}'s answer, {_where(first)}, is withheld"
        cb.warn(warnings, f"unsupported answer: {reason} ({shown})")
    if cb.on_text:
        cb.on_text(text)
    return _totals(base, runs, answers, answer=text, support=support, location=location, warnings=warnings)


def _combined_summary(plan: Plan, cb: Callbacks, ready: ReadyModel, answers, runs: list[RunResult]) -> RunResult:
    """summarize: the section summaries, headed by where they are, summarized into one."""
    joined = "\n\n".join(f"Section {a.index} ({_where(a)}):\n{a.answer.strip()}" for a in answers)
    cb.status(f"combining the {len(answers)} section summaries")
    doc = Document(text=joined, source=f"{plan.doc.source} (section summaries)", kind="text")
    final = run_task(replace(plan, text=joined, doc=doc, section=None, warnings=()), cb, ready)
    warnings = [*plan.warnings, *final.warnings]
    return _totals(final, [*runs, final], answers, answer=final.answer, warnings=warnings)


def _where(a: SectionAnswer) -> str:
    """'page 12' / 'pages 3-5' of a located answer (else of its section), or its characters."""
    page = a.location.page if a.location is not None else None
    if page is not None:
        return f"page {page}"
    if a.location is not None:
        return f"characters {a.location.start}-{a.location.end}"
    return f"pages {a.pages}" if a.pages else f"characters {a.start}-{a.end}"


def _totals(base: RunResult, runs: list[RunResult], answers, **fields) -> RunResult:
    """`base` with the figures of all `runs` added up (tokens, times; memory: the largest), the
    sections and `fields` (answer, support, location, warnings)."""
    add = lambda name: sum(getattr(r, name) for r in runs)  # noqa: E731
    top = lambda name: max(getattr(r, name) for r in runs)  # noqa: E731
    document = sum(r.document_tokens for r in runs[: len(answers)])  # the sections' (not the combining run's)
    return replace(
        base,
        prompt_tokens=add("prompt_tokens"),
        document_tokens=document,
        original_document_tokens=document,
        prefill_seconds=add("prefill_seconds"),
        eviction_seconds=add("eviction_seconds"),
        decode_seconds=add("decode_seconds"),
        decode_steps=add("decode_steps"),
        sampling_seconds=add("sampling_seconds"),
        generated_tokens=add("generated_tokens"),
        kv_bytes_full=top("kv_bytes_full"),
        kv_bytes_kept=top("kv_bytes_kept"),
        kv_peak_prefill=top("kv_peak_prefill"),
        kv_bytes_final=top("kv_bytes_final"),
        evicted=any(r.evicted for r in runs),
        dropped=None,
        sections=tuple(answers),
        warnings=tuple(fields.pop("warnings")),
        **fields,
    )
