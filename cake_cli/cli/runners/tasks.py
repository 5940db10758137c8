"""`cake summarize|qa|needle|complete` after their options were checked: run the plans (torch and
the model load here) and show what they produced; the heavy half of `cli.commands.tasks`."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from cake_cli.cli.options import PrefillOptions, TaskOptions
from cake_cli.cli.progress import StderrProgress
from cake_cli.cli.report import render
from cake_cli.cli.stream import AnswerStream
from cake_cli.files import write_atomic
from cake_cli.tasks import pipeline
from cake_cli.tasks.request import Callbacks, Plan
from cake_cli.tasks.results import RunResult
from cake_cli.tasks.runner import ready_model


def callbacks(opts: PrefillOptions, progress: StderrProgress, stream: AnswerStream | None) -> Callbacks:
    """The CLI's hooks into the pipeline: answer text to `stream` (None: --json, nothing streamed), status and
    prefill layers to stderr, warnings on a line of their own."""

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


def answer_heading(index: int, count: int, question: str) -> str:
    """The line before answer `index` (0-based) of `count` in plain text: '[2/3] QUESTION' (one line:
    the question's line breaks become spaces). A reader splits the answers at these exact lines, in
    order, so an answer may hold blank lines of its own; --json gives them as a list."""
    return f"[{index + 1}/{count}] {' '.join(question.split())}"


def run_and_report(plans: list[Plan], opts: TaskOptions, progress: StderrProgress, output: Path | None) -> None:
    """Run the plans on one model (`tasks.pipeline`) and report: one task prefills its own prompt; a .cake input
    or several questions (qa Q1 Q2) continue one compressed prefix (the file's, or the document's compressed once
    here). Text: the answer streams to stdout; several: each after its `answer_heading` line, a blank line before
    the next heading; --json: one object (`results` for several). With `output`, the answer (or the JSON) is also
    written to that file atomically once complete; the report goes to stderr."""
    stream = AnswerStream()
    cb = callbacks(opts, progress, None if opts.json_out else stream)
    ready = ready_model(plans[0].request, cb)
    shared = len(plans) > 1 or plans[0].saved is not None
    prefix = pipeline.open_prefix(ready, plans[0], cb) if shared else pipeline.FRESH
    results: list[RunResult] = []
    several = len(plans) > 1  # several questions (qa Q1 Q2); else one task, maybe without a question
    asked = [p.request.fields["question"] for p in plans] if several else []
    headings = [answer_heading(i, len(asked), question) for i, question in enumerate(asked)]
    for index, plan in enumerate(plans):
        if several:
            progress.status(f"question {index + 1} of {len(plans)}: {plan.request.fields['question']}")
            if not opts.json_out:
                sys.stdout.write(("\n" if index else "") + headings[index] + "\n")
        asking = cb
        if several:  # a warning names its question: "[2/3] unsupported answer: …"
            asking = replace(
                cb, on_warning=lambda message, at=index: cb.on_warning(f"[{at + 1}/{len(plans)}] {message}")
            )
        results.append(pipeline.run(ready, plan, prefix, asking))
        stream.end_line()
    if opts.json_out:
        data = results[0].to_dict() if len(results) == 1 else {"results": [r.to_dict() for r in results]}
        text = json.dumps(data, indent=2) + "\n"
        sys.stdout.write(text)
    elif not several:
        text = results[0].printed + "\n"
    else:
        text = "\n\n".join(f"{heading}\n{r.printed}" for heading, r in zip(headings, results)) + "\n"
    if output is not None:
        write_atomic(output, text, "--output")
    if not opts.json_out and not opts.quiet:
        for result in results:
            render(result, progress.console)
