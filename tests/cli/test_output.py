"""Atomic --output files."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cake_cli.errors import CakeError
from cake_cli.files import check_writable, write_atomic
from tests.helpers.texts import license_text


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


# ---------------------------------------------------------------- stdout that cannot be written
ROOT = Path(__file__).resolve().parents[2]


def cake_to(stdout, *args, env=None):
    """Run `python -m cake_cli ARGS` from this checkout with stdout going to `stdout` (a file object)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "cake_cli", *map(str, args)], cwd=ROOT, env=env, stdout=stdout, stderr=subprocess.PIPE,
        text=True, timeout=300,
    )  # fmt: skip


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_on_stdout_is_a_one_line_error(cli_env):
    """`cake … > /dev/full`: every write fails with ENOSPC; it was "internal error: OSError … report it"."""
    with open("/dev/full", "w") as full:
        version = cake_to(full, "version")
        doc = cli_env / "notes.txt"
        doc.write_text(license_text()[:800], encoding="utf-8")
        task = cake_to(full, "summarize", doc, "-m", "tiny-test", "-b", "64", "-n", "3", "--quiet")
    for result in (version, task):
        assert result.returncode == 1
        assert one_line(result.stderr) == (
            "error: cannot write to stdout: No space left on device — free space there, or write elsewhere"
        )


def test_help_to_a_full_disk_is_a_one_line_error():
    """Typer writes help outside the commands' error handling: `cake -h > /dev/full` was a traceback."""
    with open("/dev/full", "w") as full:
        results = [cake_to(full, *args) for args in (["-h"], ["qa", "-h"])]
    for result in results:
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert one_line(result.stderr).startswith("error: cannot write to stdout: No space left on device")


def test_a_closed_pipe_on_stdout_is_a_one_line_error():
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written (`cake … | true`)
    with os.fdopen(write, "w") as pipe:
        result = cake_to(pipe, "version")
    assert result.returncode == 1
    assert one_line(result.stderr) == "error: cannot write to stdout: Broken pipe — the program reading it stopped"


def test_output_errors_name_the_file_when_there_is_one():
    from cake_cli.cli.app import output_error

    full = output_error(OSError(errno.ENOSPC, "No space left on device"))
    assert full.message == "cannot write to stdout: No space left on device"
    named = output_error(OSError(errno.EFBIG, "File too large", "/tmp/x.txt"))
    assert named.message == "cannot write to /tmp/x.txt: File too large"


def test_exclusive_waits_for_the_holder(tmp_path):
    import threading

    from cake_cli.files import exclusive

    lock, order, waited = tmp_path / "locks" / "x.lock", [], []
    with exclusive(lock):
        other = threading.Thread(target=lambda: exclusive_run(lock, order, waited))
        other.start()
        other.join(0.3)
        assert other.is_alive() and waited == [True], "the second holder waits"
        order.append("first done")
    other.join(10)
    assert order == ["first done", "second ran"]


def exclusive_run(lock, order, waited):
    from cake_cli.files import exclusive

    with exclusive(lock, on_wait=lambda: waited.append(True)):
        order.append("second ran")


def test_a_built_folder_gets_plain_modes(tmp_path):
    from cake_cli.files import atomic_dir

    umask = os.umask(0o027)
    try:
        with atomic_dir(tmp_path / "ckpt") as tmp:
            (tmp / "model.safetensors").write_bytes(b"x")
            (tmp / "model.safetensors").chmod(0o600)  # as safetensors writes it
            (tmp / "sub").mkdir(mode=0o700)
    finally:
        os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "ckpt", *(tmp_path / "ckpt").rglob("*"))}
    assert modes == {"ckpt": 0o750, "model.safetensors": 0o640, "sub": 0o750}
