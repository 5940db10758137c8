"""Task templates (YAML data, versioned) rendered through the model's chat template, or raw.

A template's user text ends with the instruction (and, for QA, the question), so that it lies in
CAKE's observation window: the last w prompt tokens score what the rest of the cache keeps.

Shared prefix: every chat task template starts with the same document block (`DOCUMENT_BLOCK`:
``<document>``, the document, ``</document>`` and a blank line), so the rendered prompt of every
task begins with the same tokens, the *prefix*: the chat template's opening (system prompt, user
header) and the document block. `cake compress` prefills and saves the prefix once; a task then
runs only its *suffix* (its instruction, question and the chat template's end) as a continuation.
A prompt is always tokenized in these two pieces (prefix ids + suffix ids, split after the blank
line that ends the document block, where byte-level BPE pre-tokenizers split anyway), with or
without a saved cache, so the two paths see the same token ids.

Keys (``version: 1``; unknown keys are errors): ``task``, ``description``, ``system``, ``user``
(a ``str.format`` text with ``{document}`` and each name of ``fields``), ``max_new_tokens``,
``no_repeat_ngram_size``, ``fields`` (required task fields, e.g. ``[question]``), ``chat``
(false: the user text is the whole prompt, no chat template), ``output`` (``text`` or ``code``:
code answers are post-processed by :mod:`cake_cli.tasks.answers.completion`) and ``locate`` (find the answer in the
document, :mod:`cake_cli.tasks.answers.locate`).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from cake_cli.errors import CakeError, UsageError, unknown_name

SCHEMA_VERSION = 1
TRUNCATE_MODES = ("middle", "error")
DOCUMENT_BLOCK = "<document>\n{document}\n</document>\n\n"  # how every chat task template starts
OutputKind = Literal["text", "code"]
OUTPUT_KINDS = get_args(OutputKind)


@dataclass(frozen=True)
class Template:
    """A validated task template."""

    task: str
    description: str
    system: str | None
    user: str  # str.format template with {document} (and task fields such as {question})
    max_new_tokens: int  # default generation length, tokens
    no_repeat_ngram_size: int = 0  # default n-gram blocking (0 = off), tokens
    fields: tuple[str, ...] = ()  # required task fields, e.g. ("question",)
    chat: bool = True  # False: the rendered user text is the whole prompt (raw completion)
    output: str = "text"  # "text" or "code" (post-processed: fences and prose dropped, N lines)
    locate: bool = False  # find the answer's passage in the document (needle search)


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt, ready for the engine."""

    input_ids: tuple[int, ...]  # prefix ids + suffix ids
    document_tokens: int  # tokens of the document as used (after truncation)
    original_document_tokens: int  # before truncation
    warnings: tuple[str, ...]
    prefix_tokens: int = 0  # the first prefix_tokens ids: chat opening + document block (`split_at`)
    document_text: str = ""  # the document as used (middle-cut when truncated)
    dropped: tuple[int, int] | None = None  # characters [start, end) of the document the middle cut left out

    @property
    def truncated(self) -> bool:
        return self.document_tokens < self.original_document_tokens


def template_dir() -> Path:
    return Path(str(resources.files("cake_cli.tasks") / "data" / "templates"))


class _TemplateFile(BaseModel):
    """A template file as written: strict types, no unknown keys (messages: `_template_problem`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    version: int
    task: str
    description: str = ""
    system: str | None = None
    user: str
    max_new_tokens: Annotated[int, Field(gt=0)]
    no_repeat_ngram_size: Annotated[int, Field(ge=0)] = 0
    fields: list[str] | None = None
    chat: bool = True
    output: OutputKind = "text"
    locate: bool = False

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        if isinstance(v, bool) or v != SCHEMA_VERSION:
            raise PydanticCustomError("cake_version", f"has version {v}, expected {SCHEMA_VERSION}")
        return v

    @field_validator("fields", mode="before")
    @classmethod
    def _fields(cls, v: Any) -> Any:
        if v is not None and (not isinstance(v, list) or not all(isinstance(f, str) and f.isidentifier() for f in v)):
            raise PydanticCustomError("cake", "'fields' must be a list of names")
        return v

    @model_validator(mode="after")
    def _placeholders(self) -> _TemplateFile:
        fields = self.fields or []
        names = {name for _, name, _, _ in string.Formatter().parse(self.user) if name is not None}
        if "document" not in names or names - {"document", *fields}:
            raise PydanticCustomError(
                "cake", f"'user' must use {{document}} and only the declared fields {fields} (found {sorted(names)})"
            )
        return self


_TEMPLATE_MESSAGES = {  # field -> the problem, for pydantic's type and value errors
    "user": "'user' must be text",
    "chat": "'chat' must be true or false",
    "locate": "'locate' must be true or false",
    "output": f"'output' must be one of {', '.join(OUTPUT_KINDS)}",
    "max_new_tokens": "'max_new_tokens' must be a positive integer",
    "no_repeat_ngram_size": "'no_repeat_ngram_size' must be a non-negative integer",
}


def _template_problem(exc: ValidationError, name: str) -> CakeError:
    """One line for pydantic's first error: version, then unknown or missing keys, then the rest."""
    errors = exc.errors()
    first = min(
        errors, key=lambda e: 0 if e["loc"] == ("version",) else 1 if e["type"] in ("extra_forbidden", "missing") else 2
    )
    if first["type"] in ("extra_forbidden", "missing"):
        allowed = ", ".join(sorted(_TemplateFile.model_fields))
        return CakeError(f"template {name} has unknown or missing keys", f"allowed keys: {allowed}")
    if first["type"] == "cake_version":
        return CakeError(f"template {name} {first['msg']}")
    if first["type"] == "cake":
        return CakeError(f"template {name}: {first['msg']}")
    field = str(first["loc"][0]) if first["loc"] else ""
    return CakeError(f"template {name}: {_TEMPLATE_MESSAGES.get(field, f'{field!r} must be text')}")


BENCH_PREFIX = "bench_"  # templates of `cake bench` only, not task commands


def task_names() -> tuple[str, ...]:
    """The task commands' templates (`templates/*.yaml` without the benchmarks'), sorted: the one
    list of tasks (`cake batch TASK`, help texts)."""
    return tuple(sorted(p.stem for p in template_dir().glob("*.yaml") if not p.stem.startswith(BENCH_PREFIX)))


def load_template(task: str) -> Template:
    """Load and validate `templates/<task>.yaml` (strict: unknown keys, wrong types are errors).

    Read with `yaml.safe_load` (nothing in it runs) and validated by a pydantic model
    (`extra="forbid"`, strict types: `chat: maybe` or `max_new_tokens: "64"` are errors).

    Raises:
        CakeError: missing file, bad YAML, unknown or missing keys, wrong version or types, or
            placeholders in `user` other than {document} and the declared fields.
    """
    path = template_dir() / f"{task}.yaml"
    if not path.is_file():
        raise CakeError(f"no template for task '{task}'", f"expected {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise CakeError(f"template {path.name} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        allowed = ", ".join(sorted(_TemplateFile.model_fields))
        raise CakeError(f"template {path.name} has unknown or missing keys", f"allowed keys: {allowed}")
    try:
        spec = _TemplateFile.model_validate(data)
    except ValidationError as exc:
        raise _template_problem(exc, path.name) from None
    return Template(
        task=spec.task,
        description=spec.description,
        system=spec.system,
        user=spec.user,
        max_new_tokens=spec.max_new_tokens,
        no_repeat_ngram_size=spec.no_repeat_ngram_size,
        fields=tuple(spec.fields or ()),
        chat=spec.chat,
        output=spec.output,
        locate=spec.locate,
    )


def split_at(template: Template) -> int:
    """Offset in `template.user` where the shared prefix ends: after the first blank line that follows
    {document} (the end of `DOCUMENT_BLOCK`), or the end of the text when there is none."""
    blank = template.user.find("\n\n", template.user.index("{document}"))
    return len(template.user) if blank < 0 else blank + 2


def render_split(tokenizer, template: Template, document: str, **fields: str) -> tuple[list[int], list[int]]:
    """Render `template` with `document` and `fields`, tokenized as (prefix ids, suffix ids).

    The prefix is everything up to `split_at` (through the chat template when the template is a chat
    one and the tokenizer has a chat template); the suffix is the rest, tokenized on its own without
    special tokens. The cut goes after the blank line that ends the document block, else just before
    it when only that gives the unsplit text's ids (Qwen merges ">\n\n"; SmolLM2 splits "\n\nWord"
    as "\n", "\n", "Word"). No checks (see `build_prompt`); fields may be empty. A chat template that
    does not carry the message text verbatim leaves nothing to split: the suffix is empty.
    """
    user = template.user.format(document=document, **fields)
    head = len(template.user[: split_at(template)].format(document=document, **fields))
    messages = ([{"role": "system", "content": template.system}] if template.system else []) + [
        {"role": "user", "content": user}
    ]
    text, offset, special = user, 0, True  # raw prompt: the tokenizer's own special tokens (e.g. BOS)
    if template.chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        offset, special = text.find(user), False  # tokenized as apply_chat_template does
        if offset < 0:
            return list(tokenizer(text, add_special_tokens=False)["input_ids"]), []

    def split(cut: int) -> tuple[list[int], list[int]]:
        prefix = list(tokenizer(text[:cut], add_special_tokens=special)["input_ids"])
        return prefix, list(tokenizer(text[cut:], add_special_tokens=False)["input_ids"]) if text[cut:] else []

    cuts = [offset + head] + ([offset + head - 2] if user[:head].endswith("\n\n") else [])
    splits = [split(cut) for cut in cuts]
    whole = list(tokenizer(text, add_special_tokens=special)["input_ids"]) if len(cuts) > 1 else None
    return next((p for p in splits if whole is None or p[0] + p[1] == whole), splits[0])


def middle_cut(tokenizer, text: str, keep_tokens: int) -> str:
    """Keep the first and last keep_tokens / 2 tokens of `text` (LongBench-style), joined by ' … '."""
    cut, _ = cut_middle(tokenizer, text, keep_tokens)
    return cut


def cut_middle(tokenizer, text: str, keep_tokens: int) -> tuple[str, tuple[int, int]]:
    """`middle_cut` with the part left out: (cut text, (start, end) character offsets of `text` dropped).

    The head and tail are slices of `text` itself at token boundaries (the tokenizer's offset
    mapping when it has one, else the decoded lengths), so offsets into the kept parts are offsets
    into `text`.
    """
    head, tail = keep_tokens // 2, keep_tokens - keep_tokens // 2
    try:
        spans = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    except (NotImplementedError, TypeError, KeyError, ValueError):  # a slow tokenizer has no offsets
        spans = None
    if spans:
        start = spans[head - 1][1] if head > 0 else 0
        end = spans[-tail][0] if 0 < tail <= len(spans) else len(text)
    else:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        start = len(tokenizer.decode(ids[:head]))
        end = len(text) - (len(tokenizer.decode(ids[-tail:])) if tail else 0)
    start, end = min(start, len(text)), max(min(end, len(text)), min(start, len(text)))
    return text[:start] + " … " + text[end:], (start, end)


def check_inputs(template: Template, truncate: str, fields: dict[str, str]) -> None:
    """Cheap checks before any model is loaded.

    Raises:
        UsageError: unknown truncate mode, or a field the template needs is missing or blank.
    """
    if truncate not in TRUNCATE_MODES:
        raise unknown_name("--truncate mode", truncate, TRUNCATE_MODES)
    missing = [name for name in template.fields if not str(fields.get(name, "")).strip()]
    if missing:
        raise UsageError(f"task '{template.task}' needs a non-empty {' and '.join(missing)}", "give it as an argument")


def build_prompt(
    tokenizer,
    template: Template,
    document: str,
    *,
    max_prompt_tokens: int,
    truncate: str = "middle",
    pages=None,
    **fields: str,
) -> Prompt:
    """Render `document` into the template and the chat template; middle-truncate if too long.

    Args:
        tokenizer: the model's tokenizer (its chat template is used when it has one).
        template: the task template.
        document: normalised document text.
        max_prompt_tokens: the model's prompt limit, tokens.
        truncate: "middle" (keep head and tail of the document, warn) or "error".
        pages: optional function (start, end) -> the PDF pages of that character range ("30-44"),
            named in the middle cut's warning with the character offsets left out.
        fields: the template's fields, e.g. question=...; only the document is ever truncated.

    Returns:
        Prompt with token ids and truncation facts (`Prompt.dropped`: the characters left out).

    Raises:
        UsageError: unknown truncate mode, or a template field missing.
        CakeError: the prompt does not fit and truncate == "error", or even an empty document
            does not fit.
    """
    check_inputs(template, truncate, fields)
    return fit_prompt(tokenizer, template, document, max_prompt_tokens, truncate, fields, pages)


def build_prefix(tokenizer, template: Template, document: str, *, max_prompt_tokens: int, truncate: str) -> Prompt:
    """The shared prefix alone (chat opening + document block, `split_at`) as a Prompt, the document
    middle-truncated so that the prefix fits `max_prompt_tokens` (what `cake compress` prefills).

    Raises:
        UsageError / CakeError: as for `build_prompt`.
    """
    if truncate not in TRUNCATE_MODES:
        raise unknown_name("--truncate mode", truncate, TRUNCATE_MODES)
    return fit_prompt(tokenizer, template, document, max_prompt_tokens, truncate, None)


def fit_prompt(tokenizer, template: Template, document: str, limit: int, truncate: str, fields, pages=None) -> Prompt:
    """Render and middle-cut the document until the prompt fits `limit` tokens; `fields` None: the
    prefix only (the template's fields rendered empty). `pages(start, end)`: the PDF pages of a
    character range, e.g. "30-44" (None or "" for text), named in the cut's warning."""

    def render(text: str) -> tuple[list[int], int]:  # (ids, prefix length)
        prefix, suffix = render_split(tokenizer, template, text, **(fields or dict.fromkeys(template.fields, "")))
        return prefix + (suffix if fields is not None else []), len(prefix)

    doc_tokens = len(tokenizer(document, add_special_tokens=False)["input_ids"])
    ids, head = render(document)
    if len(ids) <= limit:
        return Prompt(tuple(ids), doc_tokens, doc_tokens, (), head, document)
    overhead = len(render("")[0])
    room = limit - overhead - 8  # a little slack for re-tokenisation at the cut
    if truncate == "error" or room <= 0:
        raise CakeError(
            f"the prompt has {len(ids)} tokens, more than this model's limit of {limit}",
            "shorten the document, or use --truncate middle"
            if truncate == "error"
            else "the template and question alone do not fit; shorten the question",
        )
    while True:
        cut, dropped = cut_middle(tokenizer, document, room)
        ids, head = render(cut)
        if len(ids) <= limit:
            break
        room -= len(ids) - limit + 4
    kept = len(tokenizer(cut, add_special_tokens=False)["input_ids"])
    where = f"characters {dropped[0]}-{dropped[1]}"
    if document:
        where += f" ({100 * dropped[0] / len(document):.1f}%-{100 * dropped[1] / len(document):.1f}% of the document"
        where += f", pages {pages(*dropped)})" if pages and pages(*dropped) else ")"
    warning = (
        f"document truncated in the middle from {doc_tokens} to {kept} tokens to fit the model's "
        f"{limit}-token prompt limit: {where} were not read (use --long sections to read them, or "
        "--truncate error to refuse)"
    )
    return Prompt(tuple(ids), kept, doc_tokens, (warning,), head, cut, dropped)
