"""Fixtures of the CLI tests."""

from __future__ import annotations

import pytest

from tests.helpers.texts import license_text


@pytest.fixture
def doc(cli_env):
    """A 1,300-character slice of CPython's LICENSE.txt as notes.txt (fits the tiny model)."""
    path = cli_env / "notes.txt"
    path.write_text(license_text()[:1300], encoding="utf-8")
    return path
