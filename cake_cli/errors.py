"""One project error type: raised deep, formatted once at the top (`cake_cli.cli.app.handled`).

Also the two helpers every error message uses: the first line of an exception and "did you mean".
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CakeError(Exception):
    """A known failure the user can act on.

    Args:
        message: one line naming the problem.
        hint: one line naming the fix (optional).
        exit_code: 1 for runtime/input errors, 2 for usage errors.
    """

    def __init__(self, message: str, hint: str | None = None, exit_code: int = EXIT_ERROR):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def one_line(self) -> str:
        """The message and hint joined into the single line shown to the user."""
        return f"{self.message} — {self.hint}" if self.hint else self.message


class UsageError(CakeError):
    """A bad option value or combination (exit code 2)."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message, hint, exit_code=EXIT_USAGE)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def did_you_mean(name: str, valid: Iterable[str], n: int = 3) -> str:
    """'; did you mean 'a' or 'b'?' for the names in `valid` close to `name` (case-insensitive), else ''."""
    close = difflib.get_close_matches(name.strip().lower(), list(valid), n=n, cutoff=0.5)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def unknown_name(what: str, name: str, valid: Iterable[str]) -> UsageError:
    """A UsageError for an unknown `what` (method, indicator, task, …) with "did you mean" and the valid names."""
    valid = list(valid)
    return UsageError(f"unknown {what} '{name}'{did_you_mean(name, valid)}", f"choose one of {', '.join(valid)}")


def unknown_names(what: str, bad: Sequence[str], valid: Iterable[str]) -> UsageError:
    """`unknown_name` for a comma-separated list option: `bad` are the unknown names given (none:
    the list was empty), "did you mean" for the first; `what` is plural-neutral, e.g. "task(s)"."""
    valid = list(valid)
    given = ", ".join(repr(name) for name in bad) or "(none)"
    suggestion = did_you_mean(bad[0], valid) if bad else ""
    return UsageError(f"unknown {what} {given}{suggestion}", f"choose from {', '.join(valid)}")
