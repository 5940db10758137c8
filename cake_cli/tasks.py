"""Task templates (YAML data, versioned) rendered through the model's chat template.

A template's user text ends with the instruction (and, for QA, the question), so that it lies in
CAKE's observation window: the last w prompt tokens score what the rest of the cache keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from cake_cli.errors import CakeError, UsageError

SCHEMA_VERSION = 1
_KEYS = {"version", "task", "description", "system", "user", "max_new_tokens", "no_repeat_ngram_size"}
TRUNCATE_MODES = ("middle", "error")


@dataclass(frozen=True)
class Template:
    """A validated task template."""

    task: str
    description: str
    system: str | None
    user: str  # str.format template with {document} (and task fields such as {question})
    max_new_tokens: int  # default generation length, tokens
    no_repeat_ngram_size: int = 0  # default n-gram blocking (0 = off), tokens


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt, ready for the engine."""

    input_ids: tuple[int, ...]
    document_tokens: int  # tokens of the document as used (after truncation)
    original_document_tokens: int  # before truncation
    warnings: tuple[str, ...]

    @property
    def truncated(self) -> bool:
        return self.document_tokens < self.original_document_tokens


def template_dir() -> Path:
    return Path(str(resources.files("cake_cli") / "templates"))


def load_template(task: str) -> Template:
    """Load and validate `templates/<task>.yaml`.

    Raises:
        CakeError: missing file, bad YAML, unknown or missing keys, wrong version.
    """
    path = template_dir() / f"{task}.yaml"
    if not path.is_file():
        raise CakeError(f"no template for task '{task}'", f"expected {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise CakeError(f"template {path.name} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or set(data) - _KEYS or {"version", "task", "user", "max_new_tokens"} - set(data):
        raise CakeError(f"template {path.name} has unknown or missing keys",
                        f"allowed keys: {', '.join(sorted(_KEYS))}")
    if data["version"] != SCHEMA_VERSION:
        raise CakeError(f"template {path.name} has version {data['version']}, expected {SCHEMA_VERSION}")
    return Template(task=data["task"], description=data.get("description", ""), system=data.get("system"),
                    user=data["user"], max_new_tokens=int(data["max_new_tokens"]),
                    no_repeat_ngram_size=int(data.get("no_repeat_ngram_size", 0)))


def _render(tokenizer, template: Template, document: str, fields: dict[str, str]) -> list[int]:
    user = template.user.format(document=document, **fields)
    messages = ([{"role": "system", "content": template.system}] if template.system else []) + \
        [{"role": "user", "content": user}]
    if getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)
        return list(encoded["input_ids"])
    return tokenizer(user)["input_ids"]


def middle_cut(tokenizer, text: str, keep_tokens: int) -> str:
    """Keep the first and last keep_tokens / 2 tokens of `text` (LongBench-style), joined by ' … '."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    head, tail = keep_tokens // 2, keep_tokens - keep_tokens // 2
    return tokenizer.decode(ids[:head]) + " … " + (tokenizer.decode(ids[-tail:]) if tail else "")


def build_prompt(tokenizer, template: Template, document: str, *, max_prompt_tokens: int,
                 truncate: str = "middle", **fields: str) -> Prompt:
    """Render `document` into the template and the chat template; middle-truncate if too long.

    Args:
        tokenizer: the model's tokenizer (its chat template is used when it has one).
        template: the task template.
        document: normalised document text.
        max_prompt_tokens: the model's prompt limit, tokens.
        truncate: "middle" (keep head and tail of the document, warn) or "error".
        fields: extra template fields, e.g. question=...

    Returns:
        Prompt with token ids and truncation facts.

    Raises:
        CakeError: the prompt does not fit and truncate == "error", or even an empty document
            does not fit.
    """
    if truncate not in TRUNCATE_MODES:
        raise UsageError(f"unknown --truncate mode '{truncate}'", f"choose one of {', '.join(TRUNCATE_MODES)}")
    doc_tokens = len(tokenizer(document, add_special_tokens=False)["input_ids"])
    ids = _render(tokenizer, template, document, fields)
    if len(ids) <= max_prompt_tokens:
        return Prompt(tuple(ids), doc_tokens, doc_tokens, ())
    overhead = len(_render(tokenizer, template, "", fields))
    room = max_prompt_tokens - overhead - 8  # a little slack for re-tokenisation at the cut
    if truncate == "error" or room <= 0:
        raise CakeError(f"the prompt has {len(ids)} tokens, more than this model's limit of {max_prompt_tokens}",
                        "shorten the document, or use --truncate middle" if truncate == "error"
                        else "the template and question alone do not fit; shorten the question")
    while True:
        cut = middle_cut(tokenizer, document, room)
        ids = _render(tokenizer, template, cut, fields)
        if len(ids) <= max_prompt_tokens:
            break
        room -= len(ids) - max_prompt_tokens + 4
    kept = len(tokenizer(cut, add_special_tokens=False)["input_ids"])
    warning = (f"document truncated in the middle from {doc_tokens} to {kept} tokens to fit the model's "
               f"{max_prompt_tokens}-token prompt limit (use --truncate error to refuse instead)")
    return Prompt(tuple(ids), kept, doc_tokens, (warning,))
