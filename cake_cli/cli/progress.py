"""Progress and status on stderr: prefill layer by layer, status lines, warnings.

Every message is escaped before rich sees it, so square brackets in file names, hints and model
output print as they are (rich would read `[v2]` as markup and drop it).
"""

from __future__ import annotations

import os
import sys

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


class StderrProgress:
    """Prefill progress (layer by layer) and status lines on stderr; `quiet` keeps warnings only."""

    def __init__(self, quiet: bool):
        self.console = stderr_console()
        self.quiet = quiet
        self.bar = Progress(
            TextColumn("prefill"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("layers"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.task = None

    def status(self, message: str) -> None:
        """A dim status line (not when quiet)."""
        if not self.quiet:
            self.console.print(f"[dim]{escape(message)}[/]", soft_wrap=True)

    def warning(self, message: str) -> None:
        """A warning line (also when quiet)."""
        self.console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)

    def layer(self, index: int, total: int) -> None:
        """Layer `index` of `total` finished its prefill (not shown when quiet)."""
        if self.quiet:
            return
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task("prefill", total=total)
        self.bar.update(self.task, completed=index + 1)
        if index + 1 == total:
            self.bar.stop()
