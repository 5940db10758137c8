"""`cake batch TASK INPUT -o results.jsonl`: one task over many documents, resumable.

Everything cheap is checked here before torch loads (`batch.rows`): the options once for every
row, the output file, INPUT's rows and keys, and that Ray is installed for --ray. `cli.runners.batch`
then reads what the output already holds, runs the other rows and shows the progress.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Annotated

import typer

from cake_cli.batch.output import check_same_options
from cake_cli.batch.rows import TASKS, batch_rows, check_options, key_options, parse_fields
from cake_cli.cli.app import app, handled
from cake_cli.cli.commands.tasks import task_request
from cake_cli.cli.options import TaskOptions, with_options
from cake_cli.errors import CakeError, UsageError
from cake_cli.files import check_writable

Task = Annotated[str, typer.Argument(help=f"The task: {', '.join(TASKS)}.", metavar="TASK")]
Input = Annotated[
    str,
    typer.Argument(
        help="A folder of documents (see --pattern), or a manifest: .jsonl or .csv rows with a 'document' path "
        "(relative to the manifest's folder) plus the task's fields, e.g. 'question'.",
        metavar="INPUT",
        show_default=False,
    ),
]
Pattern = Annotated[
    str,
    typer.Option(
        "--pattern",
        "-p",
        metavar="GLOB",
        help="Files of a folder INPUT to run, e.g. `*.pdf` or `**/*.txt` (hidden files are skipped).",
    ),
]
Field = Annotated[
    list[str] | None,
    typer.Option(
        "--field",
        "-f",
        metavar="NAME=VALUE",
        show_default=False,
        help="A task field for every row, e.g. --field question='Who signed?' (a manifest's column wins). Repeatable.",
    ),
]
Workers = Annotated[
    int | None,
    typer.Option(
        "--workers",
        "-j",
        metavar="N",
        show_default=False,
        help="Workers, each loading the model once: N processes on this machine (default 1, in this process); "
        "with --ray, N actors (default one per GPU; else with --ray local one per usable core, at most one per "
        "row, and on a cluster one per node).",
    ),
]
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        metavar="N",
        show_default=False,
        help="Torch threads per worker (default: one worker follows the load as a single document does; N "
        "workers get this machine's cores // N each; on Ray: the node's CPUs // actors per node, 1 on a GPU).",
    ),
]
Ray = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS",
        show_default=False,
        help="Run the rows on Ray (pip install 'cake-cli[ray]'): 'local' starts a Ray instance here for the batch; "
        "'auto', HOST:PORT or ray://HOST:10001 join a running cluster. Results stream back to the one output file.",
    ),
]
BatchOutput = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        show_default=False,
        help="The results, JSON Lines: one line per row (its --json result, or its one-line error), appended and "
        "fsynced as each row finishes. A rerun skips the rows already in it and replaces the lines of rows it runs "
        "again; a file of rows made with other options is refused.",
    ),
]
Verbose = Annotated[
    bool,
    typer.Option("--verbose", metavar="", help="With --ray: show Ray's own logging and the actors' output on stderr."),
]
BatchJson = Annotated[
    bool, typer.Option("--json", metavar="", help="Print a JSON summary of the batch to stdout (rows, failed, rates).")
]


@dataclasses.dataclass(frozen=True)
class BatchOptions(TaskOptions):
    """TaskOptions with --threads per worker, a required JSONL --output and a --json summary."""

    threads: Threads = None  # per worker here (TaskOptions': prefill on idle cores, decode on one)
    output: BatchOutput = ...  # Ellipsis: Typer makes the option required
    json_out: BatchJson = False


@app.command()
@with_options(BatchOptions)
def batch(
    task: Task,
    input: Input,
    pattern: Pattern = "*",
    field: Field = None,
    workers: Workers = None,
    ray: Ray = None,
    verbose: Verbose = False,
    *,
    opts: BatchOptions,
) -> None:
    """Run TASK on every document of INPUT (a folder or a .jsonl/.csv manifest), loading the model once per
    worker; each row's answer and report are appended to --output as one JSON line as soon as it finishes.

    Resumable: a rerun skips the rows already in the output (same document, fields and task options) and runs
    the failed ones again; at the end the file holds one line per row. One output holds one set of task options:
    a rerun with others is refused (start a new file). A row that fails (empty, binary or scanned file, …) gets
    its one-line error and the batch goes on. Progress on
    stderr. Exit code 0 when every row of INPUT has a successful line in the output; 1 when any row failed
    or could not run (rerun to finish); 2 for a usage error.
    """
    with handled():
        threads = opts.threads
        for flag, value in (("--workers", workers), ("--threads", threads)):
            if value is not None and value < 1:
                raise UsageError(f"{flag} must be at least 1 (got {value})")
        fields = parse_fields(field or [])
        base = task_request(task, "", {}, dataclasses.replace(opts, threads=None))  # threads: the executor's
        template = check_options(base)
        output = check_writable(opts.output, "--output")
        if Path(input).expanduser().resolve() == output.resolve():
            raise UsageError("--output is the INPUT manifest", "choose another --output file, e.g. results.jsonl")
        if ray is not None and importlib.util.find_spec("ray") is None:
            raise CakeError("--ray needs Ray, which is not installed", "pip install 'cake-cli[ray]'")
        check_same_options(output, key_options(base))  # one file, one set of options
        rows, duplicates = batch_rows(input, base, template, pattern, fields, output)
        from cake_cli.cli.runners import batch as batch_run  # noqa: PLC0415 - torch loads after the checks

        code = batch_run.run_and_report(base, rows, duplicates, output, opts, (workers, threads, ray, verbose))
    raise typer.Exit(code)
