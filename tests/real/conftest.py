"""Fixtures of the real-model tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory):
    """One CAKE_HOME for the module, so the GGUF is converted once (or reuse CI's)."""
    import os

    return os.environ.get("CAKE_HOME") or str(tmp_path_factory.mktemp("cake-home"))
