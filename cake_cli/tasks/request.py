"""What a user asks for (`TaskRequest`) and what was checked of it (`Plan`), with the task defaults.

Data only: `tasks.planning.plan()` turns a request into a plan (cheap checks, no torch), and
`tasks.runner` then loads the model and runs the plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from cake_cli.engine.config import CakeConfig, SamplingConfig
from cake_cli.engine.methods import FULL
from cake_cli.models.profiles import Profile
from cake_cli.tasks.answers.abstain import DEFAULT_ABSTAIN
from cake_cli.tasks.inputs.documents import Document
from cake_cli.tasks.saved.fileformat import SavedCache
from cake_cli.tasks.templates import Template

DEFAULT_WINDOW, DEFAULT_GAMMA, DEFAULT_POOL = (
    32,
    200.0,
    ("avg", 5),
)  # the CAKE authors' defaults (docs/method.md §Hyperparameters)
INSPECT_TEMPLATE = "summarize"  # whose prompt `cake inspect-layers` prefills: the window holds its instruction
SAMPLE_NAME = "gull-rock.txt"  # packaged sample document (an original short story, ~1,600 tokens)
ATTENTIONS = ("auto", "sdpa", "eager", "flash_attention_2")
DEFAULT_BUDGET, DEFAULT_METHOD = (
    1024,
    "cake",
)  # tokens per layer, window included: `--budget 1024` of docs/method.md §Design card
LONG_MODES = ("middle", "sections")  # --long: cut the middle out of a too-long document, or read it in sections
MIDDLE, SECTIONS = LONG_MODES
PREFILLS = ("full", "select")  # --prefill: the whole prompt, or GemFilter's question-aware selection (qa)
SELECT_FACTOR = 4  # --prefill select keeps this many x the budget of document tokens unless told
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
    weights: str | None = None  # auto | bf16 | int8 | int4 | w8a8 (`models.weights`); None: bf16 (the CLI passes auto)
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
    long: str = MIDDLE  # a document longer than the context: "middle" (cut, with a warning) or "sections"
    prefill: str = "full"  # PREFILLS: "select" runs the model over the question's tokens only (`engine.selection`)
    select_tokens: int | None = None  # --prefill select: document tokens kept (None: SELECT_FACTOR x the budget)
    select_layer: int | None = None  # --prefill select: 0-based layer whose attention picks them (None: GemFilter's)
    abstain: str = DEFAULT_ABSTAIN  # qa: when to withhold an answer no passage holds (answers.abstain)


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
    config: CakeConfig  # the CAKE settings; unused for --method full (the runner passes no config: a plain full cache)
    tau_rule: str  # how the taus were chosen (for the report)
    doc: Document
    text: str  # the document text the prompt uses (cut at --at for code completion)
    max_new_tokens: int  # generation allowance, tokens
    warnings: tuple[str, ...]  # shown as they happened; the result carries them too
    saved: SavedCache | None = None  # the .cake file given in place of a document (checked)
    section: tuple[int, int] | None = None  # --long sections: `text` is doc.text[start:end] (offsets are the doc's)

    @property
    def evicts(self) -> bool:
        """False for --method full (nothing is scored or evicted)."""
        return self.request.method != FULL
