"""The `cake` command line: the Typer app with every command registered."""

from __future__ import annotations

import sys

import typer

import cake_cli.cli.commands.tasks  # noqa: F401 - registered first, so the task commands lead `cake --help`
from cake_cli.cli.app import OUTPUT_ERRNOS, app, handled
from cake_cli.cli.commands import (  # noqa: F401 - registers the other commands
    batch,
    bench,
    bench_cache,
    bench_speed,
    compress,
    info,
    inspect_layers,
    serve,
)

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point. Help and usage texts are written by Typer outside the commands'
    `handled` blocks: a full disk or closed pipe there is the same one-line error (exit 1)."""
    try:
        app()
    except OSError as exc:
        if exc.errno not in OUTPUT_ERRNOS:
            raise
        try:
            with handled():  # the commands' own path: stdout silenced, one line, exit 1
                raise
        except typer.Exit as done:
            sys.exit(done.exit_code)
