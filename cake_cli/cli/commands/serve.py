"""`cake serve`: an OpenAI-compatible local server over one model loaded once (docs/serve.md). The bind
address, its key and the limits are checked here before `cli.runners.serve` loads torch and the model."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer

from cake_cli.cli import options as o
from cake_cli.cli.app import app, handled
from cake_cli.errors import CakeError
from cake_cli.paths import cake_home
from cake_cli.serve.settings import (
    DEFAULT_HOST,
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_UPLOAD,
    DEFAULT_PORT,
    DEFAULT_PREFIXES,
    DEFAULT_QUEUE,
    KEY_ENV,
    ServeSettings,
    api_key,
    check_settings,
)

Documents = Annotated[
    Path | None,
    typer.Option(
        "--documents",
        "-d",
        metavar="DIR",
        show_default=False,
        help="The served folder: requests name documents inside it (text, PDF or .cake; never outside it), uploads "
        "land in it, and each document is compressed once into DIR/.cake-cache. Default: CAKE_HOME/documents.",
    ),
]
Host = Annotated[str, typer.Option("--host", metavar="ADDRESS", help="Address to bind; any but loopback needs a key.")]
Port = Annotated[int, typer.Option("--port", "-p", metavar="PORT", help="TCP port (0: any free one).")]
Key = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar=KEY_ENV,
        metavar="KEY",
        show_default=False,
        help=f"Clients must send 'Authorization: Bearer KEY' (or set {KEY_ENV}).",
    ),
]
MaxQueue = Annotated[int, typer.Option("--max-queue", metavar="N", help="Requests waiting for the model before 429.")]
MaxBody = Annotated[int, typer.Option("--max-body", metavar="BYTES", help="Largest JSON request body (413 above).")]
MaxUpload = Annotated[int, typer.Option("--max-upload", metavar="BYTES", help="Largest uploaded document (413 above).")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", metavar="N", help="Most tokens one request may generate.")]
Prefixes = Annotated[int, typer.Option("--keep", metavar="N", help="Compressed documents kept in memory.")]


@app.command()
def serve(
    model: o.Model = None,
    documents: Documents = None,
    host: Host = DEFAULT_HOST,
    port: Port = DEFAULT_PORT,
    key: Key = None,
    dtype: o.Dtype = "auto",
    weights: o.Weights = "auto",
    attention: o.Attention = "auto",
    threads: o.Threads = None,
    max_queue: MaxQueue = DEFAULT_QUEUE,
    max_body: MaxBody = DEFAULT_MAX_BODY,
    max_upload: MaxUpload = DEFAULT_MAX_UPLOAD,
    max_tokens: MaxTokens = DEFAULT_MAX_TOKENS,
    keep: Prefixes = DEFAULT_PREFIXES,
) -> None:
    """Serve one model over the OpenAI API (chat and text completions, streamed or not) on 127.0.0.1, answering
    from documents compressed once and kept on disk; Ctrl-C stops it (the running answer is cancelled)."""
    with handled():
        settings = ServeSettings(
            documents=(documents or cake_home() / "documents").expanduser(),
            model=model,
            dtype=dtype,
            weights=weights,
            attention=attention,
            threads=threads,
            host=host,
            port=port,
            api_key=api_key(key),
            max_queue=max_queue,
            max_body=max_body,
            max_upload=max_upload,
            max_tokens=max_tokens,
            prefixes=keep,
        )
        check_settings(settings)
        missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
        if missing:
            raise CakeError(f"cake serve needs {' and '.join(missing)}", "pip install 'cake-cli[serve]'")
        from cake_cli.cli.runners import serve as run  # noqa: PLC0415 - torch and the web stack load after the checks

        run.serve(settings)
