"""Informational commands: version."""

from __future__ import annotations

import typer

from cake_cli import __version__
from cake_cli.app import app


@app.command()
def version() -> None:
    """Print the cake-cli version."""
    typer.echo(__version__)
