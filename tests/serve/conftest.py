"""A live `cake serve` app on 127.0.0.1 (uvicorn in a thread) over the tiny profile, shared by a module."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import pytest

from cake_cli.serve.settings import ServeSettings
from cake_cli.tasks.runner import load_ready
from tests.helpers.texts import license_text

MODEL = "tiny-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live(app):
    """Serve `app` on a free loopback port in a thread; yields its base URL; stops it after."""
    import uvicorn  # noqa: PLC0415 - the `serve` extra; test_server.py skips without it

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@pytest.fixture(scope="module")
def env(tiny_profile_dir, tmp_path_factory):
    """The tiny profile and a private CAKE_HOME for the module; (documents folder, ready model)."""
    root = tmp_path_factory.mktemp("serve")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAKE_PROFILES_DIR", str(tiny_profile_dir))
        mp.setenv("CAKE_HOME", str(root / "home"))
        mp.delenv("CAKE_MODEL", raising=False)
        mp.delenv("CAKE_API_KEY", raising=False)
        docs = root / "docs"
        docs.mkdir()
        (docs / "notes.txt").write_text(license_text()[:1300], encoding="utf-8")
        (docs / "other.txt").write_text(license_text()[2000:3000], encoding="utf-8")
        ready = load_ready(MODEL, "float32", "auto")
        yield docs, ready


@pytest.fixture(scope="module")
def settings(env):
    docs, _ = env
    return ServeSettings(documents=docs, model=MODEL, dtype="float32", max_body=16_384, max_upload=65_536)


def create_app(*args):
    from cake_cli.serve.app import create_app as create  # noqa: PLC0415 - needs fastapi (skipped without it)

    return create(*args)


@pytest.fixture(scope="module")
def served(env, settings):
    """(base URL, app) of a server without a key."""
    app = create_app(settings, env[1], MODEL)
    with live(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def keyed(env, settings):
    """Base URL of a server that wants the key 'sesame'."""
    with live(create_app(replace(settings, api_key="sesame"), env[1], MODEL)) as url:
        yield url
