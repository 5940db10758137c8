"""Tasks: documents, prompt templates, the task runner and its result objects (no typer or rich)."""
