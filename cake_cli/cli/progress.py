"""Progress and status on stderr: prefill layer by layer, status lines, warnings.

Every message is escaped before rich sees it, so square brackets in file names, hints and model
output print as they are (rich would read `[v2]` as markup and drop it).
"""

from __future__ import annotations

import os
import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

PIPED_WIDTH = 200  # columns when the output is a file or a pipe: wide enough that no table is cut


def console(stderr: bool = True) -> Console:
    """A rich console on stderr (or stdout, which carries only answers, tables and JSON). When that
    stream is not a terminal, it is PIPED_WIDTH columns wide (unless $COLUMNS says otherwise) and
    plain, so a redirected report or table is complete."""
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, highlight=False, width=PIPED_WIDTH if piped else None)


def stderr_console() -> Console:
    """`console()` on stderr."""
    return console(stderr=True)


LINE_SECONDS = 10.0  # a piped progress line at most this often (plus every new label and the end)


class LineProgress:
    """What a rich Progress shows, as plain lines, for a stderr that is a file or a pipe (where a
    live bar shows nothing until it ends): a line when a task's label changes, when it finishes,
    and otherwise at most every LINE_SECONDS. Same calls as rich's Progress."""

    def __init__(self, console: Console, label: str = "", disable: bool = False):
        self.console, self.label, self.disable = console, label, disable
        self.tasks: dict[int, dict] = {}

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Nothing to start (rich's API)."""

    def stop(self) -> None:
        """Nothing to stop: every line is printed already (rich's API)."""

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **fields) -> int:
        """A new task (its id); prints its first line."""
        task_id = len(self.tasks)
        self.tasks[task_id] = dict(description=description, total=total, completed=completed, fields=fields)
        self._print(task_id)
        return task_id

    def advance(self, task_id: int, advance: float = 1) -> None:
        """One step (or `advance`) done."""
        self.update(task_id, advance=advance)

    def update(self, task_id: int, *, description=None, total=None, completed=None, advance=None, **fields):
        """rich's Progress.update: prints when the label changes, at the end, or LINE_SECONDS after the last line."""
        task = self.tasks[task_id]
        relabelled = description is not None and description != task["description"]
        task["description"] = task["description"] if description is None else description
        task["total"] = task["total"] if total is None else total
        task["completed"] = (task["completed"] if completed is None else completed) + (advance or 0)
        task["fields"].update(fields)
        finished = task["total"] is not None and task["completed"] >= task["total"]
        if relabelled or finished or time.monotonic() - task["printed"] >= LINE_SECONDS:
            self._print(task_id)

    def _print(self, task_id: int) -> None:
        task = self.tasks[task_id]
        task["printed"] = time.monotonic()
        if self.disable:
            return
        done = f"{task['completed']:g}" + (f"/{task['total']:g}" if task["total"] is not None else "")
        extra = "".join(f" · {key} {value}" for key, value in task["fields"].items())
        head = f"{self.label} " if self.label else ""
        self.console.print(f"[dim]{escape(head + task['description'])}: {done}{escape(extra)}[/]", soft_wrap=True)


def live_progress(console: Console, *columns, label: str = "", disable: bool = False) -> Progress | LineProgress:
    """A rich Progress with `columns` on a terminal; `LineProgress` (plain lines) when the console
    is a file or a pipe. `label` prefixes the plain lines (the bar's own static text)."""
    if not console.is_terminal:
        return LineProgress(console, label, disable)
    return Progress(*columns, console=console, transient=True, disable=disable)


def clock(seconds: float) -> str:
    """12.3 -> '0:12', 3725 -> '1:02:05' (what rich's time columns show)."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class StderrProgress:
    """Prefill progress (layer by layer, with the time left) and status lines on stderr; `quiet`
    keeps warnings only. Every prefill gets the same bar: a task's, `cake compress`'s, the document
    prefix of `qa` with several questions and of `cake chat`."""

    def __init__(self, quiet: bool):
        self.console = stderr_console()
        self.quiet = quiet
        self.bar: Progress | LineProgress | None = None  # the running prefill's
        self.task = None
        self.first_done = 0.0  # time.monotonic() when its first layer finished

    def status(self, message: str) -> None:
        """A dim status line (not when quiet)."""
        if not self.quiet:
            self.console.print(f"[dim]{escape(message)}[/]", soft_wrap=True)

    def warning(self, message: str) -> None:
        """A warning line (also when quiet)."""
        self.console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)

    def layer(self, index: int, total: int) -> None:
        """Layer `index` of `total` finished its prefill (not shown when quiet). The time left is the
        mean time of the layers since the first, times the layers to go (layers cost about the same)."""
        if self.quiet:
            return
        now = time.monotonic()
        if self.bar is None or index == 0:
            if self.bar is not None:
                self.bar.stop()
            self.bar, self.first_done = self._new_bar(), now
            self.bar.start()
            self.task = self.bar.add_task("prefill layers", total=total, completed=index + 1, ETA="…")
        left = (now - self.first_done) / index * (total - index - 1) if index else None
        self.bar.update(self.task, completed=index + 1, ETA="…" if left is None else clock(left))
        if index + 1 == total:
            self.bar.stop()
            self.bar = None

    def _new_bar(self) -> Progress | LineProgress:
        return live_progress(
            self.console,
            TextColumn("prefill"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("layers"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[ETA]}"),
        )
