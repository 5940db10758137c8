"""The Typer application object, error handling and stderr progress shared by every command."""

from __future__ import annotations

import os
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from cake_cli.cli.options import FLAGS
from cake_cli.engine.config import ConfigError
from cake_cli.errors import EXIT_ERROR, EXIT_INTERRUPTED, CakeError, UsageError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Long-document tasks with a causal LM under a fixed KV-cache budget, using CAKE "
    "(cascading and adaptive KV cache eviction with layer preferences, ICLR 2025).",
)


def stderr_console() -> Console:
    """A rich console on stderr (stdout carries only answers and JSON)."""
    return Console(stderr=True, highlight=False)


@contextmanager
def handled():
    """Turn known errors into one line on stderr and an exit code (traceback only with CAKE_DEBUG=1)."""
    err = stderr_console()
    try:
        try:
            yield
        except ConfigError as exc:  # an engine setting: name it by its flag
            raise UsageError(*exc.render(FLAGS)) from exc
    except CakeError as exc:
        if os.environ.get("CAKE_DEBUG") == "1":
            raise
        err.print(f"[bold red]error:[/] {escape(exc.one_line())}", soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - last line of defence: one line, no traceback
        if os.environ.get("CAKE_DEBUG") == "1":
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        err.print(
            f"[bold red]internal error:[/] {type(exc).__name__}: {first} — rerun with CAKE_DEBUG=1 for "
            "the traceback and report it",
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_ERROR) from None


class StderrProgress:
    """Prefill progress (layer by layer) and status lines on stderr."""

    def __init__(self, quiet: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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
        if not self.quiet:
            self.console.print(f"[dim]{message}[/]")

    def warning(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/] {message}", soft_wrap=True)

    def layer(self, index: int, total: int) -> None:
        if self.quiet:
            return
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task("prefill", total=total)
        self.bar.update(self.task, completed=index + 1)
        if index + 1 == total:
            self.bar.stop()
