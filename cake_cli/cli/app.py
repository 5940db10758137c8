"""The Typer application object and the error handling every command shares."""

from __future__ import annotations

import os
from contextlib import contextmanager

import typer
from rich.markup import escape

from cake_cli.cli.options import FLAGS
from cake_cli.cli.progress import stderr_console
from cake_cli.engine.config import ConfigError
from cake_cli.errors import EXIT_ERROR, EXIT_INTERRUPTED, CakeError, UsageError, first_line

# Markdown help: docstring lines are joined, so a description never breaks mid-sentence where the
# source code wrapped it (rich markup would also eat square brackets).
HELP_STYLE = {"rich_markup_mode": "markdown"}
app = typer.Typer(
    **HELP_STYLE,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Long-document tasks with a causal LM under a fixed KV-cache budget, using CAKE "
    "(cascading and adaptive KV cache eviction with layer preferences, ICLR 2025).",
)


def _no_type_column() -> None:
    """Typer prints a type after every argument (`<str>`) and after --help (`<bool>`), though our
    metavars already say what each takes and a flag takes no value: show neither."""
    plain_display = typer.core.TyperOption.display_type_rich

    def option_type(self, ctx):
        return None if self.is_flag else plain_display(self, ctx)

    typer.core.TyperArgument.display_type_rich = lambda self, ctx: None
    typer.core.TyperOption.display_type_rich = option_type


_no_type_column()


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
        err.print(
            f"[bold red]internal error:[/] {type(exc).__name__}: {escape(first_line(exc))} — rerun with "
            "CAKE_DEBUG=1 for the traceback and report it",
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_ERROR) from None
