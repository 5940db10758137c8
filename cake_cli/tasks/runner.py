"""One task run, end to end: document -> prompt -> CAKE prefill + decode -> RunResult.

No typer or rich here: the CLI passes callbacks for streamed text and progress.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from cake_cli.engine.config import SamplingConfig
from cake_cli.errors import CakeError, UsageError
from cake_cli.tasks.results import RunResult, layer_results

if TYPE_CHECKING:
    from cake_cli.engine.config import CakeConfig
    from cake_cli.models.loader import LoadedModel
    from cake_cli.tasks.documents import Document
    from cake_cli.tasks.templates import Prompt, Template


@dataclass(frozen=True)
class TaskRequest:
    """What the user asked for. None means "the profile's / template's default"."""

    task: str
    document: str  # path or "-"
    fields: dict[str, str] = field(default_factory=dict)  # template fields, e.g. question
    model: str | None = None
    budget: int = 1024
    window: int | None = None
    decode_policy: str = "fixed"
    dtype: str = "auto"
    attention: str = "auto"  # auto | eager | sdpa | flash_attention_2
    device_map: str | None = None
    max_new_tokens: int | None = None
    sampling: SamplingConfig = SamplingConfig()
    no_repeat_ngram_size: int | None = None  # None: the template's default
    truncate: str = "middle"
    password: str | None = None
    method: str = "cake"  # an engine.methods.METHODS name; "full" evicts nothing
    allocation: str | None = None  # override the method's allocation (paper Sec. 5.5)
    indicator: str | None = None  # override the method's indicator
    at_line: int | None = None  # code completion: the context is the document up to this 1-based line
    max_lines: int | None = None  # code answers: most lines kept (None: code.DEFAULT_LINES)


@dataclass
class Callbacks:
    """Hooks for the front end: streamed answer text, status lines, prefill progress, warnings."""

    on_text: Callable[[str], None] | None = None
    on_status: Callable[[str], None] | None = None
    on_layer: Callable[[int, int], None] | None = None
    on_warning: Callable[[str], None] | None = None


def _warn(cb: Callbacks, warnings: list[str], message: str) -> None:
    """Record a warning (it ends up in the result) and show it now."""
    warnings.append(message)
    if cb.on_warning:
        cb.on_warning(message)


@dataclass
class Prepared:
    """Everything between the request and the engine: template, document, model, prompt."""

    template: Template
    doc: Document
    loaded: LoadedModel
    backend: str  # attention backend in use
    config: CakeConfig
    tau_rule: str  # how the taus were chosen (for the report)
    prompt: Prompt
    max_new_tokens: int  # generation allowance, tokens
    warnings: list[str]  # shown as they happened; the result carries them too


def _streamer(tokenizer, on_text):
    """A transformers TextStreamer that hands finished text pieces to `on_text`."""
    from transformers import TextStreamer

    class _Streamer(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            if text:
                on_text(text)

    return _Streamer(tokenizer, skip_prompt=False, skip_special_tokens=True)


def stop_token_ids(loaded) -> frozenset[int]:
    """EOS ids of the tokenizer and the generation config."""
    ids = set()
    for source in (loaded.tokenizer.eos_token_id, getattr(loaded.model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(x) for x in source)
    return frozenset(ids)


def cake_config_for(profile, request: TaskRequest):
    """CakeConfig from the request and the model's profile (None: tau = 1, w = 32, gamma = 200).

    Returns:
        (config, tau_rule) where tau_rule says how the taus were chosen (shown in the report).

    Raises:
        UsageError: budget, window or decode policy out of range.
    """
    from cake_cli.engine.config import CakeConfig

    if profile is None:
        tau1, tau2, rule, window, gamma, pool = 1.0, 1.0, "no profile: default 1.0", 32, 200.0, ("avg", 5)
    else:
        choice = profile.taus_for(request.budget) if request.budget > 0 else None
        tau1, tau2, rule = (choice.tau1, choice.tau2, choice.rule) if choice else (1.0, 1.0, "")
        window, gamma, pool = profile.window, profile.gamma, (profile.pooling.kind, profile.pooling.kernel)
    config = CakeConfig(
        budget=request.budget,
        window=request.window if request.window is not None else window,
        tau1=tau1,
        tau2=tau2,
        gamma=gamma,
        pool_kind=pool[0],
        pool_kernel=pool[1],
        decode_policy=request.decode_policy,
    )
    from cake_cli.engine.methods import METHODS

    if request.method not in METHODS:
        raise UsageError(f"unknown method '{request.method}'", f"choose one of {', '.join(METHODS)}")
    pair = METHODS[request.method] or (config.allocation, config.indicator)
    config = replace(config, allocation=request.allocation or pair[0], indicator=request.indicator or pair[1])
    return config, rule


def prepare(request: TaskRequest, cb: Callbacks) -> Prepared:
    """Validate the options, load the document and the model, and build the prompt.

    Usage errors come before any heavy work (the profile is read, the weights are not).

    Raises:
        CakeError: bad document, model or options (one line with a hint).
    """
    from cake_cli.engine.attention import default_backend, use_cake_attention
    from cake_cli.models.loader import load_model, profile_of
    from cake_cli.tasks.code import DEFAULT_LINES, context_before, max_new_tokens_for
    from cake_cli.tasks.documents import load_document
    from cake_cli.tasks.templates import build_prompt, check_inputs, load_template

    warnings: list[str] = []
    template = load_template(request.task)
    profile = profile_of(request.model)
    config, tau_rule = cake_config_for(profile, request)  # usage errors before any heavy work
    check_inputs(template, request.truncate, request.fields)
    if request.max_lines is not None and request.max_lines < 1:
        raise UsageError(f"--lines must be at least 1 (got {request.max_lines})", "e.g. --lines 5")
    if request.at_line is not None and request.at_line < 2:
        raise UsageError(
            f"--at must be at least 2 (got {request.at_line}): line 1 has nothing before it",
            "give the 1-based number of the first line to predict",
        )
    doc = load_document(request.document, password=request.password)
    for message in doc.warnings:
        _warn(cb, warnings, message)
    text = context_before(doc, request.at_line) if request.at_line is not None else doc.text
    loaded = load_model(request.model, dtype=request.dtype, device_map=request.device_map, progress=cb.on_status)
    backend = default_backend(loaded.device) if request.attention == "auto" else request.attention
    try:
        use_cake_attention(loaded.model, backend)
    except ValueError as exc:
        raise CakeError(str(exc), "use --attention sdpa or eager") from None
    if loaded.profile is None:
        _warn(
            cb,
            warnings,
            f"no profile for {loaded.name}: using tau1 = tau2 = 1.0, window 32, gamma 200 "
            "(the CAKE authors' fallback); add a profile with tuned taus for better allocation",
        )
    max_new = request.max_new_tokens
    if max_new is None:
        max_new = (
            template.max_new_tokens
            if template.output != "code"
            else max_new_tokens_for(request.max_lines or DEFAULT_LINES, template.max_new_tokens)
        )
    limit = (
        loaded.profile.max_prompt_tokens
        if loaded.profile
        else int(getattr(loaded.model.config, "max_position_embeddings", 4096)) - max_new
    )
    prompt = build_prompt(
        loaded.tokenizer, template, text, max_prompt_tokens=limit, truncate=request.truncate, **request.fields
    )
    for message in prompt.warnings:
        _warn(cb, warnings, message)
    if request.method == "full":  # the full cache: a budget that evicts nothing, growing while decoding
        config = replace(config, budget=max(config.budget, len(prompt.input_ids)), decode_policy="grow")
    elif len(prompt.input_ids) <= config.budget:
        _warn(
            cb,
            warnings,
            f"the budget ({config.budget}) is not smaller than the prompt ({len(prompt.input_ids)} "
            "tokens): nothing is evicted (0% saved), output equals the full cache",
        )
    return Prepared(template, doc, loaded, backend, config, tau_rule, prompt, max_new, warnings)


def run_task(request: TaskRequest, callbacks: Callbacks | None = None) -> RunResult:
    """Run one task with CAKE and return what it produced and measured.

    Code answers (template `output: code`) are cleaned to code only (`cake_cli.tasks.code`); needle
    answers (template `locate: true`) are located in the document (`cake_cli.tasks.locate`).

    Raises:
        CakeError: bad document, model or options (one line with a hint).
    """
    import torch

    from cake_cli.engine.generate import generate
    from cake_cli.tasks.code import DEFAULT_LINES, CodeFilter, filter_code

    cb = callbacks or Callbacks()
    prep = prepare(request, cb)
    loaded, config, template, warnings = prep.loaded, prep.config, prep.template, prep.warnings
    ngram = request.no_repeat_ngram_size if request.no_repeat_ngram_size is not None else template.no_repeat_ngram_size
    sampling = replace(request.sampling, no_repeat_ngram_size=ngram)
    lines = request.max_lines or DEFAULT_LINES
    on_text, code_stream = cb.on_text, CodeFilter(lines)
    if on_text and template.output == "code":

        def on_text(piece: str) -> None:  # stream whole lines of code only
            out = code_stream.feed(piece)
            if out:
                cb.on_text(out)

    streamer = _streamer(loaded.tokenizer, on_text) if on_text else None
    input_ids = torch.tensor([prep.prompt.input_ids], device=loaded.device)
    if cb.on_status:
        cb.on_status(
            f"prefill: {len(prep.prompt.input_ids)} tokens through {loaded.model.config.num_hidden_layers} layers"
        )
    from cake_cli.engine.cache import NonFiniteError

    try:
        result = generate(
            loaded.model,
            input_ids,
            config,
            max_new_tokens=prep.max_new_tokens,
            sampling=sampling,
            stop_ids=stop_token_ids(loaded),
            on_layer=cb.on_layer,
            on_token=(lambda t: streamer.put(torch.tensor([t]))) if streamer else None,
        )
    except NonFiniteError as exc:
        raise CakeError(
            f"{exc} with --dtype {prep.loaded.dtype}".replace("torch.", ""), "use --dtype bfloat16 or float32"
        ) from None
    if result.stop_reason == "max_positions":
        _warn(
            cb,
            warnings,
            f"generation stopped at the model's {loaded.model.config.max_position_embeddings}-position "
            "limit; use a shorter document or fewer --max-new-tokens",
        )
    if streamer:
        streamer.end()
    text = loaded.tokenizer.decode(list(result.token_ids), skip_special_tokens=True)
    answer, raw_answer, location = text.strip(), None, None
    if template.output == "code":
        if on_text:
            tail = code_stream.finish()
            if tail:
                cb.on_text(tail)
        answer, raw_answer = filter_code(text, lines), text
        if not answer:
            _warn(
                cb, warnings, "the model produced no code (only prose, fences or blank lines); see raw_answer in --json"
            )
    if template.locate:
        location = _locate(answer, prep.doc, cb, warnings)
    return RunResult(
        task=request.task,
        answer=answer,
        model=loaded.name,
        device=str(loaded.device),
        dtype=str(loaded.dtype).replace("torch.", ""),
        attention=prep.backend,
        prompt_tokens=result.prompt_tokens,
        document_tokens=prep.prompt.document_tokens,
        original_document_tokens=prep.prompt.original_document_tokens,
        budget=config.budget,
        window=config.window,
        tau1=config.tau1,
        tau2=config.tau2,
        tau_rule=prep.tau_rule,
        gamma=config.gamma,
        decode_policy=config.decode_policy,
        evicted=result.evicted,
        method=request.method,
        allocation=config.allocation,
        indicator=config.indicator,
        layers=layer_results(result.layers),
        kv_bytes_full=result.kv_bytes_full,
        kv_bytes_kept=result.kv_bytes_kept,
        kv_bytes_final=result.kv_bytes_final,
        kv_peak_prefill=result.kv_peak_prefill,
        load_seconds=loaded.load_seconds,
        prefill_seconds=result.prefill_seconds,
        decode_seconds=result.decode_seconds,
        decode_steps=result.decode_steps,
        generated_tokens=len(result.token_ids),
        eviction_seconds=result.eviction_seconds,
        stop_reason=result.stop_reason,
        warnings=tuple(warnings),
        location=location,
        raw_answer=raw_answer,
    )


def _locate(answer: str, doc, cb: Callbacks, warnings: list[str]):
    """The answer's location in the document, or None with a warning (below the threshold)."""
    from functools import partial

    from cake_cli.tasks.documents import page_of_offset
    from cake_cli.tasks.locate import THRESHOLD, locate

    location, score = locate(answer, doc.text, page_of=partial(page_of_offset, doc))
    if location is None:
        _warn(
            cb,
            warnings,
            f"the answer matches no passage of the document closely (best similarity {score:.0f} < "
            f"{THRESHOLD:.0f}): no location reported",
        )
    return location
