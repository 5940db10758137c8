"""Task commands: summarize, qa, needle, complete. Each is its option list plus one call to
`run_command`; the option names and help texts live once in `cake_cli.cli.options`."""

from __future__ import annotations

import json
import sys

from cake_cli.cli import options as o
from cake_cli.cli.app import StderrProgress, app, handled
from cake_cli.errors import CakeError
from cake_cli.files import check_writable, write_atomic
from cake_cli.tasks.code import DEFAULT_LINES

DEFAULT_BUDGET = 1024  # tokens per layer, window included
# The options every task command declares (its parameter names), handed to `task_request`.
SHARED_OPTIONS = (
    "model",
    "budget",
    "window",
    "decode_policy",
    "dtype",
    "attention",
    "device_map",
    "max_new_tokens",
    "temperature",
    "top_p",
    "seed",
    "no_repeat_ngram",
    "truncate",
    "password",
    "method",
    "allocation",
    "indicator",
)


def resolve_document(document: str | None) -> str:
    """The document argument, or '-' when text is piped in."""
    if document is not None:
        return document
    if not sys.stdin.isatty():
        return "-"
    raise CakeError(
        "no document given",
        "pass a file path, or '-' to read stdin (e.g. cat notes.txt | cake summarize -)",
        exit_code=2,
    )


def run_and_report(request, as_json: bool, quiet: bool, output=None) -> None:
    """Run a task, stream its answer to stdout (or print JSON), and print the report on stderr;
    with `output`, also write the answer (or the JSON) to that file atomically once it is complete."""
    from cake_cli.cli.report import render
    from cake_cli.tasks.runner import Callbacks, run_task

    progress = StderrProgress(quiet or as_json)
    open_line = [False]  # answer text streamed to stdout since the last newline

    def on_text(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        open_line[0] = True

    def end_line() -> None:  # so a terminal shows the answer and what follows on separate lines
        if open_line[0]:
            sys.stdout.write("\n")
            sys.stdout.flush()
            open_line[0] = False

    def on_warning(message: str) -> None:
        end_line()
        progress.warning(message)

    callbacks = Callbacks(
        on_text=None if as_json else on_text, on_status=progress.status, on_layer=progress.layer, on_warning=on_warning
    )
    result = run_task(request, callbacks)
    if as_json:
        text = json.dumps(result.to_dict(), indent=2) + "\n"
        sys.stdout.write(text)
    else:
        end_line()
        text = result.answer + "\n"
    if output is not None:
        write_atomic(output, text)
    if as_json:
        return
    if not quiet:
        render(result, progress.console)


def task_request(
    task: str,
    document: str | None,
    fields: dict[str, str],
    *,
    model,
    budget,
    window,
    decode_policy,
    dtype,
    attention,
    device_map,
    max_new_tokens,
    temperature,
    top_p,
    seed,
    truncate,
    password,
    no_repeat_ngram=None,
    method="cake",
    allocation=None,
    indicator=None,
    at_line=None,
    max_lines=None,
):
    """Build a TaskRequest from the shared options (and the code-completion ones).

    Raises:
        UsageError: sampling or length options out of range.
    """
    from cake_cli.engine.config import SamplingConfig
    from cake_cli.errors import UsageError
    from cake_cli.tasks.runner import TaskRequest

    if temperature < 0 or not 0 < top_p <= 1:
        raise UsageError("--temperature must be >= 0 and --top-p in (0, 1]", "e.g. --temperature 0.7 --top-p 0.9")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    if no_repeat_ngram is not None and no_repeat_ngram < 0:
        raise UsageError(f"--no-repeat-ngram must be >= 0 (got {no_repeat_ngram})", "0 turns it off")
    return TaskRequest(
        task=task,
        document=resolve_document(document),
        fields=fields,
        model=model,
        budget=budget,
        window=window,
        decode_policy=decode_policy,
        dtype=dtype,
        attention=attention,
        device_map=device_map,
        max_new_tokens=max_new_tokens,
        sampling=SamplingConfig(temperature, top_p, seed),
        truncate=truncate,
        password=password,
        no_repeat_ngram_size=no_repeat_ngram,
        method=method,
        allocation=allocation,
        indicator=indicator,
        at_line=at_line,
        max_lines=max_lines,
    )


def run_command(task: str, document: str | None, fields: dict[str, str], params: dict, **extra) -> None:
    """The body of every task command: build the request, run it, report; known errors become one
    line on stderr and an exit code (1 runtime/input, 2 usage).

    Args:
        task: template name.
        document: the document argument (None: stdin when piped).
        fields: template fields, e.g. {"question": ...}.
        params: the command's parameters (its `locals()`); the SHARED_OPTIONS, `json_out` and
            `quiet` are read from it.
        extra: task-specific TaskRequest settings (at_line, max_lines).
    """
    with handled():
        request = task_request(task, document, fields, **{name: params[name] for name in SHARED_OPTIONS}, **extra)
        output = check_writable(params["output"]) if params["output"] else None  # fail before any model work
        run_and_report(request, params["json_out"], params["quiet"], output)


@app.command()
def summarize(
    document: o.Document = None,
    model: o.Model = None,
    budget: o.Budget = DEFAULT_BUDGET,
    window: o.Window = None,
    decode_policy: o.DecodePolicy = "fixed",
    dtype: o.Dtype = "auto",
    attention: o.Attention = "auto",
    device_map: o.DeviceMap = None,
    max_new_tokens: o.MaxNewTokens = None,
    temperature: o.Temperature = 0.0,
    top_p: o.TopP = 1.0,
    seed: o.Seed = None,
    no_repeat_ngram: o.NoRepeatNgram = None,
    truncate: o.Truncate = "middle",
    password: o.Password = None,
    method: o.Method = "cake",
    allocation: o.Allocation = None,
    indicator: o.Indicator = None,
    output: o.Output = None,
    json_out: o.Json = False,
    quiet: o.Quiet = False,
) -> None:
    """Summarize a long document under a KV-cache budget; the summary streams to stdout, the report to stderr."""
    run_command("summarize", document, {}, locals())


@app.command()
def qa(
    document: o.RequiredDocument,
    question: o.Question,
    model: o.Model = None,
    budget: o.Budget = DEFAULT_BUDGET,
    window: o.Window = None,
    decode_policy: o.DecodePolicy = "fixed",
    dtype: o.Dtype = "auto",
    attention: o.Attention = "auto",
    device_map: o.DeviceMap = None,
    max_new_tokens: o.MaxNewTokens = None,
    temperature: o.Temperature = 0.0,
    top_p: o.TopP = 1.0,
    seed: o.Seed = None,
    no_repeat_ngram: o.NoRepeatNgram = None,
    truncate: o.Truncate = "middle",
    password: o.Password = None,
    method: o.Method = "cake",
    allocation: o.Allocation = None,
    indicator: o.Indicator = None,
    output: o.Output = None,
    json_out: o.Json = False,
    quiet: o.Quiet = False,
) -> None:
    """Answer a question about a long document. The question ends the prompt, so CAKE keeps what it needs;
    only the document is ever truncated."""
    run_command("qa", document, {"question": question}, locals())


@app.command()
def needle(
    document: o.RequiredDocument,
    query: o.Query,
    model: o.Model = None,
    budget: o.Budget = DEFAULT_BUDGET,
    window: o.Window = None,
    decode_policy: o.DecodePolicy = "fixed",
    dtype: o.Dtype = "auto",
    attention: o.Attention = "auto",
    device_map: o.DeviceMap = None,
    max_new_tokens: o.MaxNewTokens = None,
    temperature: o.Temperature = 0.0,
    top_p: o.TopP = 1.0,
    seed: o.Seed = None,
    no_repeat_ngram: o.NoRepeatNgram = None,
    truncate: o.Truncate = "middle",
    password: o.Password = None,
    method: o.Method = "cake",
    allocation: o.Allocation = None,
    indicator: o.Indicator = None,
    output: o.Output = None,
    json_out: o.Json = False,
    quiet: o.Quiet = False,
) -> None:
    """Find and quote the passage that answers QUERY; the report (stderr) and --json say where it is
    (PDF page, character offset and depth), when the quote matches the document closely."""
    run_command("needle", document, {"query": query}, locals())


@app.command()
def complete(
    file: o.SourceFile = None,
    at: o.AtLine = None,
    lines: o.Lines = DEFAULT_LINES,
    model: o.Model = None,
    budget: o.Budget = DEFAULT_BUDGET,
    window: o.Window = None,
    decode_policy: o.DecodePolicy = "fixed",
    dtype: o.Dtype = "auto",
    attention: o.Attention = "auto",
    device_map: o.DeviceMap = None,
    max_new_tokens: o.MaxNewTokens = None,
    temperature: o.Temperature = 0.0,
    top_p: o.TopP = 1.0,
    seed: o.Seed = None,
    no_repeat_ngram: o.NoRepeatNgram = None,
    truncate: o.Truncate = "middle",
    password: o.Password = None,
    method: o.Method = "cake",
    allocation: o.Allocation = None,
    indicator: o.Indicator = None,
    output: o.Output = None,
    json_out: o.Json = False,
    quiet: o.Quiet = False,
) -> None:
    """Continue a source file (LongBench-style code completion): prints the next lines of code only, no prose.
    With --at LINE the context is the file before LINE."""
    run_command("complete", file, {}, locals(), at_line=at, max_lines=lines)
