"""One project error type: raised deep, formatted once at the top (cli.main)."""

from __future__ import annotations

EXIT_OK = 0
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
