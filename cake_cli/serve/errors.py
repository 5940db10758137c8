"""Errors as the OpenAI API gives them: `{"error": {"message", "type", "code"}}` with the HTTP status that
fits. Project errors (`CakeError`) map to 400 with their one line (message — fix)."""

from __future__ import annotations

from cake_cli.engine.config import ConfigError
from cake_cli.errors import CakeError
from cake_cli.tasks.pipeline import Cancelled

INVALID, AUTH, NOT_FOUND, TOO_LARGE, BUSY, SERVER = (
    "invalid_request_error",
    "authentication_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "server_error",
)
FIELDS = {  # engine settings (`ConfigError.field`) by their names in a request body
    "budget": "cake.budget",
    "window": "cake.window",
    "method": "cake.method",
    "allocation": "cake.allocation",
    "indicator": "cake.indicator",
    "decode_policy": "cake.decode_policy",
    "temperature": "temperature",
    "top_p": "top_p",
}


class ApiError(Exception):
    """A request the server refuses: HTTP `status`, the error's `type` and `code`, one-line `message`."""

    def __init__(self, status: int, message: str, kind: str = INVALID, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code

    def body(self) -> dict:
        """The JSON body: {"error": {"message", "type", "code"}}."""
        return {"error": {"message": self.message, "type": self.kind, "code": self.code}}


def from_cake(exc: CakeError | ConfigError) -> ApiError:
    """A project error raised while checking or answering a request, as a 400 (the fix in its message); a run
    cancelled by the server itself (stopping) as a 503."""
    if isinstance(exc, Cancelled):
        return ApiError(503, "the answer was cancelled: the server is stopping", SERVER, "cancelled")
    if isinstance(exc, ConfigError):
        message, hint = exc.render(FIELDS)
        return ApiError(400, f"{message} — {hint}" if hint else message, INVALID, "invalid_value")
    return ApiError(400, exc.one_line(), INVALID, "cake_error")
