"""One path for a task, under every front end (the CLI, `cake serve`): a model loaded once (`ReadyModel`)
-> a prefix (`Prefix`: prefilled fresh with the task's own prompt, or a compressed document prefix read
from a .cake file or compressed now) -> the answer, streamed -> the report (`RunResult`).

Each step is one call into the module below it and none calls back up: the front end gives callbacks
(`Callbacks`) for text, status and progress, and gets a result object. `stream` runs the same path on a
worker thread and hands the text out as an iterator, for a caller that pulls pieces (the server); its
`cancel()` stops the run at the next piece or prefill layer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace

from cake_cli.errors import CakeError
from cake_cli.tasks.request import SECTIONS, Callbacks, Plan
from cake_cli.tasks.results import RunResult
from cake_cli.tasks.runner import ReadyModel, run_task
from cake_cli.tasks.saved.compress import answer, compress
from cake_cli.tasks.saved.fileformat import DEFAULT_SCORING
from cake_cli.tasks.saved.store import Compressed, load, save
from cake_cli.tasks.sections import run_sections


class Cancelled(CakeError):
    """The caller stopped the run (`TextStream.cancel`: a client that went away, a server shutting down)."""

    def __init__(self) -> None:
        super().__init__("the run was cancelled")


@dataclass(frozen=True)
class Prefix:
    """What a task's answer continues: nothing yet (`compressed` None: the task prefills its own whole
    prompt) or a compressed document prefix (a .cake file's, or one compressed in this process)."""

    compressed: Compressed | None = None

    @property
    def fresh(self) -> bool:
        """True when the task prefills its own prompt."""
        return self.compressed is None


FRESH = Prefix()


def open_prefix(ready: ReadyModel, plan: Plan, cb: Callbacks | None = None, scoring: str = DEFAULT_SCORING) -> Prefix:
    """The compressed prefix of a plan on `ready`: its .cake file (`plan.saved`) loaded, else its document
    compressed now with `scoring` (`tasks.saved.fileformat.SCORINGS`).

    Raises:
        CakeError: a .cake file made with another model or damaged; a document whose prefix cannot be
            shared or does not fit; non-finite values.
    """
    cb = cb or Callbacks()
    if plan.saved is not None:
        return Prefix(load(plan, cb, ready))
    return Prefix(compress(plan, cb, ready, scoring))


def save_prefix(prefix: Prefix, path, bits: int = 16) -> int:
    """Write a compressed prefix to a .cake file atomically (temp file + rename); its size in bytes.

    Raises:
        CakeError: a fresh prefix (nothing to save), or the file cannot be written.
    """
    if prefix.compressed is None:
        raise CakeError("a fresh prefix holds no compressed document to save")
    return save(prefix.compressed, path, bits)


def run(ready: ReadyModel, plan: Plan, prefix: Prefix = FRESH, cb: Callbacks | None = None) -> RunResult:
    """Answer one checked plan on a loaded model: its own prefill (`FRESH`; `--long sections` reads the
    document section by section) or a continuation of `prefix`; text goes to `cb.on_text` as it is made.

    Raises:
        CakeError: as `tasks.runner.run_task` / `tasks.saved.compress.answer`; `Cancelled` when a
            callback raised it.
    """
    cb = cb or Callbacks()
    if not prefix.fresh:
        return answer(prefix.compressed, plan, cb)
    return (run_sections if plan.request.long == SECTIONS else run_task)(plan, cb, ready)


_END = object()


class TextStream:
    """`run` on a worker thread, its text as an iterator of pieces; `result` once the iterator ends.

    The run's own callbacks (status, layers, warnings) are called on the worker thread. `cancel()` makes the
    next text piece or prefill layer raise `Cancelled`; `close()` cancels and waits for the thread, so the
    model is free again when it returns.
    """

    def __init__(self, ready: ReadyModel, plan: Plan, prefix: Prefix = FRESH, cb: Callbacks | None = None):
        self.result: RunResult | None = None
        self.error: BaseException | None = None
        self._pieces: queue.Queue = queue.Queue()
        self._cancel = threading.Event()
        cb = cb or Callbacks()

        def on_text(piece: str) -> None:
            self._check()
            self._pieces.put(piece)
            if cb.on_text:
                cb.on_text(piece)

        def on_layer(index: int, count: int) -> None:
            self._check()
            if cb.on_layer:
                cb.on_layer(index, count)

        hooks = replace(cb, on_text=on_text, on_layer=on_layer)
        self._thread = threading.Thread(target=self._work, args=(ready, plan, prefix, hooks), daemon=True)
        self._thread.start()

    def _check(self) -> None:
        if self._cancel.is_set():
            raise Cancelled()

    def _work(self, ready: ReadyModel, plan: Plan, prefix: Prefix, cb: Callbacks) -> None:
        try:
            self.result = run(ready, plan, prefix, cb)
        except BaseException as exc:  # handed to the reading thread, which raises it
            self.error = exc
        finally:
            self._pieces.put(_END)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        """The next piece of text (blocking). Raises StopIteration at the end, or the run's error."""
        piece = self._pieces.get()
        if piece is _END:
            self._pieces.put(_END)  # later calls end too
            self._thread.join()
            if self.error is not None:
                raise self.error
            raise StopIteration
        return piece

    def cancel(self) -> None:
        """Stop the run at its next text piece or prefill layer (returns at once)."""
        self._cancel.set()

    def close(self) -> None:
        """Cancel the run if it is still going, and wait for the worker thread to end."""
        if self._thread.is_alive():
            self.cancel()
        self._thread.join()

    @property
    def cancelled(self) -> bool:
        """Whether the run was stopped before its end (`cancel()` while it ran)."""
        return self._cancel.is_set() and self.result is None


def stream(ready: ReadyModel, plan: Plan, prefix: Prefix = FRESH, cb: Callbacks | None = None) -> TextStream:
    """`run` with its text as an iterator (`TextStream`); the result is `.result` after the last piece."""
    return TextStream(ready, plan, prefix, cb)
