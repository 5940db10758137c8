"""One task run, end to end: a checked `Plan` -> model + prompt -> CAKE prefill + decode -> RunResult.

No typer or rich here: the CLI passes callbacks for streamed text and progress.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial

import torch
from transformers import TextStreamer

from cake_cli.engine.attention import default_backend, use_cake_attention
from cake_cli.engine.cache import NonFiniteError
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.families import UnsupportedModelError, attention_layout, supported_text
from cake_cli.engine.generate import GenerationResult, decode, prefill
from cake_cli.engine.selection import select_tokens
from cake_cli.errors import CakeError
from cake_cli.models.loader import LoadedModel, load_model
from cake_cli.tasks.answers.abstain import DOUBT, WITHHELD, decide
from cake_cli.tasks.answers.check import doubt_answer, doubt_tokens
from cake_cli.tasks.answers.cite import ABSTAIN, ABSTAINED, find_support
from cake_cli.tasks.answers.completion import DEFAULT_LINES, CodeFilter, filter_code
from cake_cli.tasks.inputs.documents import page_of_offset, pages_of_range
from cake_cli.tasks.request import SELECT_FACTOR, Callbacks, Plan, TaskRequest
from cake_cli.tasks.results import Dropped, Location, RunResult, Selected, Support, summary_fields
from cake_cli.tasks.templates import Prompt, build_prompt
from cake_cli.tasks.threads import Threads, choose, decode_following_load
from cake_cli.tasks.threads import using as threads_using


@dataclass
class Prepared:
    """A plan with its model loaded and its prompt built."""

    plan: Plan
    loaded: LoadedModel
    backend: str  # attention backend in use
    config: CakeConfig | None  # the plan's; None for --method full (the engine's plain full cache)
    prompt: Prompt
    warnings: list[str]  # the plan's and the ones raised since
    threads: Threads  # torch CPU threads for prefill and decoding
    selected: Selected | None = None  # set by `run_engine` under --prefill select


def prompt_limit(loaded: LoadedModel, reserve: int) -> int:
    """Most prompt tokens for `loaded`, leaving `reserve` positions to generate into: the profile's
    `max_prompt_tokens` when it has one, never past the model's positions minus `reserve`."""
    positions = int(attention_layout(loaded.model.config).limit or 4096) - reserve  # positions or every layer's window
    return min(loaded.profile.max_prompt_tokens, positions) if loaded.profile else positions


@dataclass(frozen=True)
class ReadyModel:
    """A loaded model switched to CAKE attention: load it once, run many plans on it (chat, batch)."""

    loaded: LoadedModel
    backend: str  # attention backend in use


def ready_model(request: TaskRequest, cb: Callbacks | None = None) -> ReadyModel:
    """Load the request's model (`--model`, `--dtype`, `--device-map`) and switch it to CAKE attention.

    Raises:
        CakeError: the model cannot be loaded, or its family is not handled by the engine.
    """
    cb = cb or Callbacks()
    return load_ready(
        request.model, request.dtype, request.attention, request.device_map, cb.on_status, request.weights or "bf16"
    )


def load_ready(
    model: str | None,
    dtype: str,
    attention: str,
    device_map: str | None = None,
    on_status=None,
    weights: str = "bf16",
) -> ReadyModel:
    """Load a model by name or path and switch it to CAKE attention (`attention`: auto | sdpa |
    eager | flash_attention_2); `on_status(message)` gets the loader's status lines; `weights`:
    the linear layers' format (`models.weights`).

    Raises:
        CakeError: the model cannot be loaded, or its family is not handled by the engine.
    """
    loaded = load_model(model, dtype=dtype, device_map=device_map, progress=on_status, weights=weights)
    backend = default_backend(loaded.device) if attention == "auto" else attention
    try:
        backend = use_cake_attention(loaded.model, backend)  # Gemma 2: eager (soft-capping has no SDPA)
    except UnsupportedModelError as exc:
        raise CakeError(str(exc), f"use a model of {supported_text()}, e.g. --model smollm2") from None
    except ValueError as exc:
        raise CakeError(str(exc), "use --attention sdpa or eager") from None
    return ReadyModel(loaded, backend)


def prepare(plan: Plan, cb: Callbacks, model: ReadyModel | None = None) -> Prepared:
    """Load the model (unless `model` is given, already loaded for the same request) and build the
    prompt (middle-truncated to the model's limit unless --truncate error).

    Raises:
        CakeError: see `ready_model` and `templates.build_prompt`.
    """
    warnings = list(plan.warnings)
    model = model or ready_model(plan.request, cb)
    loaded, backend = model.loaded, model.backend
    if loaded.profile is None and plan.evicts:
        cb.warn(
            warnings,
            f"no profile for {loaded.name}: using tau1 = tau2 = 1.0, window 32, gamma 200 "
            "(the CAKE authors' fallback); add a profile with tuned taus for better allocation",
        )
    request = plan.request
    limit = prompt_limit(loaded, plan.max_new_tokens)
    pages = partial(pages_of_range, plan.doc) if plan.text == plan.doc.text else None  # offsets of doc.text
    prompt = build_prompt(
        loaded.tokenizer,
        plan.template,
        plan.text,
        max_prompt_tokens=limit,
        truncate=request.truncate,
        pages=pages,
        **request.fields,
    )
    for message in prompt.warnings:
        cb.warn(warnings, message)
    config, n = (plan.config if plan.evicts else None), len(prompt.input_ids)
    if config is not None and n <= config.budget:
        cb.warn(
            warnings,
            f"the budget ({config.budget}) is not smaller than the prompt ({n} tokens): nothing is evicted "
            "(0% saved), output equals the full cache",
        )
    return Prepared(plan, loaded, backend, config, prompt, warnings, choose(request.threads))


def stop_token_ids(loaded: LoadedModel) -> frozenset[int]:
    """EOS ids of the tokenizer and the generation config."""
    ids = set()
    for source in (loaded.tokenizer.eos_token_id, getattr(loaded.model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(x) for x in source)
    return frozenset(ids)


class _Streamer(TextStreamer):
    """A transformers TextStreamer that hands finished text pieces to a callback."""

    def __init__(self, tokenizer, on_text):
        super().__init__(tokenizer, skip_prompt=False, skip_special_tokens=True)
        self.on_text = on_text

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if text:
            self.on_text(text)


def run_summary(prep: Prepared, result) -> dict:
    """The PrefillSummary fields (`tasks.results`) of a run, from its prepared state and its engine
    result (a `GenerationResult` or a `Prefilled`-derived object with the same names)."""
    loaded, config, prompt = prep.loaded, prep.config, prep.prompt
    settings = dict(budget=None, window=None, tau1=None, tau2=None, tau_rule="", gamma=None)  # --method full
    if config is not None:
        settings = {**{k: getattr(config, k) for k in ("budget", "window", "tau1", "tau2", "gamma")}}
        settings["tau_rule"] = prep.plan.tau_rule
    tokens = (len(prompt.input_ids), prompt.document_tokens, prompt.original_document_tokens)
    dtype = str(loaded.dtype).replace("torch.", "")
    return summary_fields(loaded, prep.backend, dtype, tokens, settings, result, prep.threads)


def run_task(plan: Plan, callbacks: Callbacks | None = None, model: ReadyModel | None = None) -> RunResult:
    """Run one checked task with CAKE and return what it produced and measured.

    Code answers (template `output: code`) are cleaned to code only (`tasks.answers.completion`); needle
    answers (template `locate: true`) are located in the document (`tasks.answers.locate`). `model`: a
    `ready_model` of the same request, to run many plans on one loaded model.

    Raises:
        CakeError: the model, the prompt, or non-finite values in a low-precision dtype.
    """
    cb = callbacks or Callbacks()
    return finish(prepare(plan, cb, model), cb)


def finish(prep: Prepared, cb: Callbacks, run: Callable[..., GenerationResult] | None = None) -> RunResult:
    """Generate for a prepared prompt (streaming, code cleaning, needle location) -> RunResult.

    `run(input_ids, **decode_keywords)` replaces prefill + decode (`tasks.saved.compress` continues a
    compressed prefix instead); default `run_engine`.
    """
    plan = prep.plan
    request, template = plan.request, plan.template
    lines = request.max_lines or DEFAULT_LINES
    # a code prompt ends inside its last line (the `complete` template): the first line printed is the next one
    code = CodeFilter(lines, continues_line=True) if template.output == "code" else None
    on_text = cb.on_text
    if code is not None:  # code answers pass through the filter, which also ends them after --lines lines

        def on_text(piece: str) -> None:  # stream whole lines of code only
            out = code.feed(piece)
            if out and cb.on_text:
                cb.on_text(out)

    streamer = _Streamer(prep.loaded.tokenizer, on_text) if on_text else None
    doubt, read_doubt = doubt_reader(prep)
    done = (lambda _tokens: code.done) if code is not None else None
    result = _generate(prep, cb, streamer, done, run, read_doubt)
    text = prep.loaded.tokenizer.decode(list(result.token_ids), skip_special_tokens=True)
    answer, raw_answer, location = text.strip(), None, None
    if code is not None:
        tail = code.finish()
        if tail and cb.on_text:
            cb.on_text(tail)
        answer, raw_answer = filter_code(text, lines, continues_line=True), text
        if not answer:
            cb.warn(
                prep.warnings,
                "the model produced no code (only prose, fences or blank lines); see raw_answer in --json",
            )
    support, dropped, reply = None, dropped_part(prep), None
    if template.locate:
        scope = dict(text=plan.text, offset=plan.section[0]) if plan.section is not None else {}
        location, support = check_support(answer, plan, cb, prep.warnings, dropped, **scope)
        reply, answer = answer, (ABSTAIN if support.status == ABSTAINED else support.answer or answer)
        asked = request.fields.get("question", request.fields.get("query", ""))
        if request.task == "qa":  # a needle's reply is its quote: flagged, never withheld
            profile = prep.loaded.profile  # --abstain doubt: the model's own threshold where its profile has one
            threshold = profile.doubt_threshold if profile is not None else None
            support = decide(support, request.abstain, plan.text, asked, doubt.get("p"), threshold)
            support = replace(support, abstain_probability=doubt.get("p"))
        if support.withheld:
            reply, answer, raw_answer = withheld_reply(reply, cb, text), WITHHELD, answer
    return RunResult(
        **run_summary(prep, result),
        task=request.task,
        answer=answer,
        decode_policy=plan.config.decode_policy,
        method=request.method,
        allocation=prep.config.allocation if prep.config else None,
        indicator=prep.config.indicator if prep.config else None,
        kv_bytes_final=result.kv_bytes_final,
        decode_seconds=result.decode_seconds,
        decode_steps=result.decode_steps,
        sampling_seconds=result.sampling_seconds,
        generated_tokens=len(result.token_ids),
        stop_reason=result.stop_reason,
        warnings=tuple(prep.warnings),
        location=location,
        raw_answer=raw_answer,
        support=support,
        dropped=dropped,
        reply=reply,
        selected=prep.selected,
    )


def select_prompt(prep: Prepared, input_ids: torch.Tensor, cb: Callbacks) -> torch.Tensor:
    """--prefill select: the prompt tokens the full model reads (`engine.selection.select_tokens`),
    [1, m] of `input_ids` [1, n]; the document tokens are those before `prompt.prefix_tokens`, the rest
    (instruction, question, chat closing) is always kept. Records `prep.selected`.

    Raises:
        CakeError: a model family or prompt the selection cannot run on, or a layer out of range.
    """
    request, loaded = prep.plan.request, prep.loaded
    n, protect_from = input_ids.shape[1], prep.prompt.prefix_tokens
    if protect_from >= n:
        raise CakeError(
            "--prefill select cannot tell the question from the document in this model's prompt (its chat "
            "template does not keep the message text)",
            "leave --prefill out",
        )
    budget = prep.config.budget if prep.config is not None else prep.plan.config.budget
    tokens = request.select_tokens if request.select_tokens is not None else SELECT_FACTOR * budget
    layers = loaded.model.config.num_hidden_layers
    if request.select_layer is not None and not 0 <= request.select_layer < layers:
        raise CakeError(
            f"--select-layer {request.select_layer} is past this model's {layers} layers", f"give 0..{layers - 1}"
        )
    try:
        selection = select_tokens(
            loaded.model, input_ids, protect_from=protect_from, tokens=tokens, layer=request.select_layer
        )
    except UnsupportedModelError as exc:
        raise CakeError(str(exc), "leave --prefill out, or use a model such as qwen2.5-coder-0.5b") from None
    m = len(selection.kept)
    prep.selected = Selected(selection.layer, m, n, selection.seconds)
    cb.status(f"prefill select: layer {selection.layer}'s attention kept {m} of {n} prompt tokens")
    return selection.ids(input_ids)


def run_engine(
    prep: Prepared, cb: Callbacks, max_new_tokens: int, before_decode=None, **decode_options
) -> GenerationResult:
    """Prefill the prepared prompt (on `prep.threads.prefill` threads), then decode (starting on
    `prep.threads.decode`, then following the load: `tasks.threads.decode_following_load`); non-finite
    keys/values in a low-precision dtype become a CakeError.

    Args:
        max_new_tokens: tokens to generate (0: prefill only).
        before_decode: optional function of the prefilled state, called before decoding (`doubt_reader`).
        decode_options: `engine.generate.decode` keywords (sampling, stop_ids, on_token, …).
    """
    loaded = prep.loaded
    input_ids = torch.tensor([prep.prompt.input_ids], device=loaded.device)  # [1, n]
    if prep.plan.request.prefill == "select":  # the kept tokens are the prompt, re-indexed (`engine.selection`)
        with finite(loaded), threads_using(prep.threads.prefill):
            input_ids = select_prompt(prep, input_ids, cb)  # [1, m]
    what = "" if max_new_tokens else " (no generation)"
    cb.status(f"prefill: {input_ids.shape[1]} tokens through {loaded.model.config.num_hidden_layers} layers{what}")
    with finite(loaded):
        with threads_using(prep.threads.prefill):
            state = prefill(loaded.model, input_ids, prep.config, on_layer=cb.on_layer)
            if before_decode is not None:
                before_decode(state)
        if prep.selected is not None:  # the time to the first token includes the selection's forward
            state.seconds += prep.selected.seconds
        options = dict(max_new_tokens=max_new_tokens, **decode_options)
        return decode_following_load(prep.threads, decode, loaded.model, input_ids, state, prep.config, **options)


@contextmanager
def finite(loaded: LoadedModel) -> Iterator[None]:
    """Turn the engine's refusal of non-finite keys/values (fp16 overflow) into a one-line CakeError."""
    try:
        yield
    except NonFiniteError as exc:
        raise CakeError(
            f"{exc} with --dtype {loaded.dtype}".replace("torch.", ""), "use --dtype bfloat16 or float32"
        ) from None


def doubt_reader(prep: Prepared) -> tuple[dict, Callable | None]:
    """({"p": ...} once read, the reader) for `--abstain doubt` on a qa plan, else ({}, None).

    The reader takes the prompt's prefilled state (its kept cache, before decoding) and stores the
    model's probability of opening its reply with an abstention (`tasks.answers.check.doubt_answer`:
    one forward of "Answer:" over a copy of the cache), which `abstain.decide` sets against
    DOUBT_THRESHOLD. A sectioned qa reply is decided by foreign's rule (`tasks.sections`)."""
    request = prep.plan.request
    if not (prep.plan.template.locate and request.task == "qa" and request.abstain == DOUBT) or prep.plan.section:
        return {}, None
    readings: dict = {}
    tokens = doubt_tokens(prep.loaded.tokenizer)

    def read(state) -> None:
        readings["p"] = doubt_answer(prep.loaded.model, state, [], tokens)

    return readings, read


def _generate(
    prep: Prepared, cb: Callbacks, streamer: _Streamer | None, done=None, run=None, before_decode=None
) -> GenerationResult:
    """Prefill + decode the prepared prompt with the template's decoding settings (or `run` it: it
    picks its own threads), streaming tokens; `done(tokens)` -> True ends the answer early (stop reason
    "complete", e.g. --lines reached); `before_decode(state)`, if given, is called with the prefilled
    state before the first token is decoded (`doubt_reader`)."""
    plan, loaded = prep.plan, prep.loaded
    ngram = plan.request.no_repeat_ngram_size
    sampling = replace(
        plan.request.sampling, no_repeat_ngram_size=plan.template.no_repeat_ngram_size if ngram is None else ngram
    )
    options = dict(
        max_new_tokens=plan.max_new_tokens,
        sampling=sampling,
        stop_ids=stop_token_ids(loaded),
        on_token=(lambda t: streamer.put(torch.tensor([t]))) if streamer else None,
        stop_on_repetition=plan.template.output == "text",  # code may repeat a line; prose may not loop
        stop_when=done,
    )
    if run is None:
        result = run_engine(prep, cb, before_decode=before_decode, **options)
    else:
        input_ids = torch.tensor([prep.prompt.input_ids], device=loaded.device)  # [1, n]
        with finite(loaded):
            result = run(input_ids, before_decode=before_decode, **options)
    if streamer:
        streamer.end()
    if result.stop_reason == "max_positions":
        cb.warn(
            prep.warnings,
            f"generation stopped at {attention_layout(loaded.model.config).limit_text()}; use a "
            "shorter document or fewer --max-new-tokens",
        )
    return result


def dropped_part(prep: Prepared) -> Dropped | None:
    """What the middle cut left out of the prepared prompt (None: the whole document is in it), in
    document offsets (a section's cut is shifted by where the section starts)."""
    cut = prep.prompt.dropped
    if cut is None:
        return None
    plan, doc = prep.plan, prep.plan.doc
    base = plan.section[0] if plan.section is not None else 0
    start, end = cut[0] + base, cut[1] + base
    whole = plan.section is not None or plan.text == doc.text  # offsets of doc.text: pages known
    tokens = prep.prompt.original_document_tokens - prep.prompt.document_tokens
    length = len(doc.text) if whole else len(plan.text)
    return Dropped(start, end, length, tokens, pages_of_range(doc, start, end) if whole else None)


def withheld_reply(reply: str, cb: Callbacks, streamed: str) -> str:
    """The reply as the user gets it when its answer is withheld (`--abstain`): the model's reply
    (already streamed as `streamed`), then a line of its own saying that the document does not
    support it. The line is streamed too, after a newline only where the stream lacks one, so that
    what was streamed, stripped, is the returned reply."""
    verdict = f"[{WITHHELD}: no passage of the document holds this answer; it is withheld]"
    if cb.on_text:
        cb.on_text(("" if streamed.endswith("\n") else "\n") + verdict)
    return f"{reply}\n{verdict}"


def check_support(
    answer: str, plan: Plan, cb: Callbacks, warnings: list[str], dropped: Dropped | None = None, text=None, offset=0
) -> tuple[Location | None, Support]:
    """Read a cited answer and find its passage in the document (`tasks.answers.cite.find_support`):
    "located", "unsupported" (with a warning saying why) or "abstained" (with a warning when the
    middle cut left part of the document unread).

    Args:
        answer: the generated reply.
        text: the text to look in (default the whole document); `offset`: where it starts in the
            document text (a section of `--long sections`), so the location's offsets are the document's.
    """
    fields = plan.request.fields
    location, support, notes = find_support(
        answer,
        plan.doc.text if text is None else text,
        query=fields.get("query", fields.get("question", "")),
        page_of=partial(page_of_offset, plan.doc),
        offset=offset,
        length=len(plan.doc.text),
        unread=(dropped.start, dropped.end) if dropped is not None else None,
    )
    for note in notes:
        cb.warn(warnings, note)
    if support.status == ABSTAINED and dropped is not None:
        reason = (
            f"the answer is not in the part read: the middle cut left out {dropped.describe()}, "
            "which may hold it (use --long sections to read it)"
        )
        cb.warn(warnings, f"the model says the document does not hold the answer, but {reason}")
        support = replace(support, reason=reason)
    return location, support
