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


def test_new_files_get_the_mode_plain_open_gives(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_atomic(tmp_path / "new.txt", "text")
        assert path.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
        path.chmod(0o640)
        write_atomic(path, "again")
        assert path.stat().st_mode & 0o777 == 0o640  # a replaced file keeps its mode
    finally:
        os.umask(old)


@pytest.mark.skipif(not os.path.isfile("/proc/version"), reason="needs Linux /proc")
def test_targets_the_file_system_refuses_fail_before_any_work():
    with pytest.raises(CakeError, match="cannot write"):
        check_writable("/proc/version")  # root may "access" it, yet nothing can be created in /proc
