"""Atomic output files: an interrupted or failed run never leaves a partial file and never
clobbers an existing one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cake_cli.errors import CakeError


def check_writable(path: str | os.PathLike) -> Path:
    """Fail early (before any model work) when `path` cannot be written.

    Raises:
        CakeError: the parent folder is missing or not writable, or `path` is a directory.
    """
    target = Path(path).expanduser()
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise CakeError(f"--output {target} is a directory", "give a file name, e.g. --output summary.txt")
    if not parent.is_dir():
        raise CakeError(f"--output folder {parent} does not exist", f"create it first: mkdir -p {parent}")
    if not os.access(parent, os.W_OK):
        raise CakeError(f"cannot write to {parent}", "choose a folder you can write to")
    return target


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` via a temporary file in the same folder and a rename.

    Returns:
        The final path.

    Raises:
        CakeError: the file could not be written (the old file, if any, is left untouched).
    """
    target = check_writable(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise CakeError(f"could not write {target}: {exc.strerror}", "check the disk and permissions") from None
        raise
    return target
