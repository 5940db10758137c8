"""Atomic --output files."""

from __future__ import annotations

import os

import pytest

from cake_cli.errors import CakeError
from cake_cli.files import check_writable, write_atomic


def test_writes_and_replaces(tmp_path):
    path = tmp_path / "out.txt"
    write_atomic(path, "first")
    write_atomic(path, "second")
    assert path.read_text() == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary left behind


def test_interrupted_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    path.write_text("precious")

    def boom(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, "garbage")
    assert path.read_text() == "precious"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_bad_targets_fail_early(tmp_path):
    with pytest.raises(CakeError, match="is a directory"):
        check_writable(tmp_path)
    with pytest.raises(CakeError, match="does not exist"):
        check_writable(tmp_path / "missing" / "out.txt")
