"""Checking a request before anything heavy runs: `TaskRequest` -> `plan()` -> `Plan`.

Everything here is cheap (no torch, no model weights): options, the task template and its fields,
the model's profile, the CAKE settings and the document itself (or the .cake file given in its
place) are checked, so a bad option or a missing file fails in well under a second.
"""

from __future__ import annotations

from dataclasses import replace

from cake_cli.cores import capped_threads
from cake_cli.engine.config import CakeConfig, ConfigError
from cake_cli.engine.indicators import DEFAULT_CHUNK
from cake_cli.engine.methods import FULL, label, resolve
from cake_cli.errors import UsageError, unknown_name
from cake_cli.models.dtypes import check_dtype
from cake_cli.models.profiles import Profile, check_model_spec
from cake_cli.models.weights import check_weights
from cake_cli.tasks.answers.abstain import TASK_ABSTAIN_MODES
from cake_cli.tasks.answers.completion import (
    DEFAULT_LINES,
    check_at_line,
    check_lines,
    context_before,
    max_new_tokens_for,
)
from cake_cli.tasks.inputs.documents import load_document
from cake_cli.tasks.request import (
    ATTENTIONS,
    COMPRESS,
    DEFAULT_BUDGET,
    DEFAULT_GAMMA,
    DEFAULT_METHOD,
    DEFAULT_POOL,
    DEFAULT_WINDOW,
    LONG_MODES,
    PREFIX_TEMPLATE,
    SECTIONS,
    Callbacks,
    Plan,
    TaskRequest,
)
from cake_cli.tasks.saved.fileformat import SavedCache, is_cache_path, read_saved
from cake_cli.tasks.saved.request import saved_config, saved_document, settle
from cake_cli.tasks.templates import check_inputs, load_template


def default_method(profile: Profile | None, request: TaskRequest) -> str:
    """The method a task runs: --method, else the profile's `method` (benchmarks/real.md says why a
    profile picks one), else DEFAULT_METHOD (no profile)."""
    return request.method or (profile.method if profile is not None else DEFAULT_METHOD)


def cake_config_for(profile: Profile | None, request: TaskRequest) -> tuple[CakeConfig, str]:
    """CakeConfig from the request and the model's profile (no profile: tau = 1, w = 32, gamma = 200).

    Returns:
        (config, tau_rule) where tau_rule says how the taus were chosen (shown in the report).

    Raises:
        ConfigError: budget, window, method, allocation, indicator or decode policy out of range; a
            budget not above the window (it would keep the window only).
    """
    budget = DEFAULT_BUDGET if request.budget is None else request.budget
    if profile is None:
        tau1, tau2, rule = 1.0, 1.0, "no profile: default 1.0"
        window, gamma, pool, chunk = DEFAULT_WINDOW, DEFAULT_GAMMA, DEFAULT_POOL, DEFAULT_CHUNK
    else:
        choice = profile.taus_for(budget) if budget > 0 else None
        tau1, tau2, rule = (choice.tau1, choice.tau2, choice.rule) if choice else (1.0, 1.0, "")
        window, gamma, pool = profile.window, profile.gamma, (profile.pooling.kind, profile.pooling.kernel)
        chunk = profile.chunk
    pair = resolve(default_method(profile, request), request.allocation, request.indicator) or ("cake", "cake")
    window = request.window if request.window is not None else window
    if 0 < budget <= window:  # the engine allows it, but a task keeping only the window is useless
        raise ConfigError(
            "budget",
            f"{{budget}} {budget} is not above the {window}-token observation window: it would keep no "
            "document token outside it",
            f"raise {{budget}} above {window} (e.g. {{budget}} {max(4 * window, 64)}) or lower {{window}}",
        )
    config = CakeConfig(
        budget=budget,
        window=window,
        tau1=tau1,
        tau2=tau2,
        gamma=gamma,
        pool_kind=pool[0],
        pool_kernel=pool[1],
        decode_policy=request.decode_policy,
        allocation=pair[0],
        indicator=pair[1],
        chunk=chunk,
    )
    return config, rule


def check_request(request: TaskRequest) -> None:
    """The cheap option checks that need no profile, template or document.

    Raises:
        UsageError: unknown dtype or attention backend, --threads, --max-new-tokens, --lines or --at out of
            range.
    """
    check_dtype(request.dtype)
    check_weights(request.weights or "bf16")
    if request.attention not in ATTENTIONS:
        raise unknown_name("attention backend", request.attention, ATTENTIONS)
    if request.threads is not None and request.threads < 1:
        raise UsageError(
            f"--threads must be at least 1 (got {request.threads})", "leave it out to choose automatically"
        )
    if request.max_new_tokens is not None and request.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1 (got {request.max_new_tokens})")
    if request.max_lines is not None:
        check_lines(request.max_lines)
    if request.at_line is not None:
        check_at_line(request.at_line)
    if request.long not in LONG_MODES:
        raise unknown_name("--long mode", request.long, LONG_MODES)
    if request.abstain not in TASK_ABSTAIN_MODES:
        raise unknown_name("--abstain mode", request.abstain, TASK_ABSTAIN_MODES)
    if request.long == SECTIONS and request.truncate == "error":
        raise UsageError(
            "--long sections reads a long document whole, --truncate error refuses it", "give only one of them"
        )


def plan(request: TaskRequest, cb: Callbacks | None = None, saved: SavedCache | None = None) -> Plan:
    """Check a request and read its document (or the .cake file given in its place); no model is loaded.
    `saved`: the request's .cake file already read and checked (`read_saved`), so a caller answering many
    requests on one file (the server) reads and checksums it once.

    Raises:
        UsageError / ConfigError: a bad option (before the document is read), or one that
            contradicts the .cake file.
        CakeError: a bad template, profile or document, or a truncated/corrupt/foreign .cake
            (one line with a hint).
    """
    cb = cb or Callbacks()
    check_request(request)
    warnings: list[str] = []
    threads, too_many = capped_threads(request.threads)
    if too_many:
        cb.warn(warnings, too_many)
        request = replace(request, threads=threads)
    if saved is None and is_cache_path(request.document):
        saved = read_saved(request.document)
    if saved is not None:
        request = settle(request, saved)
    template = load_template(PREFIX_TEMPLATE if request.task == COMPRESS else request.task)
    if request.long == SECTIONS and (saved is not None or template.output != "text"):
        what = "a .cake file (it holds one compressed prefix)" if saved is not None else f"task '{request.task}'"
        raise UsageError(f"--long sections cannot read {what}", "leave --long out, or give the document itself")
    check_inputs(
        template, request.truncate, request.fields if request.task != COMPRESS else dict.fromkeys(template.fields, "-")
    )
    profile = check_model_spec(request.model)  # an unknown name or missing path fails here, before torch
    if saved is not None and not saved.meta.whole:
        config, tau_rule = saved_config(saved.meta, request.decode_policy), f"saved in {saved.name}"
    else:
        config, tau_rule = cake_config_for(profile, request)
        method = default_method(profile, request)  # named for what runs: `cake+h2o --indicator tova` is cake+tova
        method = method if method == FULL else label(config.allocation, config.indicator)
        request = replace(request, budget=config.budget, method=method)
    doc = saved_document(saved.meta) if saved else load_document(request.document, password=request.password)
    for message in doc.warnings:
        cb.warn(warnings, message)
    text = saved.meta.used_text if saved else doc.text
    text = context_before(doc, request.at_line) if request.at_line is not None else text
    max_new = request.max_new_tokens
    if max_new is None:
        lines = request.max_lines or DEFAULT_LINES
        code = template.output == "code"
        max_new = max_new_tokens_for(lines, template.max_new_tokens) if code else template.max_new_tokens
    if request.method == FULL:
        config = replace(config, decode_policy="grow")
    return Plan(request, template, profile, config, tau_rule, doc, text, max_new, tuple(warnings), saved)


def for_fields(checked: Plan, fields: dict[str, str]) -> Plan:
    """The same plan with other template fields (another question on the same document).

    Raises:
        UsageError: a field the template needs is missing or blank.
    """
    check_inputs(checked.template, checked.request.truncate, fields)
    return replace(checked, request=replace(checked.request, fields=dict(fields)))
