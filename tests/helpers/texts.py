"""Real text that ships with every Python, for tests without network."""

from __future__ import annotations


def license_text() -> str:
    """CPython's LICENSE.txt: real English text shipped with every Python (about 3.8K SmolLM2 tokens)."""
    import sysconfig
    from pathlib import Path

    return (Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text(encoding="utf-8")


def license_file(folder, chars: int, name: str = "notes.txt"):
    """The first `chars` characters of `license_text()` written to `folder / name` (a Path)."""
    from pathlib import Path

    path = Path(folder) / name
    path.write_text(license_text()[:chars], encoding="utf-8")
    return path
