"""Task commands: summarize, qa, needle, complete. Each is its own arguments plus one call to
`run_command`; the shared options come from `cli.options.TaskOptions`.

Options, the template, the profile, the output path and the document are all checked here
(`tasks.planning.plan`, no torch) before `cli.runners.tasks` loads the model, so a bad option or a missing
file fails in well under a second.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from cake_cli.cli import options as o
from cake_cli.cli.app import app, handled
from cake_cli.cli.options import PrefillOptions, TaskOptions, with_options
from cake_cli.cli.progress import StderrProgress
from cake_cli.engine.config import SamplingConfig
from cake_cli.errors import UsageError, unknown_name
from cake_cli.files import check_writable
from cake_cli.tasks.answers.abstain import DEFAULT_ABSTAIN
from cake_cli.tasks.answers.completion import DEFAULT_LINES
from cake_cli.tasks.planning import for_fields, plan
from cake_cli.tasks.request import MIDDLE, PREFILLS, SECTIONS, Callbacks, Plan, TaskRequest
from cake_cli.tasks.saved.request import check_global

Questions = Annotated[
    list[str] | None,
    typer.Argument(
        help="The question; it ends the prompt, inside CAKE's observation window. Several questions (Q1 Q2 …) "
        "share one prefill of the document: it is kept whole, then each question evicts a copy with itself in "
        "the observation window (question-aware, as `cake compress`'s default).",
        metavar="QUESTION",
        show_default=False,
    ),
]
Long = Annotated[
    str,
    typer.Option(
        "--long",
        metavar="MODE",
        help="A document longer than the model's context: middle cuts its middle out (the warning names the "
        "pages / characters dropped); sections reads it in context-sized sections, each prefilled on its own "
        "(summarize: the section summaries are combined; qa: the answers whose passage is found are kept, "
        "with their pages).",
    ),
]

PrefillMode = Annotated[
    str,
    typer.Option(
        "--prefill",
        metavar="MODE",
        help="full reads the whole prompt; select (opt-in, GemFilter's early-layer filter) first runs the early "
        "layers over the whole prompt, keeps the document tokens the question's attention picks there (with the "
        "question and the first tokens), then runs the model over those only, with CAKE's budget: a sooner first "
        "token, at some risk to the answer (positions re-indexed; models with sliding-window layers refused).",
    ),
]
SelectTokens = Annotated[
    int | None,
    typer.Option(
        "--select-tokens",
        metavar="N",
        show_default=False,
        help="--prefill select: document tokens kept (default 4 x the budget).",
    ),
]
SelectLayer = Annotated[
    int | None,
    typer.Option(
        "--select-layer",
        metavar="L",
        show_default=False,
        help="--prefill select: the 0-based layer whose attention picks them (default 13/32 of the depth, "
        "GemFilter's; layers 0..L run over the whole prompt).",
    ),
]


def check_prefill(prefill: str, tokens: int | None, layer: int | None, questions: int, long: str) -> None:
    """Cheap checks of --prefill, --select-tokens and --select-layer.

    Raises:
        UsageError: an unknown mode, a count below 1 or a negative layer, the select options without
            --prefill select, or select with several questions or --long sections.
    """
    if prefill not in PREFILLS:
        raise unknown_name("--prefill mode", prefill, PREFILLS)
    if prefill != "select":
        if tokens is not None or layer is not None:
            raise UsageError("--select-tokens and --select-layer go with --prefill select", "add --prefill select")
        return
    if tokens is not None and tokens < 1:
        raise UsageError(f"--select-tokens must be >= 1, got {tokens}")
    if layer is not None and layer < 0:
        raise UsageError(f"--select-layer must be >= 0, got {layer}")
    if questions > 1:
        raise UsageError(
            "--prefill select chooses tokens for one question; several share one prefill of the whole document",
            "give one question, or leave --prefill out",
        )
    if long == SECTIONS:
        raise UsageError("--prefill select reads one prompt; --long sections reads several", "leave one of them out")


Abstain = Annotated[
    str,
    typer.Option(
        "--abstain",
        metavar="MODE",
        help="When no passage of the document holds the answer (the cited passage is not found, or does not "
        "hold the answer's words and numbers): foreign withholds it where one of its words or numbers is "
        "nowhere in the document; doubt withholds those and also one where the model's own probability of "
        "opening its reply with 'not in the document' is high (read on the kept cache, one short forward); "
        "unsupported withholds every such answer; a withheld answer is said so on a "
        "line of its own (the model's answer stays in the report and in --json as raw_answer); never shows "
        "it, flagged UNSUPPORTED.",
    ),
]


def resolve_document(document: str | None) -> str:
    """The document argument, or '-' when text is piped in.

    Raises:
        UsageError: no document and stdin is a terminal.
    """
    if document is not None:
        return document
    if not sys.stdin.isatty():
        return "-"
    raise UsageError(
        "no document given", "pass a file path, or '-' to read stdin (e.g. cat notes.txt | cake summarize -)"
    )


def task_request(task: str, document: str, fields: dict[str, str], opts: PrefillOptions, **extra) -> TaskRequest:
    """A TaskRequest from a command's shared options (`extra`: task-specific settings such as at_line).

    Raises:
        ConfigError: sampling options out of range (mapped to their flags by `handled`).
    """
    decoding = {}
    if isinstance(opts, TaskOptions):
        decoding = dict(
            decode_policy=opts.decode_policy,
            max_new_tokens=opts.max_new_tokens,
            sampling=SamplingConfig(opts.temperature, opts.top_p, opts.seed),
            no_repeat_ngram_size=opts.no_repeat_ngram,
        )
    return TaskRequest(
        task=task,
        document=document,
        fields=fields,
        model=opts.model,
        budget=opts.budget,
        window=opts.window,
        dtype=opts.dtype,
        weights=opts.weights,
        attention=opts.attention,
        device_map=opts.device_map,
        threads=opts.threads,
        truncate=opts.truncate,
        password=opts.password,
        method=opts.method,
        allocation=opts.allocation,
        indicator=opts.indicator,
        **decoding,
        **extra,
    )


def checked_plan(request: TaskRequest, progress: StderrProgress) -> Plan:
    """`tasks.planning.plan` with warnings shown on stderr as they happen."""
    return plan(request, Callbacks(on_warning=progress.warning))


def run_command(
    task: str, document: str | None, fields: dict[str, str], opts: TaskOptions, questions=None, **extra
) -> None:
    """The body of every task command: check everything cheap, then run and report. Known errors
    become one line on stderr and an exit code (1 runtime/input, 2 usage). `questions`: several
    questions (qa -q), each checked here."""
    with handled():
        request = task_request(task, resolve_document(document), fields, opts, **extra)
        output = check_writable(opts.output, "--output") if opts.output else None  # before any model work
        progress = StderrProgress(opts.quiet)
        checked = checked_plan(request, progress)
        check_global(checked)
        if request.prefill == "select" and checked.saved is not None:
            raise UsageError(
                "--prefill select reads a document; a .cake file was compressed without the question",
                "pass the document itself, or leave --prefill out",
            )
        if questions and request.long == SECTIONS:
            raise UsageError("--long sections answers one question at a time", "give one question, or leave --long out")
        plans = [for_fields(checked, {"question": q}) for q in questions] if questions else [checked]
        from cake_cli.cli.runners import tasks as run  # noqa: PLC0415 - torch loads after the checks

        run.run_and_report(plans, opts, progress, output)


@app.command()
@with_options(TaskOptions)
def summarize(document: o.Document = None, long: Long = MIDDLE, *, opts: TaskOptions) -> None:
    """Summarize a long document under a KV-cache budget; the summary streams to stdout, the report to stderr."""
    run_command("summarize", document, {}, opts, long=long)


@app.command()
@with_options(TaskOptions)
def qa(
    document: o.RequiredDocument,
    questions: Questions = None,
    long: Long = MIDDLE,
    prefill: PrefillMode = "full",
    select_tokens: SelectTokens = None,
    select_layer: SelectLayer = None,
    abstain: Abstain = DEFAULT_ABSTAIN,
    *,
    opts: TaskOptions,
) -> None:
    """Answer a question about a long document (or a .cake file from `cake compress`). One question ends
    the prompt, so CAKE keeps what it needs; several (`cake qa DOC Q1 Q2`) share one prefill of the
    document, and each answer follows a numbered line naming its question. Only the document is ever
    truncated."""
    asked = list(questions or [])
    with handled():
        if not asked:
            raise UsageError("task 'qa' needs a question", 'give it after the document, e.g. cake qa DOC "Who signed?"')
        check_prefill(prefill, select_tokens, select_layer, len(asked), long)
    options = dict(prefill=prefill, select_tokens=select_tokens, select_layer=select_layer, abstain=abstain)
    several = asked if len(asked) > 1 else None
    run_command("qa", document, {"question": asked[0]}, opts, questions=several, long=long, **options)


@app.command()
@with_options(TaskOptions)
def needle(document: o.RequiredDocument, query: o.Query, *, opts: TaskOptions) -> None:
    """Find and quote the passage that answers QUERY; the report (stderr) and --json say where it is (PDF page,
    character offset and depth) when the quote's content is found in the document."""
    run_command("needle", document, {"query": query}, opts)


@app.command()
@with_options(TaskOptions)
def complete(
    file: o.SourceFile = None, at: o.AtLine = None, lines: o.Lines = DEFAULT_LINES, *, opts: TaskOptions
) -> None:
    """Continue a source file (LongBench-style code completion): prints the next lines of code only, no prose.
    With --at LINE the context is the file before LINE."""
    run_command("complete", file, {}, opts, at_line=at, max_lines=lines)
