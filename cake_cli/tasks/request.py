"""What a user asks for, checked before anything heavy runs: `TaskRequest` -> `plan()` -> `Plan`.

Everything here is cheap (no torch, no model weights): options, the task template and its fields,
the model's profile, the CAKE settings and the document itself are checked, so a bad option or a
missing file fails in well under a second. `tasks.runner` then loads the model and runs the plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from cake_cli.engine.config import CakeConfig, ConfigError, SamplingConfig
from cake_cli.engine.methods import FULL, resolve
from cake_cli.errors import UsageError
from cake_cli.models.dtypes import check_dtype
from cake_cli.models.profiles import Profile, check_model_spec
from cake_cli.tasks.cachefile import SavedCache, is_cache_path, read_saved
from cake_cli.tasks.code import DEFAULT_LINES, check_at_line, check_lines, context_before, max_new_tokens_for
from cake_cli.tasks.documents import Document, load_document
from cake_cli.tasks.saved import saved_config, saved_document, settle
from cake_cli.tasks.templates import Template, check_inputs, load_template

DEFAULT_WINDOW, DEFAULT_GAMMA, DEFAULT_POOL = 32, 200.0, ("avg", 5)  # the CAKE authors' defaults (spec §5)
INSPECT_TEMPLATE = "summarize"  # whose prompt `cake inspect-layers` prefills: the window holds its instruction
SAMPLE_NAME = "gull-rock.txt"  # packaged sample document (an original short story, ~1,600 tokens)
ATTENTIONS = ("auto", "sdpa", "eager", "flash_attention_2")
DEFAULT_BUDGET, DEFAULT_METHOD = 1024, "cake"  # tokens per layer, window included: the design card's `--budget 1024`
COMPRESS = "compress"  # `cake compress`'s task: the shared prefix of PREFIX_TEMPLATE, no generation
PREFIX_TEMPLATE = "qa"  # whose prefix `cake compress` saves (every chat task template starts with the same block)


def sample_document() -> Path:
    """The packaged sample text used when `cake inspect-layers` gets no document."""
    return Path(str(resources.files("cake_cli.tasks") / "data" / "samples" / SAMPLE_NAME))


@dataclass(frozen=True)
class TaskRequest:
    """What the user asked for. None means "the profile's / template's default"."""

    task: str
    document: str  # path or "-"
    fields: dict[str, str] = field(default_factory=dict)  # template fields, e.g. question
    model: str | None = None
    budget: int | None = None  # None: DEFAULT_BUDGET, or a .cake file's own
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
    method: str | None = None  # a `methods.resolve` name; "full" evicts nothing (None: cake, or a .cake's own)
    allocation: str | None = None  # override the method's allocation (paper Sec. 5.5)
    indicator: str | None = None  # override the method's indicator
    at_line: int | None = None  # code completion: the context is the document up to this 1-based line
    max_lines: int | None = None  # code answers: most lines kept (None: code.DEFAULT_LINES)
    threads: int | None = None  # torch CPU threads for prefill and decoding (None: `tasks.threads` auto)


@dataclass
class Callbacks:
    """Hooks for the front end: streamed answer text, status lines, prefill progress, warnings."""

    on_text: Callable[[str], None] | None = None
    on_status: Callable[[str], None] | None = None
    on_layer: Callable[[int, int], None] | None = None
    on_warning: Callable[[str], None] | None = None

    def warn(self, warnings: list[str], message: str) -> None:
        """Record a warning (it ends up in the result) and show it now."""
        warnings.append(message)
        if self.on_warning:
            self.on_warning(message)

    def status(self, message: str) -> None:
        """Show a status line, if the front end wants them."""
        if self.on_status:
            self.on_status(message)


@dataclass(frozen=True)
class Plan:
    """A checked request: everything decided before the model loads."""

    request: TaskRequest
    template: Template
    profile: Profile | None
    config: CakeConfig  # the CAKE settings; `runner` widens the budget for --method full
    tau_rule: str  # how the taus were chosen (for the report)
    doc: Document
    text: str  # the document text the prompt uses (cut at --at for code completion)
    max_new_tokens: int  # generation allowance, tokens
    warnings: tuple[str, ...]  # shown as they happened; the result carries them too
    saved: SavedCache | None = None  # the .cake file given in place of a document (checked)

    @property
    def evicts(self) -> bool:
        """False for --method full (nothing is scored or evicted)."""
        return self.request.method != FULL


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
        window, gamma, pool = DEFAULT_WINDOW, DEFAULT_GAMMA, DEFAULT_POOL
    else:
        choice = profile.taus_for(budget) if budget > 0 else None
        tau1, tau2, rule = (choice.tau1, choice.tau2, choice.rule) if choice else (1.0, 1.0, "")
        window, gamma, pool = profile.window, profile.gamma, (profile.pooling.kind, profile.pooling.kernel)
    pair = resolve(request.method or DEFAULT_METHOD, request.allocation, request.indicator) or ("cake", "cake")
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
    )
    return config, rule


def check_request(request: TaskRequest) -> None:
    """The cheap option checks that need no profile, template or document.

    Raises:
        UsageError: unknown dtype or attention backend, --threads, --max-new-tokens, --lines or --at out of
            range.
    """
    check_dtype(request.dtype)
    if request.attention not in ATTENTIONS:
        raise UsageError(f"unknown attention backend '{request.attention}'", f"choose one of {', '.join(ATTENTIONS)}")
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


def plan(request: TaskRequest, cb: Callbacks | None = None) -> Plan:
    """Check a request and read its document (or the .cake file given in its place); no model is loaded.

    Raises:
        UsageError / ConfigError: a bad option (before the document is read), or one that
            contradicts the .cake file.
        CakeError: a bad template, profile or document, or a truncated/corrupt/foreign .cake
            (one line with a hint).
    """
    cb = cb or Callbacks()
    check_request(request)
    saved = read_saved(request.document) if is_cache_path(request.document) else None
    if saved is not None:
        request = settle(request, saved)
    template = load_template(PREFIX_TEMPLATE if request.task == COMPRESS else request.task)
    check_inputs(
        template, request.truncate, request.fields if request.task != COMPRESS else dict.fromkeys(template.fields, "-")
    )
    profile = check_model_spec(request.model)  # an unknown name or missing path fails here, before torch
    if saved is not None and not saved.meta.whole:
        config, tau_rule = saved_config(saved.meta, request.decode_policy), f"saved in {saved.name}"
    else:
        config, tau_rule = cake_config_for(profile, request)
        request = replace(request, budget=config.budget, method=request.method or DEFAULT_METHOD)
    warnings: list[str] = []
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
