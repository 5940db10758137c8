"""The `cake` command line: the Typer app with every command registered."""

from __future__ import annotations

import cake_cli.cli.commands.tasks  # noqa: F401 - registered first, so the task commands lead `cake --help`
from cake_cli.cli.app import app
from cake_cli.cli.commands import (  # noqa: F401 - registers the other commands
    batch,
    bench,
    bench_cache,
    bench_speed,
    compress,
    info,
    inspect_layers,
)

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    app()
