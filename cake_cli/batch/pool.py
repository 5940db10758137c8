"""Where `cake batch` rows run on this machine: in the driver (`--workers 1`) or in N processes.

An executor loads one model per worker (`start`), takes a checked row when it has a free worker
(`submit`) and hands back finished rows' lines one at a time (`next`); the driver
(`batch.driver`) is the only writer of the output. `batch.ray_actors` is the same on Ray.

Worker processes are spawned (never forked: torch threads do not survive a fork). A worker that
dies is restarted once and its row is run again once (what Ray does with max_restarts=1,
max_task_retries=1); a row whose worker died twice gets an error line; when no worker is left,
the batch stops with the finished rows on disk, and a rerun runs the rest.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import connection

from cake_cli.batch.output import row_line
from cake_cli.batch.rows import BatchRow
from cake_cli.batch.worker import RowWorker, process_main
from cake_cli.errors import CakeError
from cake_cli.tasks.request import Plan, TaskRequest

MAX_RESTARTS = 1  # per worker
MAX_ATTEMPTS = 2  # per row
STOP_SECONDS = 2.0  # a worker asked to stop gets this long before it is terminated
RERUN_HINT = "rerun the same command: the finished rows are kept and only the others run"

Item = tuple[BatchRow, Plan]


def load_error(info: dict) -> CakeError | None:
    """The CakeError of a worker whose model did not load (its `RowWorker.info()`), else None."""
    return CakeError(*info["error"]) if info.get("error") else None


class InlineExecutor:
    """`--workers 1`: the rows run one after another in the driver process itself."""

    kind = "inline"

    def __init__(self, request: TaskRequest, threads: int, follow_load: bool = False):
        self.request, self.threads, self.workers, self.follow_load = request, threads, 1, follow_load
        self.worker: RowWorker | None = None
        self.item: Item | None = None

    def start(self) -> list[dict]:
        """Load the model. Raises: CakeError (the model cannot load)."""
        self.worker = RowWorker(self.request, self.threads, self.follow_load)
        info = self.worker.info()
        if error := load_error(info):
            raise error
        return [info]

    def free(self) -> int:
        return 0 if self.item else 1

    def submit(self, row: BatchRow, plan: Plan) -> None:
        self.item = (row, plan)

    def next(self) -> tuple[BatchRow, dict]:
        (row, plan), self.item = self.item, None
        return row, self.worker.run(row, plan)

    def close(self) -> None:
        self.item = None


@dataclass
class _Slot:
    number: int  # 1-based, for messages
    process: multiprocessing.Process | None = None  # None: dead for good
    conn: connection.Connection | None = None
    ready: bool = False  # its model is loaded
    item: Item | None = None  # the row it runs (or will run once restarted)
    restarts: int = 0


class ProcessExecutor:
    """`--workers N`: N spawned processes, each with its own model and `threads` torch threads."""

    kind = "processes"

    def __init__(
        self, request: TaskRequest, workers: int, threads: int, on_warning: Callable[[str], None] | None = None
    ):
        self.request, self.workers, self.threads = request, workers, threads
        self.on_warning = on_warning or (lambda message: None)
        self.context = multiprocessing.get_context("spawn")
        self.slots = [_Slot(n + 1) for n in range(workers)]
        self.attempts: dict[str, int] = {}  # row key -> runs started
        self.retry: list[Item] = []  # rows whose worker died, waiting for a free worker
        self.finished: list[tuple[BatchRow, dict]] = []
        self.infos: list[dict] = []

    def start(self) -> list[dict]:
        """Spawn every worker and wait until their models are loaded (in parallel).

        Raises:
            CakeError: a model cannot load, or every worker died while loading.
        """
        for slot in self.slots:
            self._spawn(slot)
        while any(s.process and not s.ready for s in self.slots):
            self._pump()
        if not any(s.ready for s in self.slots):
            raise CakeError("every worker process died while loading the model", "rerun with --workers 1 to see why")
        return self.infos

    def free(self) -> int:
        return sum(1 for s in self.slots if s.ready and s.item is None)

    def submit(self, row: BatchRow, plan: Plan) -> None:
        slot = next(s for s in self.slots if s.ready and s.item is None)
        self._send(slot, (row, plan))

    def next(self) -> tuple[BatchRow, dict]:
        """The next finished row and its line (blocks).

        Raises:
            CakeError: every worker died (the rows in flight are not recorded; a rerun runs them).
        """
        while not self.finished:
            self._pump()
        return self.finished.pop(0)

    def close(self) -> None:
        """Ask every worker to stop; terminate the ones still busy after STOP_SECONDS."""
        live = [s for s in self.slots if s.process]
        for slot in live:
            try:
                slot.conn.send(None)
            except OSError:
                pass
        for slot in live:
            slot.process.join(STOP_SECONDS)
            if slot.process.is_alive():
                slot.process.terminate()
                slot.process.join(STOP_SECONDS)
            slot.conn.close()
            slot.process = None

    def _spawn(self, slot: _Slot) -> None:
        here, there = self.context.Pipe()
        slot.process = self.context.Process(
            target=process_main,
            args=(there, self.request, self.threads, os.getpid()),
            name=f"cake-batch-worker-{slot.number}",
            daemon=True,
        )
        slot.process.start()
        there.close()
        slot.conn, slot.ready = here, False

    def _send(self, slot: _Slot, item: Item) -> None:
        slot.item = item
        self.attempts[item[0].key] = self.attempts.get(item[0].key, 0) + 1
        try:
            slot.conn.send(item)
        except OSError:
            pass  # the worker is dying: its sentinel fires next and the row is retried

    def _pump(self) -> None:
        """Wait for the next message or death of any live worker and handle it."""
        live = [s for s in self.slots if s.process]
        if not live:
            raise CakeError("no worker process is left (each died twice)", RERUN_HINT)
        owners = {s.conn: s for s in live} | {s.process.sentinel: s for s in live}
        for ready in connection.wait(list(owners)):
            slot = owners[ready]
            if slot.process is not None and not self._drain(slot):
                self._died(slot)
        for slot in self.slots:  # a worker that just loaded or finished takes a waiting retry
            if slot.ready and slot.item is None and self.retry:
                self._send(slot, self.retry.pop(0))

    def _drain(self, slot: _Slot) -> bool:
        """Handle every message `slot` has sent; False when its process has exited."""
        for _ in range(2):  # once more after it exited: it may have sent a line just before
            try:
                while slot.conn.poll():
                    self._message(slot, slot.conn.recv())
            except (EOFError, OSError):
                pass
            if slot.process.is_alive():
                return True
        return False

    def _message(self, slot: _Slot, message: tuple) -> None:
        kind, payload = message
        if kind == "info":
            if error := load_error(payload):
                raise error
            self.infos.append(payload)
            slot.ready = True  # a restarted worker takes its row again from `retry` (`_pump`)
        elif kind == "line" and slot.item is not None:
            (row, _), slot.item = slot.item, None
            self.finished.append((row, payload))

    def _died(self, slot: _Slot) -> None:
        code = slot.process.exitcode
        slot.conn.close()
        slot.process, slot.ready, item, slot.item = None, False, slot.item, None
        what = f"worker process {slot.number} died (exit code {code})"
        if item is not None:
            row, plan = item
            if self.attempts.get(row.key, 0) >= MAX_ATTEMPTS:
                error = f"the worker process running this row died {MAX_ATTEMPTS} times (last exit code {code})"
                self.finished.append((row, row_line(row, plan.request.task, error=error)))
            else:
                self.retry.append(item)
                what += f" while running {row.document}, which runs again"
        if slot.restarts < MAX_RESTARTS:
            slot.restarts += 1
            self.on_warning(f"{what}; restarting it")
            self._spawn(slot)
        else:
            self.on_warning(f"{what}; it is not restarted again")
