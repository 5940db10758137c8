"""`cake serve` after its options were checked: load the model once, build the app, run uvicorn until
Ctrl-C or SIGTERM (uvicorn stops accepting, gives open requests a few seconds, then cancels them; a .cake
being written is written whole or not at all)."""

from __future__ import annotations

import uvicorn

from cake_cli.cli.progress import StderrProgress
from cake_cli.serve.app import create_app
from cake_cli.serve.settings import ServeSettings
from cake_cli.tasks.runner import load_ready

GRACE_SECONDS = 5  # how long a stopping server waits for open requests before cancelling them


def serve(settings: ServeSettings) -> None:
    """Load the model and serve it (blocks until stopped)."""
    progress = StderrProgress(False)
    ready = load_ready(settings.model, settings.dtype, settings.attention, None, progress.status, settings.weights)
    loaded = ready.loaded
    model_id = loaded.profile.name if loaded.profile else loaded.name
    app = create_app(settings, ready, model_id)
    where = f"http://{settings.host}:{settings.port}/v1"
    key = " (API key required)" if settings.api_key else ""
    progress.status(f"serving {model_id} at {where}{key}; documents from {settings.documents}; Ctrl-C stops")
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", timeout_graceful_shutdown=GRACE_SECONDS)
