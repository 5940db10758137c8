"""`cake summarize|qa|needle|complete` after their options were checked: run the plans (torch and
the model load here) and show what they produced; the heavy half of `cli.commands.tasks`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cake_cli.cli.options import TaskOptions
from cake_cli.cli.progress import StderrProgress
from cake_cli.cli.report import render
from cake_cli.cli.runners import compress as sessions
from cake_cli.cli.stream import AnswerStream
from cake_cli.files import write_atomic
from cake_cli.tasks import pipeline
from cake_cli.tasks.request import Callbacks, Plan
from cake_cli.tasks.runner import ready_model


def run_and_report(plans: list[Plan], opts: TaskOptions, progress: StderrProgress, output: Path | None) -> None:
    """Run a task, stream its answer to stdout (or print JSON), print the report on stderr; with
    `output`, also write the answer (or the JSON) to that file atomically once it is complete.
    Several plans (qa -q) or a .cake input continue a compressed prefix (`cli.runners.compress`)."""
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
    result = pipeline.run(ready_model(plan.request, callbacks), plan, pipeline.FRESH, callbacks)
    if opts.json_out:
        text = json.dumps(result.to_dict(), indent=2) + "\n"
        sys.stdout.write(text)
    else:
        stream.end_line()
        text = result.printed + "\n"
    if output is not None:
        write_atomic(output, text, "--output")
    if not opts.json_out and not opts.quiet:
        render(result, progress.console)
