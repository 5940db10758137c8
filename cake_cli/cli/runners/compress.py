"""Compressed prefixes on the command line: `cake compress`, tasks on a .cake file, `qa -q … -q …`,
`cake chat`. Heavy (torch and the model): the commands import it only after every option, path and
.cake header is checked.

stdout carries only answers (or JSON); status, progress and the report go to stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

from cake_cli.cli.options import PrefillOptions, TaskOptions
from cake_cli.cli.progress import StderrProgress
from cake_cli.cli.report import render, render_compress, turn_line
from cake_cli.cli.stream import AnswerStream
from cake_cli.files import write_atomic
from cake_cli.tasks.planning import for_fields
from cake_cli.tasks.request import Callbacks, Plan
from cake_cli.tasks.results import RunResult, human_bytes
from cake_cli.tasks.runner import ready_model
from cake_cli.tasks.saved.compress import answer, compress, open_prefix
from cake_cli.tasks.saved.store import compress_result, save

EXIT_WORDS = {"exit", "quit", ":q"}


def _callbacks(opts: PrefillOptions, progress: StderrProgress, stream: AnswerStream | None) -> Callbacks:
    def on_warning(message: str) -> None:
        if stream is not None:
            stream.end_line()
        progress.warning(message)

    return Callbacks(
        on_text=stream.text if stream is not None else None,
        on_status=progress.status,
        on_layer=progress.layer,
        on_warning=on_warning,
    )


def compress_and_save(
    plan: Plan, opts: PrefillOptions, progress: StderrProgress, output: Path, scoring: str, bits: int = 16
) -> None:
    """`cake compress`: prefill + evict the document's prefix once, write it to `output` (.cake) with its
    keys and values at `bits`."""
    cb = _callbacks(opts, progress, None)
    ready = ready_model(plan.request, cb)
    compressed = compress(plan, cb, ready, scoring)
    size = save(compressed, output, bits)
    result = compress_result(compressed, output, size, ready.loaded.load_seconds)
    if opts.json_out:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    elif not opts.quiet:
        render_compress(result, progress.console)


def answer_heading(index: int, count: int, question: str) -> str:
    """The line before answer `index` (0-based) of `count` in plain text: '[2/3] QUESTION' (one line:
    the question's line breaks become spaces). A reader splits the answers at these exact lines, in
    order, so an answer may hold blank lines of its own; --json gives them as a list."""
    return f"[{index + 1}/{count}] {' '.join(question.split())}"


def answer_and_report(plans: list[Plan], opts: TaskOptions, progress: StderrProgress, output: Path | None) -> None:
    """Tasks on one compressed prefix: a .cake file's, or the document's compressed once here (qa Q1 Q2).
    Text: the answer on stdout; several: each after its `answer_heading` line, a blank line before the
    next heading; --json: one object (`results` for several)."""
    stream = AnswerStream()
    cb = _callbacks(opts, progress, None if opts.json_out else stream)
    compressed = open_prefix(plans[0], cb, ready_model(plans[0].request, cb))
    results: list[RunResult] = []
    several = len(plans) > 1  # several questions (qa Q1 Q2); else one task, maybe without a question
    asked = [p.request.fields["question"] for p in plans] if several else []
    headings = [answer_heading(i, len(asked), question) for i, question in enumerate(asked)]
    for index, plan in enumerate(plans):
        if several:
            progress.status(f"question {index + 1} of {len(plans)}: {plan.request.fields['question']}")
            if not opts.json_out:
                sys.stdout.write(("\n" if index else "") + headings[index] + "\n")
        results.append(answer(compressed, plan, cb))
        stream.end_line()
    if opts.json_out:
        data = results[0].to_dict() if len(results) == 1 else {"results": [r.to_dict() for r in results]}
        text = json.dumps(data, indent=2) + "\n"
        sys.stdout.write(text)
    elif not several:
        text = results[0].answer + "\n"
    else:
        text = "\n\n".join(f"{heading}\n{r.answer}" for heading, r in zip(headings, results)) + "\n"
    if output is not None:
        write_atomic(output, text, "--output")
    if not opts.json_out and not opts.quiet:
        for result in results:
            render(result, progress.console)


def questions(progress: StderrProgress) -> Iterator[str]:
    """Questions from stdin, one a line (blank lines skipped). On a terminal a prompt on stderr asks
    for each, and `exit`, `quit` or end of input (Ctrl-D) stops."""
    tty = sys.stdin.isatty()
    while True:
        if tty:
            progress.console.print("[bold cyan]question>[/] ", end="")
        line = sys.stdin.readline()
        if not line:
            return
        line = line.strip()
        if tty and line.lower() in EXIT_WORDS:
            return
        if line:
            yield line


def chat(plan: Plan, opts: TaskOptions, progress: StderrProgress, output: Path | None, scoring: str) -> None:
    """`cake chat`: question after question on one compressed document, answers streamed. Every turn
    starts again from the compressed document (`tasks.saved.compress`: memory never grows). --json: one
    JSON line per turn; `output` gets the transcript (answers, or the JSON lines)."""
    stream = AnswerStream()
    cb = _callbacks(opts, progress, None if opts.json_out else stream)
    compressed = open_prefix(plan, cb, ready_model(plan.request, cb), scoring)
    n, kv = len(compressed.meta.prefix_ids), human_bytes(compressed.state.kv_bytes)
    held = (
        f"kept whole ({kv} of KV cache; each question evicts a copy)"
        if compressed.meta.whole
        else f"compressed to {kv} of KV cache"
    )
    progress.status(f"ready: {n}-token document {held}; one question per line")
    transcript = []
    for turn, question in enumerate(questions(progress), start=1):
        result = answer(compressed, for_fields(plan, {"question": question}), cb)
        stream.end_line()
        if opts.json_out:
            line = json.dumps({"turn": turn, **result.to_dict()}, separators=(",", ":"))
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            transcript.append(line)
        else:
            transcript.append(f"Q: {question}\nA: {result.answer}\n")
            if not opts.quiet:
                progress.console.print(turn_line(turn, result), soft_wrap=True)
    if output is not None:
        write_atomic(output, "\n".join(transcript) + ("\n" if transcript else ""), "--output")
