"""Compressed prefixes on the command line: `cake compress` and `cake chat` (tasks on a .cake file and
`qa DOC Q1 Q2 …` run through `cli.runners.tasks`, on the same pipeline). Heavy (torch and the model): the
commands import it only after every option, path and .cake header is checked.

stdout carries only answers (or JSON); status, progress and the report go to stderr.

`cake chat` on a terminal: the prompt has line editing and history (the standard library's
readline); Ctrl-C while an answer streams stops that answer and asks for the next question (the
compressed document is kept); Ctrl-C at the prompt leaves with exit code 130, Ctrl-D or `exit`
with 0. The transcript (`-o`) is written either way.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

try:
    import readline  # noqa: F401 - importing it gives input() line editing and history on a terminal
except ImportError:  # not on every platform: input() still works, without editing
    readline = None

from cake_cli.cli.options import PrefillOptions, TaskOptions
from cake_cli.cli.progress import StderrProgress
from cake_cli.cli.report import render_compress, turn_line
from cake_cli.cli.runners.tasks import callbacks
from cake_cli.cli.stream import AnswerStream
from cake_cli.files import write_atomic
from cake_cli.tasks import pipeline
from cake_cli.tasks.planning import for_fields
from cake_cli.tasks.request import Plan
from cake_cli.tasks.results import RunResult, human_bytes
from cake_cli.tasks.runner import ready_model
from cake_cli.tasks.saved.store import compress_result, file_bits, held_quantized

EXIT_WORDS = {"exit", "quit", ":q"}


def compress_and_save(
    plan: Plan, opts: PrefillOptions, progress: StderrProgress, output: Path, scoring: str, bits: int | None = None
) -> None:
    """`cake compress`: prefill + evict the document's prefix once, write it to `output` (.cake) with its
    keys and values at `bits` (None: the model profile's `kv_bits`, `store.file_bits`)."""
    cb = callbacks(opts, progress, None)
    ready = ready_model(plan.request, cb)
    bits, reason = file_bits(bits, ready.loaded.profile)
    prefix = pipeline.open_prefix(ready, plan, cb, scoring)
    size = pipeline.save_prefix(prefix, output, bits)
    compressed = prefix.compressed
    result = compress_result(compressed, output, size, ready.loaded.load_seconds, reason)
    if opts.json_out:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    elif not opts.quiet:
        render_compress(result, progress.console)


PROMPT = "question> "


def terminal() -> tuple[bool, bool]:
    """(stdin is a terminal, stdout is a terminal)."""
    return sys.stdin.isatty(), sys.stdout.isatty()


def read_line(progress: StderrProgress) -> str | None:
    """One line of stdin; None at end of input. On a terminal the prompt asks for it: through
    readline's `input()` when stdout is the terminal too (line editing, history), else on stderr
    (stdout carries only answers); Ctrl-D there ends the prompt's line before leaving.

    Raises:
        KeyboardInterrupt: Ctrl-C at the prompt.
    """
    stdin_tty, stdout_tty = terminal()
    if not stdin_tty:
        return sys.stdin.readline() or None
    try:
        if stdout_tty:
            return input(PROMPT)
        progress.console.print(f"[bold cyan]{PROMPT}[/]", end="")
        line = sys.stdin.readline()
        if line:
            return line
    except EOFError:
        pass
    progress.console.print()  # Ctrl-D: the shell's prompt starts on a line of its own
    return None


def questions(progress: StderrProgress) -> Iterator[str]:
    """Questions from stdin, one a line (blank lines skipped), until the end of input (Ctrl-D) or a
    line `exit`, `quit` or `:q`, typed or piped (`read_line`)."""
    while (line := read_line(progress)) is not None:
        line = line.strip()
        if line.lower() in EXIT_WORDS:
            return
        if line:
            yield line


def chat(
    plan: Plan, opts: TaskOptions, progress: StderrProgress, output: Path | None, scoring: str, bits: int = 16
) -> None:
    """`cake chat`: question after question on one compressed document, answers streamed. Every turn
    starts again from the compressed document (`tasks.saved.compress`: memory never grows). --json: one
    JSON line per answered turn; `output` gets the transcript (answers, or the JSON lines), also when
    Ctrl-C at the prompt leaves. Ctrl-C during an answer stops it only (see the module docstring). A document
    compressed now is held at `bits` in memory (`tasks.saved.store.held_quantized`).

    Raises:
        KeyboardInterrupt: Ctrl-C at the prompt (exit code 130), after the transcript is written.
    """
    stream = AnswerStream()
    cb = callbacks(opts, progress, None if opts.json_out else stream)
    ready = ready_model(plan.request, cb)
    compressed = held_quantized(pipeline.open_prefix(ready, plan, cb, scoring).compressed, bits)
    n, kv = len(compressed.meta.prefix_ids), human_bytes(compressed.state.kv_bytes)
    held = (
        f"kept whole ({kv} of KV cache; each question evicts a copy)"
        if compressed.meta.whole
        else f"compressed to {kv} of KV cache"
    )
    leave = "Ctrl-C stops an answer; Ctrl-D, exit or Ctrl-C at the prompt leaves" if terminal()[0] else ""
    progress.status(f"ready: {n}-token document {held}; one question per line" + (f" ({leave})" if leave else ""))
    transcript: list[str] = []
    try:
        for question in questions(progress):
            try:
                result = pipeline.run(ready, for_fields(plan, {"question": question}), pipeline.Prefix(compressed), cb)
            except KeyboardInterrupt:  # stop this answer only; the compressed document is untouched
                stream.end_line()
                progress.console.print(
                    "[yellow]answer stopped[/] (Ctrl-C): ask the next question; Ctrl-C again at the prompt or "
                    "Ctrl-D leaves",
                    soft_wrap=True,
                )
                continue
            stream.end_line()
            _record_turn(len(transcript) + 1, question, result, opts, progress, transcript)
    except KeyboardInterrupt:  # at the prompt: leave, keeping what was answered
        stream.end_line()
        progress.console.print()
        _write_transcript(output, transcript)
        raise
    _write_transcript(output, transcript)


def _record_turn(turn: int, question: str, result: RunResult, opts: TaskOptions, progress, transcript) -> None:
    """Print a finished turn's JSON line (--json) or its numbers (stderr), and keep it for the transcript."""
    if opts.json_out:
        line = json.dumps({"turn": turn, **result.to_dict()}, separators=(",", ":"))
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        transcript.append(line)
    else:
        transcript.append(f"Q: {question}\nA: {result.printed}\n")  # a blank line between two turns
        if not opts.quiet:
            progress.console.print(turn_line(turn, result), soft_wrap=True)


def _write_transcript(output: Path | None, transcript: list[str]) -> None:
    """The turns (text ones end in their own newline, JSON lines do not), one newline at the end."""
    if output is not None:
        write_atomic(output, "\n".join(transcript).rstrip("\n") + ("\n" if transcript else ""), "--output")
