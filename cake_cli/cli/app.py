"""The Typer application object and the error handling every command shares."""

from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.markup import escape

from cake_cli import __version__
from cake_cli.cli.options import FLAGS
from cake_cli.cli.progress import stderr_console
from cake_cli.engine.config import ConfigError
from cake_cli.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, CakeError, UsageError, did_you_mean, first_line

# Markdown help: docstring lines are joined, so a description never breaks mid-sentence where the
# source code wrapped it (rich markup would also eat square brackets).
HELP_STYLE = {"rich_markup_mode": "markdown"}
app = typer.Typer(
    **HELP_STYLE,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command's, too (click passes it down)
    help="Long-document tasks with a causal LM under a fixed KV-cache budget, using CAKE "
    "(cascading and adaptive KV cache eviction with layer preferences, ICLR 2025).",
)


def _print_version(asked: bool) -> None:
    if asked:
        with handled():
            typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", metavar="", is_eager=True, callback=_print_version, help="Print the version."),
    ] = False,
) -> None:
    """The options of `cake` itself (before any command): --version, --help."""


def _no_type_column() -> None:
    """Typer prints a type after every argument (`<str>`) and after --help (`<bool>`), though our
    metavars already say what each takes and a flag takes no value: show neither."""
    plain_display = typer.core.TyperOption.display_type_rich

    def option_type(self, ctx):
        return None if self.is_flag else plain_display(self, ctx)

    typer.core.TyperArgument.display_type_rich = lambda self, ctx: None
    typer.core.TyperOption.display_type_rich = option_type


_no_type_column()


# an output that cannot take what is written: full disk or quota, file too large, reader gone (`| head`)
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EPIPE})


def output_error(exc: OSError) -> CakeError:
    """The one-line error of a write that failed (`OUTPUT_ERRNOS`): stdout's when the error names no
    file (every file cake-cli writes itself fails as a CakeError before this)."""
    what = "stdout" if exc.filename is None else str(exc.filename)
    hint = "the program reading it stopped" if exc.errno == errno.EPIPE else "free space there, or write elsewhere"
    return CakeError(f"cannot write to {what}: {exc.strerror or os.strerror(exc.errno)}", hint)


def _option_names(ctx) -> list[str]:
    """The long option names (`--budget`, …) of the command `ctx` parses, for "did you mean"."""
    if ctx is None:
        return []
    names = [*ctx.help_option_names]
    for param in ctx.command.params:
        names += [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
    return sorted({name for name in names if name.startswith("--")})


def parse_error(exc: typer.TyperException) -> CakeError:
    """The one-line error of a command line Typer could not parse: an unknown option (with "did you
    mean" over the command's own options), a bad option value, a missing argument, an unknown
    command. Usage errors (Typer's exit code 2) stay exit 2; the hint names the command's help.

    Typer raises these while parsing, before any command runs, so `handled` never sees them; they
    reach here from `cake_cli.cli.main.run`, which runs the app with `standalone_mode=False`. Only
    public attributes are read: `TyperException.format_message()` and `exit_code`, and the `ctx`
    (context) a usage error carries.
    """
    ctx = getattr(exc, "ctx", None)
    message = " ".join(exc.format_message().split()).rstrip(".").replace(". Did you mean", "; did you mean")
    message = message[:1].lower() + message[1:]
    option = getattr(exc, "option_name", None)
    if option and option.startswith("--"):  # an unknown option: suggest from the command's own options
        message = f"no such option {option}{did_you_mean(option, _option_names(ctx), n=1)}"
    if exc.exit_code != EXIT_USAGE:
        return CakeError(message, exit_code=exc.exit_code)
    where = ctx.command_path if ctx is not None else "cake"
    return UsageError(message, f"see '{where} --help'")


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a real file (tests' captured stdout): nothing buffered to lose
        pass


@contextmanager
def handled():
    """Turn known errors into one line on stderr and an exit code (traceback only with CAKE_DEBUG=1).
    stdout is flushed before the block ends, so a full disk or a closed pipe is one of them."""
    err = stderr_console()
    try:
        try:
            yield
            sys.stdout.flush()  # what is still buffered fails here, not in the interpreter's exit
        except ConfigError as exc:  # an engine setting: name it by its flag
            message, hint = exc.render(FLAGS)
            if exc.name is not None:
                message += did_you_mean(exc.name, exc.valid)
            raise UsageError(message, hint) from exc
        except OSError as exc:
            if exc.errno not in OUTPUT_ERRNOS:
                raise
            _silence_stdout()
            raise output_error(exc) from exc
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
