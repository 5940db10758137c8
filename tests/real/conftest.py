"""Fixtures of the real-model tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory):
    """One CAKE_HOME for the whole run, so each embedded GGUF is converted once (or reuse CI's)."""
    return os.environ.get("CAKE_HOME") or str(tmp_path_factory.mktemp("cake-home"))
