"""The `cake` command line: the Typer app with every command registered."""

from __future__ import annotations

from cake_cli.app import app
from cake_cli.commands import bench, info, tasks  # noqa: F401 - registers the commands

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    app()
