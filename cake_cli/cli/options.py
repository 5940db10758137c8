"""Command-line arguments and options, declared once (names, help texts and defaults never drift).

Arguments are `Annotated` aliases. The options every task shares are the fields of two frozen
dataclasses, `PrefillOptions` (what a prefill needs) and `TaskOptions` (plus decoding and
output); `with_options(Cls)` adds a dataclass's fields to a command's signature and hands the
command one `opts` object, so no command repeats them. Method, allocation and indicator names in
help texts come from the engine's registries.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Annotated, get_type_hints

import typer

from cake_cli.engine.allocation import ALLOCATIONS
from cake_cli.engine.config import DECODE_POLICIES
from cake_cli.engine.indicators import INDICATORS
from cake_cli.engine.methods import METHODS
from cake_cli.tasks.request import DEFAULT_BUDGET

# The flag of each engine setting (`engine.config.ConfigError.field`), for error messages.
FLAGS = {
    "budget": "--budget",
    "window": "--window",
    "decode_policy": "--decode-policy",
    "method": "--method",
    "allocation": "--allocation",
    "indicator": "--indicator",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "no_repeat_ngram_size": "--no-repeat-ngram",
}


def _argument(help: str, metavar: str) -> typer.models.ArgumentInfo:
    return typer.Argument(help=help, metavar=metavar, show_default=False)


def _flag(*names: str, help: str) -> typer.models.OptionInfo:
    """A boolean flag (no value: the empty metavar keeps help from showing a type)."""
    return typer.Option(*names, help=help, metavar="")


# ---- arguments --------------------------------------------------------------------------------

_DOC = "A PDF, a text file, a .cake file from `cake compress`, or '-' for stdin"
Document = Annotated[str | None, _argument(f"{_DOC} (default: stdin when piped).", "DOCUMENT")]
RequiredDocument = Annotated[str, _argument(f"{_DOC}.", "DOCUMENT")]
SourceFile = Annotated[
    str | None, _argument("Source file to continue, or '-' for stdin (default: stdin when piped).", "FILE")
]
SourceDocument = Annotated[  # what `cake compress` reads (not a .cake: that is compressed already)
    str | None, _argument("A PDF, a text file, or '-' for stdin (default: stdin when piped).", "DOCUMENT")
]
InspectDocument = Annotated[
    str | None,
    _argument("A PDF, a text file or '-' for stdin (default: a short packaged sample story).", "DOCUMENT"),
]
Question = Annotated[str, _argument("The question; it ends the prompt, inside CAKE's observation window.", "QUESTION")]
Query = Annotated[str, _argument("What to look for, e.g. a question the passage answers.", "QUERY")]
ProfileName = Annotated[str, _argument("Profile name or alias (see `cake profiles list`).", "PROFILE")]

# ---- options of single commands ---------------------------------------------------------------

AtLine = Annotated[
    int | None,
    typer.Option(
        "--at",
        metavar="LINE",
        show_default=False,
        help="Complete from this 1-based line: the context is the file before it (default: after the last line).",
    ),
]
Lines = Annotated[int, typer.Option("--lines", "-l", metavar="N", help="Most lines of code to print.")]
Json = Annotated[bool, _flag("--json", help="Print one JSON object to stdout instead of the table.")]
TaskJson = Annotated[
    bool, _flag("--json", help="Print one JSON object to stdout instead: the answer and the whole report.")
]
Quiet = Annotated[bool, _flag("--quiet", "-q", help="No report or progress on stderr (warnings still).")]

# ---- options shared by the task commands ------------------------------------------------------

Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        envvar="CAKE_MODEL",
        metavar="NAME|PATH",
        show_default=False,
        help="Profile name or alias (see `cake profiles list`), local model folder, .gguf file, or a hub id "
        "already in the Hugging Face cache. Default: the embedded model.",
    ),
]
_BUDGET = "KV cache budget B: tokens per layer on average, window included (B·L cache slots in all)."
Budget = Annotated[  # commands that prefill a document themselves (compress, inspect-layers)
    int | None,
    typer.Option("--budget", "-b", metavar="TOKENS", show_default=False, help=f"{_BUDGET} Default: {DEFAULT_BUDGET}."),
]
TaskBudget = Annotated[  # task commands, which also take a .cake file
    int | None,
    typer.Option(
        "--budget",
        "-b",
        metavar="TOKENS",
        show_default=False,
        help=f"{_BUDGET} Default: {DEFAULT_BUDGET}, or a .cake file's own.",
    ),
]
Window = Annotated[
    int | None,
    typer.Option(
        "--window",
        "-w",
        metavar="TOKENS",
        show_default=False,
        help="Observation window w: the last w prompt tokens, never evicted (default: the profile's, 32).",
    ),
]
Dtype = Annotated[
    str,
    typer.Option(
        "--dtype",
        metavar="DTYPE",
        help="auto (bfloat16 on CPUs with native bf16, AVX512-BF16 or AMX; float32 on other CPUs; the "
        "profile's on CUDA), float32, bfloat16 or float16.",
    ),
]
Weights = Annotated[
    str,
    typer.Option(
        "--weights",
        metavar="FORMAT",
        help="Linear-layer weights: auto (on CPU for a model over 64 MiB of them int8, w8a8 for a float32 "
        "model; else the --dtype), "
        "bf16 (the --dtype), int8 or int4 (weight-only quantized, CPU; quantized once and cached under "
        "CAKE_HOME), w8a8 (int8 weights, activations quantized per token too, decode and prefill; "
        "faster on a float32 model, x86 CPU). "
        "The report says which and why.",
    ),
]
Attention = Annotated[
    str,
    typer.Option(
        "--attention",
        metavar="BACKEND",
        help="auto (flash_attention_2 on CUDA with flash-attn, else sdpa), sdpa, eager or flash_attention_2.",
    ),
]
DeviceMap = Annotated[
    str | None,
    typer.Option(
        "--device-map",
        metavar="MAP",
        show_default=False,
        help="'auto' spreads a large model over GPUs and CPU (accelerate).",
    ),
]
Truncate = Annotated[
    str,
    typer.Option(
        "--truncate",
        metavar="MODE",
        help="middle: keep the head and tail of a too-long document (with a warning); error: refuse.",
    ),
]
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        metavar="N",
        show_default=False,
        help="CPU threads for prefill and decoding (default: prefill on the cores idle now; decoding starts on "
        "as many and every 8 tokens keeps to the cores other processes leave free; the report says which).",
    ),
]
Password = Annotated[
    str | None, typer.Option("--password", metavar="TEXT", show_default=False, help="Password of an encrypted PDF.")
]
_METHOD = (
    f"KV eviction method: {', '.join(m for m in METHODS if m != 'full')}, or full (no eviction); also any "
    "allocation+indicator pairing, e.g. cake+snapkv."
)
_PROFILE_METHOD = "Default: the model profile's method (see cake profiles show)"
Method = Annotated[  # compress, inspect-layers
    str | None, typer.Option("--method", metavar="NAME", show_default=False, help=f"{_METHOD} {_PROFILE_METHOD}.")
]
TaskMethod = Annotated[  # task commands, which also take a .cake file
    str | None,
    typer.Option(
        "--method", metavar="NAME", show_default=False, help=f"{_METHOD} {_PROFILE_METHOD}, or a .cake file's own."
    ),
]
Allocation = Annotated[
    str | None,
    typer.Option(
        "--allocation",
        metavar="NAME",
        show_default=False,
        help=f"Override the method's budget allocation across layers: {', '.join(ALLOCATIONS)}; or global "
        "(with --scoring reconstruct: KVzip's one ranking over every layer and KV head, unequal shares).",
    ),
]
Indicator = Annotated[
    str | None,
    typer.Option(
        "--indicator",
        metavar="NAME",
        show_default=False,
        help=f"Override the method's token indicator: {', '.join(INDICATORS)}.",
    ),
]
DecodePolicy = Annotated[
    str,
    typer.Option(
        "--decode-policy",
        metavar="|".join(DECODE_POLICIES).upper(),
        help="fixed: each layer keeps its size while decoding (one eviction per new token); "
        "grow: new tokens are appended.",
    ),
]
MaxNewTokens = Annotated[
    int | None,
    typer.Option(
        "--max-new-tokens",
        "-n",
        metavar="TOKENS",
        show_default=False,
        help="Most tokens to generate (default: the task template's).",
    ),
]
Temperature = Annotated[float, typer.Option("--temperature", metavar="T", help="0 = greedy; > 0 samples.")]
TopP = Annotated[float, typer.Option("--top-p", metavar="P", help="Nucleus sampling mass (with --temperature > 0).")]
Seed = Annotated[int | None, typer.Option("--seed", metavar="N", show_default=False, help="Random seed for sampling.")]
NoRepeatNgram = Annotated[
    int | None,
    typer.Option(
        "--no-repeat-ngram",
        metavar="N",
        show_default=False,
        help="Forbid repeating any n-gram of N tokens (0 = off; default: the task template's).",
    ),
]
Output = Annotated[
    str | None,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        show_default=False,
        help="Also write the answer (or the JSON with --json) to FILE, atomically: an interrupted run never "
        "leaves a partial file.",
    ),
]


@dataclasses.dataclass(frozen=True)
class PrefillOptions:
    """The options of every command that prefills a document (field name = parameter name)."""

    model: Model = None
    budget: Budget = None  # None: DEFAULT_BUDGET (a task on a .cake file: the file's own)
    window: Window = None
    method: Method = None  # None: cake (a task on a .cake file: the file's own)
    allocation: Allocation = None
    indicator: Indicator = None
    dtype: Dtype = "auto"
    weights: Weights = "auto"
    attention: Attention = "auto"
    device_map: DeviceMap = None
    threads: Threads = None
    truncate: Truncate = "middle"
    password: Password = None
    json_out: TaskJson = False
    quiet: Quiet = False


@dataclasses.dataclass(frozen=True)
class TaskOptions(PrefillOptions):
    """PrefillOptions plus decoding and the output file (every task command; a task also takes a .cake
    file, whose budget and method are then the defaults)."""

    budget: TaskBudget = None  # keeps its place among the fields; only the help text says more
    method: TaskMethod = None
    decode_policy: DecodePolicy = "fixed"
    max_new_tokens: MaxNewTokens = None
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    seed: Seed = None
    no_repeat_ngram: NoRepeatNgram = None
    output: Output = None


def with_options(options_cls: type):
    """Decorator: append the fields of `options_cls` to a command's parameters (as Typer options)
    and call the command with them gathered into one `opts: options_cls` keyword.

    Uses Typer's public behaviour only: it reads the command's signature (`__signature__`).
    """
    hints = get_type_hints(options_cls, include_extras=True)
    last = ("output", "json_out", "quiet")  # what to print and where, after the run's settings in --help
    fields = sorted(dataclasses.fields(options_cls), key=lambda f: last.index(f.name) if f.name in last else -1)
    shared = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
        for f in fields
    ]

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        own = [p for name, p in signature.parameters.items() if name != "opts"]

        @functools.wraps(command)
        def wrapper(**kwargs):
            opts = options_cls(**{f.name: kwargs.pop(f.name) for f in fields})
            return command(**kwargs, opts=opts)

        wrapper.__signature__ = signature.replace(parameters=[*own, *shared])
        wrapper.__annotations__ = {p.name: p.annotation for p in (*own, *shared)}
        return wrapper

    return decorate
