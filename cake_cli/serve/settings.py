"""What `cake serve` is started with (`ServeSettings`) and the checks that need no model: the bind address
and its key. Light (no torch, no web stack), so the command refuses a bad address in well under a second."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cake_cli.errors import UsageError

KEY_ENV = "CAKE_API_KEY"  # the API key when --api-key is not given
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000
DEFAULT_QUEUE = 8  # requests waiting behind the running one before 429
DEFAULT_MAX_BODY = 1 << 20  # bytes of a JSON request body before 413
DEFAULT_MAX_UPLOAD = 32 << 20  # bytes of an uploaded document before 413
DEFAULT_MAX_TOKENS = 2048  # most tokens one request may ask to generate
DEFAULT_PREFIXES = 4  # compressed documents kept in memory (least recently used dropped first)


@dataclass(frozen=True)
class ServeSettings:
    """The server's fixed settings. Sizes in bytes; `api_key` None: no key (loopback only)."""

    documents: Path  # the served folder: documents are named relative to it and never leave it
    model: str | None = None  # the model spec (profile name, folder, .gguf); None: the default model
    dtype: str = "auto"
    weights: str = "auto"
    attention: str = "auto"
    threads: int | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    max_queue: int = DEFAULT_QUEUE
    max_body: int = DEFAULT_MAX_BODY
    max_upload: int = DEFAULT_MAX_UPLOAD
    max_tokens: int = DEFAULT_MAX_TOKENS
    prefixes: int = DEFAULT_PREFIXES


def is_loopback(host: str) -> bool:
    """Whether `host` binds only this machine: localhost, 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def api_key(given: str | None) -> str | None:
    """The API key: `given` (--api-key), else the CAKE_API_KEY environment variable, else None."""
    key = given if given is not None else os.environ.get(KEY_ENV)
    return key or None


def check_settings(settings: ServeSettings) -> None:
    """Refuse what would serve unsafely or not at all.

    Raises:
        UsageError: a non-loopback --host without a key; a port, queue or size limit out of range; a
            --documents path that is a file.
    """
    if not is_loopback(settings.host) and not settings.api_key:
        raise UsageError(
            f"--host {settings.host} serves other machines, and no API key is set",
            f"pass --api-key KEY (or set {KEY_ENV}); clients then send 'Authorization: Bearer KEY'",
        )
    if not 0 <= settings.port <= 65535:
        raise UsageError(f"--port {settings.port} is not a TCP port", "choose one in 1-65535 (0: any free port)")
    for flag, value in (
        ("--max-queue", settings.max_queue),
        ("--max-body", settings.max_body),
        ("--max-upload", settings.max_upload),
        ("--max-tokens", settings.max_tokens),
    ):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1 (got {value})")
    if settings.documents.exists() and not settings.documents.is_dir():
        raise UsageError(f"--documents {settings.documents} is a file", "give a folder (it is created if missing)")
