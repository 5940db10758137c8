"""Running a checked batch and showing it: the progress bar and summary of `cake batch` (stderr),
its --json summary (stdout). Imported by the command only after every option and row is checked."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from cake_cli.batch.driver import BatchSummary, make_executor, run_rows
from cake_cli.batch.output import compact, read_results
from cake_cli.batch.rows import BatchRow
from cake_cli.cli.options import TaskOptions
from cake_cli.cli.progress import LineProgress, StderrProgress, live_progress
from cake_cli.files import LineAppender
from cake_cli.tasks.request import TaskRequest


def run_and_report(
    base: TaskRequest,
    rows: list[BatchRow],
    duplicates: int,
    output: Path,
    opts: TaskOptions,
    executor_options: tuple[int | None, int | None, str | None, bool],
) -> int:
    """Run the rows of INPUT not yet in `output` and report; returns the exit code (0: every row of
    INPUT has a successful line in `output`, else 1).

    Raises:
        CakeError: the output is another run's or not a results file; a model cannot load; no worker left.
    """
    progress = StderrProgress(opts.quiet)
    with LineAppender(output, "--output") as appender:
        if appender.cut_bytes:
            progress.warning(f"cut an unfinished last line ({appender.cut_bytes} bytes) left by an interrupted run")
        done = read_results(output)
        todo = [row for row in rows if done.get(row.key) is not True]  # new rows and failed ones again
        failed_before = sum(1 for row in rows if done.get(row.key) is False)
        summary = BatchSummary(str(output), len(rows), len(rows) - len(todo), failed_before)
        if duplicates:
            progress.warning(f"{duplicates} repeated rows of INPUT (same document and fields) run once")
        if summary.skipped:
            progress.status(f"{summary.skipped} of {len(rows)} rows are already in {output}: skipped")
        if failed_before:
            progress.status(f"{failed_before} rows that failed before run again")
        if todo:
            _run(base, todo, summary, appender, progress, executor_options)
        replaced = compact(output)  # still holding the file: one line per key for a reader
        if replaced:
            progress.status(f"{output}: {replaced} old lines of rows run again replaced (one line per row)")
    if opts.json_out:
        sys.stdout.write(json.dumps(summary.to_dict(), indent=2) + "\n")
    if not opts.quiet:
        progress.console.print(_summary_line(summary), soft_wrap=True)
    return 0 if summary.succeeded else 1


def _run(base, todo, summary: BatchSummary, appender: LineAppender, progress: StderrProgress, executor_options):
    """Start the workers, run `todo` with a progress bar, stop the workers (also on errors and Ctrl-C)."""
    workers, threads, ray, verbose = executor_options
    executor = make_executor(base, workers, threads, ray, progress.warning, verbose, len(todo))
    try:
        start = time.perf_counter()
        where = f"Ray ({ray})" if ray is not None else "this machine"
        progress.status(f"loading the model on {where} for {len(todo)} rows")
        infos = executor.start()
        summary.startup_seconds = time.perf_counter() - start
        summary.executor, summary.workers, summary.threads = executor.kind, executor.workers, executor.threads
        devices = sorted({str(info.get("device")) for info in infos})
        plural = "" if executor.threads == 1 else "s"
        progress.status(
            f"{len(infos)} worker(s) ready ({executor.kind}, {executor.threads} thread{plural} each, "
            f"{', '.join(devices)}) in {summary.startup_seconds:.1f} s"
        )
        bar = _bar(progress)
        with bar:
            task = bar.add_task("documents", total=summary.rows, completed=summary.skipped, failed=0, rate="0 tokens/s")

            def on_line(line: dict) -> None:
                if line["error"] is not None:
                    document, error = line["document"], line["error"]
                    progress.warning(error if document in error else f"{document}: {error}")
                rate = summary.tokens / summary.run_seconds if summary.run_seconds > 0 else 0.0
                bar.update(task, advance=1, failed=summary.failed, rate=f"{rate:,.0f} tokens/s")

            run_rows(todo, base, executor, appender.write_line, summary, on_line)
    finally:
        executor.close()


def _bar(progress: StderrProgress) -> Progress | LineProgress:
    """Documents done / total, failures, tokens/s (prompt + generated), elapsed and ETA."""
    return live_progress(
        progress.console,
        TextColumn("batch"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("documents · {task.fields[failed]} failed · {task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        label="batch",
        disable=progress.quiet,
    )


def _summary_line(s: BatchSummary) -> str:
    """One line on stderr: what ran, what failed, how fast, where the results are."""
    data = s.to_dict()
    parts = [f"{s.rows} rows: {s.done} run now ({s.failed} failed)"]
    if s.skipped:
        parts.append(f"{s.skipped} already done")
    if s.failed_before:
        parts.append(f"{s.failed_before} failed before, run again")
    if data["documents_per_hour"] is not None:  # only rows that succeeded make a rate
        parts.append(f"{data['documents_per_hour']:,.0f} documents/hour, {data['tokens_per_second']:,.0f} tokens/s")
    style = "green" if s.succeeded else "yellow"
    return f"[{style}]batch:[/] {escape(' · '.join(parts))} → {escape(s.output)}"
