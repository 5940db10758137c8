"""The command line: Typer app, shared options, rich report, commands (top layer)."""
