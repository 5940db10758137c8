"""Real text that ships with every CPython, for benchmarks and tests without network."""

from __future__ import annotations

import sysconfig
from pathlib import Path


def stdlib_path(*parts: str) -> Path:
    """A file of the running Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"]).joinpath(*parts)


def python_docs_text() -> str:
    """The Python language reference topics shipped in `pydoc_data.topics` (~465K characters of
    English documentation, ~100K tokens), joined in a fixed order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def license_text() -> str:
    """CPython's LICENSE.txt (~14K characters, ~3.9K SmolLM2 tokens)."""
    return stdlib_path("LICENSE.txt").read_text(encoding="utf-8")
