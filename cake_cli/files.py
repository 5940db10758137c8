"""Atomic files and folders: an interrupted or failed write never leaves a partial file and never
clobbers the old one.

Every writer in cake-cli goes through here: ``-o/--output`` files, benchmark results, profile
edits, saved caches, converted model checkpoints. A file is written to a temporary file in the
same folder, flushed and fsynced, given the mode a plain ``open()`` would give it (the old file's
mode when replacing one), then renamed over the target; a folder's files get that mode too (the
umask's), whatever the library that wrote them chose (safetensors writes 0600). The one file
that grows instead, ``cake batch``'s JSONL results, is appended a whole fsynced line at a time
(``LineAppender``); a half-written last line left by a killed run is cut when it is reopened.
``exclusive`` is a lock file for work that two processes must not do at once (converting a model).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from cake_cli.errors import CakeError

STALE_SECONDS = 3600  # leftovers of an interrupted folder write older than this are removed


def _plain_mode(target: Path) -> int:
    """The mode `open(target, "w")` would leave: the existing file's, else 0o666 minus the umask."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def check_writable(path: str | os.PathLike, what: str = "output file") -> Path:
    """Fail early (before any model work) when `path` cannot be written as a regular file.

    Probes the folder by creating (and removing) a temporary file there, the way `atomic_open`
    will write: permission bits can say yes where the file system says no (/proc, a read-only mount).

    Raises:
        CakeError: the target is a directory or not a regular file, its folder is missing, or
            nothing can be created there.
    """
    target = Path(path).expanduser()
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise CakeError(f"{what} {target} is a directory", "give a file name, e.g. summary.txt")
    if target.exists() and not target.is_file():
        raise CakeError(f"{what} {target} is not a regular file", "choose a file in a folder you own")
    if not parent.is_dir():
        raise CakeError(f"{what} folder {parent} does not exist", f"create it first: mkdir -p {parent}")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CakeError(
            f"cannot write {what} {target} ({exc.strerror or exc})", "choose a folder you can write to"
        ) from None
    if target.exists() and not os.access(target, os.W_OK):
        raise CakeError(f"cannot write {what} {target} (read-only file)", "choose another file name")
    return target


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", what: str = "file") -> Iterator[IO]:
    """Open a temporary file next to `path`; on a clean exit it replaces `path` atomically.

    Args:
        path: the final file.
        mode: "w" (UTF-8 text) or "wb".
        what: how error messages name the file.

    Raises:
        CakeError: the folder cannot be written or the disk is full (the old file is untouched).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    target = check_writable(path, what)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise CakeError(f"could not write {target}: {exc.strerror}", "check the disk and permissions") from None
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _plain_mode(target))
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise CakeError(f"could not write {target}: {exc.strerror}", "check the disk and permissions") from None
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes, what: str = "file") -> Path:
    """Write `data` (str as UTF-8, or bytes) to `path` atomically; returns the final path.

    Raises:
        CakeError: see `atomic_open`.
    """
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", what) as f:
        f.write(data)
    return Path(path).expanduser()


@contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Build a folder in a temporary sibling of `dest`; on a clean exit it replaces `dest`.

    Leftovers of builds killed more than an hour ago are removed first. On any error the
    temporary folder is deleted and `dest` (old or absent) is untouched. OSErrors propagate
    (callers know what the folder is and how to phrase the fix).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        yield tmp
        _plain_modes(tmp)
        _install(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _plain_modes(root: Path) -> None:
    """Give `root`, every folder and every file below it the mode `mkdir` / `open()` would give (the
    umask's): mkdtemp makes the folder private and safetensors writes its files 0600, which a shared
    CAKE_HOME's other users then cannot read."""
    umask = _umask()
    for path in (root, *root.rglob("*")):
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _install(tmp: Path, dest: Path) -> None:
    """Rename the finished `tmp` to `dest`, replacing an older `dest` if there is one."""
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.rename(dest, old)
        os.rename(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(tmp, dest)
    except OSError:
        if not dest.is_dir():  # not a concurrent build finishing first
            raise


def _remove_stale(dest: Path) -> None:
    """Delete temporary folders left by builds of `dest` killed more than an hour ago."""
    now = time.time()
    for pattern in (f".{dest.name}.tmp-*", f".{dest.name}.old-*"):
        for d in dest.parent.glob(pattern):
            try:
                if now - d.stat().st_mtime > STALE_SECONDS:
                    shutil.rmtree(d, ignore_errors=True)
            except OSError:
                pass


@contextmanager
def exclusive(lock: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on the file `lock` (created, with its folder, when missing) for the block.
    When another process (or another open of it) holds it, `on_wait()` is called once and this waits
    until it is released, as it is when its holder ends or dies. The file stays (it holds nothing).

    Raises:
        OSError: the lock file cannot be created (callers phrase the fix).
        KeyboardInterrupt: Ctrl-C while waiting.
    """
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class LineAppender:
    """Append whole lines to a file that a killed run may have left half-written (`cake batch` JSONL).

    Opening takes an exclusive lock (a second writer fails at once, instead of interleaving) and
    cuts a last line that has no newline, which is what a run killed mid-write can leave. Each
    `write_line` is one write of one whole line, flushed and fsynced before it returns, so a line on
    disk is complete or absent. Use as a context manager; `cut_bytes` says how much was cut.

    Raises:
        CakeError: the file cannot be opened or locked (another run is writing it), or a write fails.
    """

    def __init__(self, path: str | os.PathLike, what: str = "file"):
        self.path, self.what = check_writable(path, what), what
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)  # 0o666 minus the umask
        except OSError as exc:
            raise CakeError(
                f"could not open {what} {self.path}: {exc.strerror}", "check the disk and permissions"
            ) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise CakeError(
                f"another run is writing {what} {self.path}", "wait for it to finish, or choose another file"
            ) from None
        self.cut_bytes = self._cut_unfinished_line()

    def _cut_unfinished_line(self) -> int:
        """Truncate the file after its last newline; returns the bytes cut (0 when it ends cleanly)."""
        size = end = os.fstat(self._fd).st_size
        while end > 0:
            start = max(0, end - 65536)
            chunk = os.pread(self._fd, end - start, start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                end = start + newline + 1
                break
            end = start
        if end < size:
            os.ftruncate(self._fd, end)
            os.fsync(self._fd)
        return size - end

    def write_line(self, line: str) -> None:
        """Append `line` (no newline inside it) plus a newline, then flush and fsync.

        Raises:
            ValueError: `line` holds a newline. CakeError: the disk is full or the write fails.
        """
        if "\n" in line:
            raise ValueError("a line must not hold a newline")
        data = (line + "\n").encode("utf-8")
        try:
            while data:
                data = data[os.write(self._fd, data) :]
            os.fsync(self._fd)
        except OSError as exc:
            raise CakeError(f"could not write {self.what} {self.path}: {exc.strerror}", "check the disk") from None

    def close(self) -> None:
        """Release the lock and close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LineAppender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
