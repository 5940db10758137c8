"""Real text that ships with every CPython, for benchmarks and tests without network."""

from __future__ import annotations


def python_docs_text() -> str:
    """The Python language reference topics shipped in `pydoc_data.topics` (~465K characters of
    English documentation, ~100K tokens), joined in a fixed order."""
    from pydoc_data.topics import topics  # noqa: PLC0415 - a 1 MB data module: read only when a benchmark runs

    return "\n\n".join(topics[key] for key in sorted(topics))
