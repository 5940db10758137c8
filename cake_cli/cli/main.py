"""The `cake` command line: the Typer app with every command registered."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer

import cake_cli.cli.commands.tasks  # noqa: F401 - registered first, so the task commands lead `cake --help`
from cake_cli.cli.app import OUTPUT_ERRNOS, app, handled, parse_error
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
from cake_cli.errors import EXIT_ERROR, CakeError

__all__ = ["app", "main", "run"]


def run(args: Sequence[str] | None = None) -> int:
    """Run `cake ARGS…` (default: `sys.argv[1:]`) and return its exit code, every error one line.

    The commands format their own errors (`handled`); what Typer rejects while parsing the command
    line (unknown option, bad value, missing argument) never reaches them, and Typer would print it
    as a usage line, a hint and a boxed panel. Running the app with `standalone_mode=False` makes
    Typer raise those instead: they are caught as the public `typer.TyperException` and printed in
    the same one-line shape (`parse_error`, exit 2). `-h` prints the full help as before.
    """
    try:
        code = app(args=args, standalone_mode=False)  # returns the exit code of a typer.Exit
    except typer.TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `cake` alone: the help is printed already
            return exc.exit_code
        return _exit_code(parse_error(exc))
    except typer.Abort:  # end of input at a prompt
        return _exit_code(CakeError("aborted", "nothing was done"))
    except OSError as exc:  # help or usage text written to a full disk or a closed pipe
        if exc.errno not in OUTPUT_ERRNOS:
            raise
        return _exit_code(exc)
    return code if isinstance(code, int) else 0


def _exit_code(error: BaseException) -> int:
    """Print `error` the way every command does (`handled`: one line on stderr) -> its exit code."""
    try:
        with handled():
            raise error
    except typer.Exit as done:
        return done.exit_code
    return EXIT_ERROR  # not reached: `handled` turns every error into typer.Exit


def main() -> None:
    """Console-script entry point (`cake`, `python -m cake_cli`)."""
    sys.exit(run())
