"""The `cake batch` driver: the rows not yet in the output, checked here and run by an executor,
each finished line appended to the output as it arrives (the driver is its only writer).

A row is checked with `tasks.planning.plan` (its document read) in the driver; a row that fails
there (missing, empty, binary or scanned file, a blank field) gets its error line at once and no
worker. The others go to the executor (`batch_pool` here, `batch_ray` on Ray), at most one per
free worker, so a killed batch loses only the rows in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from cake_cli.batch.output import encode_line, failure_message, line_tokens, row_line
from cake_cli.batch.pool import RERUN_HINT, InlineExecutor, ProcessExecutor
from cake_cli.batch.ray_actors import RayExecutor
from cake_cli.batch.rows import BatchRow, key_options, row_request
from cake_cli.cores import capped_threads, usable_cores
from cake_cli.errors import CakeError
from cake_cli.tasks.planning import plan
from cake_cli.tasks.request import TaskRequest
from cake_cli.tasks.saved.request import check_global


@dataclass
class BatchSummary:
    """What a `cake batch` run did (`--json` prints it). Seconds are wall clock."""

    output: str
    rows: int  # rows in INPUT
    skipped: int  # already in the output with a successful line: not run again
    failed_before: int  # rows whose line in the output is an error: run again now
    done: int = 0  # rows finished by this run
    failed: int = 0  # of those, rows that failed
    tokens: int = 0  # prompt + generated tokens of this run's rows
    executor: str = ""  # inline | processes | ray
    workers: int = 0
    threads: int = 0  # torch threads per worker
    startup_seconds: float = 0.0  # until every worker had its model loaded
    run_seconds: float = 0.0  # from then until the last row was written

    @property
    def succeeded(self) -> bool:
        """Every row of INPUT has a successful line in the output (the exit code is 0)."""
        return self.failed == 0 and self.skipped + self.done == self.rows

    def to_dict(self) -> dict:
        """JSON-ready: the fields plus documents per hour and tokens per second of this run's
        successful rows (null when none succeeded: a rerun that only met failing rows again, or ran
        nothing, has no rate to show)."""
        data = asdict(self)
        ran = self.done - self.failed
        measured = ran > 0 and self.run_seconds > 0
        data.update(
            succeeded=self.succeeded,
            documents_per_hour=round(ran * 3600 / self.run_seconds, 2) if measured else None,
            tokens_per_second=round(self.tokens / self.run_seconds, 2) if measured else None,
        )
        return data


def make_executor(
    request: TaskRequest,
    workers: int | None,
    threads: int | None,
    ray_address: str | None,
    on_warning: Callable[[str], None] | None = None,
    verbose: bool = False,
    rows: int | None = None,
):
    """The executor for `--workers`, `--threads` and `--ray`. Locally: `workers` (default 1),
    torch threads = cores // workers unless `threads` (held to the usable cores, with a warning;
    one worker without `threads`: each row's threads follow the load, as a single document's do);
    on Ray see `ray_actors.ray_slots` (`verbose`: Ray's own logging on stderr; `rows`: how many
    will run, the most actors `--ray local` starts by default).

    Raises:
        CakeError: --ray without Ray installed.
    """
    if ray_address is not None:
        return RayExecutor(request, ray_address, workers, threads, on_warning, verbose, rows)
    threads, too_many = capped_threads(threads)
    if too_many and on_warning:
        on_warning(too_many)
    workers, follow_load = workers or 1, threads is None
    threads = threads or max(1, usable_cores() // workers)
    if workers == 1:  # alone on the machine: without --threads, every row follows the load (`tasks.threads`)
        return InlineExecutor(request, threads, follow_load)
    return ProcessExecutor(request, workers, threads, on_warning)


def run_rows(
    rows: list[BatchRow],
    base: TaskRequest,
    executor,
    write: Callable[[str], None],
    summary: BatchSummary,
    on_line: Callable[[dict], None] | None = None,
) -> None:
    """Check and run `rows` on a started executor; `write` each finished line as it arrives.

    Raises:
        CakeError: no worker is left (the rows not written run on a rerun).
    """
    todo = list(reversed(rows))
    in_flight, options = 0, key_options(base)
    start = time.perf_counter()
    while todo or in_flight:
        while todo and executor.free() > 0:
            row = todo.pop()
            try:
                checked = plan(row_request(base, row))
                check_global(checked)  # a task's own prefill cannot rank globally
            except Exception as exc:  # noqa: BLE001 - a bad row is recorded, the batch goes on
                _record(row_line(row, base.task, error=failure_message(exc)), options, write, summary, on_line)
                continue
            executor.submit(row, checked)
            in_flight += 1
        if in_flight == 0:
            if todo:
                raise CakeError(f"no worker is left to run the {len(todo)} remaining rows", RERUN_HINT)
            break
        _, line = executor.next()
        in_flight -= 1
        summary.run_seconds = time.perf_counter() - start
        _record(line, options, write, summary, on_line)
    summary.run_seconds = time.perf_counter() - start


def _record(line: dict, options: dict, write: Callable[[str], None], summary: BatchSummary, on_line) -> None:
    """Write a finished row's line (with the options it ran with) and count it."""
    line = {**line, "options": options}
    write(encode_line(line))
    summary.done += 1
    summary.failed += line["error"] is not None
    summary.tokens += line_tokens(line)
    if on_line:
        on_line(line)
