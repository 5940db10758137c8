"""Running checked plans and showing what they produced: the one CLI module that loads torch and
the model (the commands import it only after every option, path and document is checked)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cake_cli.cli import sessions
from cake_cli.cli.options import PrefillOptions, TaskOptions
from cake_cli.cli.progress import StderrProgress, console
from cake_cli.cli.report import render, render_inspect
from cake_cli.cli.stream import AnswerStream
from cake_cli.files import write_atomic
from cake_cli.tasks.inspect import inspect_layers
from cake_cli.tasks.request import Callbacks, Plan
from cake_cli.tasks.runner import run_task


def run_and_report(plans: list[Plan], opts: TaskOptions, progress: StderrProgress, output: Path | None) -> None:
    """Run a task, stream its answer to stdout (or print JSON), print the report on stderr; with
    `output`, also write the answer (or the JSON) to that file atomically once it is complete.
    Several plans (qa -q) or a .cake input continue a compressed prefix (`cli.sessions`)."""
    if len(plans) > 1 or plans[0].saved is not None:
        sessions.answer_and_report(plans, opts, progress, output)
        return
    plan = plans[0]
    stream = AnswerStream()

    def on_warning(message: str) -> None:
        stream.end_line()
        progress.warning(message)

    callbacks = Callbacks(
        on_text=None if opts.json_out else stream.text,
        on_status=progress.status,
        on_layer=progress.layer,
        on_warning=on_warning,
    )
    result = run_task(plan, callbacks)
    if opts.json_out:
        text = json.dumps(result.to_dict(), indent=2) + "\n"
        sys.stdout.write(text)
    else:
        stream.end_line()
        text = result.answer + "\n"
    if output is not None:
        write_atomic(output, text, "--output")
    if not opts.json_out and not opts.quiet:
        render(result, progress.console)


def inspect_and_show(plan: Plan, opts: PrefillOptions, progress: StderrProgress) -> None:
    """Prefill only and show the layer table on stdout (or one JSON object)."""
    result = inspect_layers(
        plan, Callbacks(on_status=progress.status, on_layer=progress.layer, on_warning=progress.warning)
    )
    if opts.json_out:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        render_inspect(result, console(stderr=False))
