"""A `cake batch` worker: loads the model once, then runs checked rows on it and returns their lines.

The same `RowWorker` runs in the driver (`--workers 1`), in each worker process (`--workers N`,
`process_main`) and in each Ray actor (`--ray`), so a row's line never depends on where it ran.
No typer or rich here.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from dataclasses import replace

import torch

from cake_cli.batch.output import failure_message, row_line
from cake_cli.batch.rows import BatchRow
from cake_cli.errors import CakeError
from cake_cli.tasks.request import Plan, TaskRequest
from cake_cli.tasks.runner import ready_model, run_task

PARENT_POLL_SECONDS = 0.5  # a worker process checks this often whether its driver is still alive


class RowWorker:
    """One model, loaded once with `threads` torch threads; `run` takes rows one after another.

    A model that cannot load does not raise here (a Ray actor's constructor must not fail): `info()`
    carries the error, and the executors turn it into a CakeError for the whole batch.
    """

    def __init__(self, request: TaskRequest, threads: int, follow_load: bool = False):
        self.threads = max(1, threads)
        self.follow_load = follow_load  # rows get the default threads (idle cores, decoding follows the load)
        torch.set_num_threads(self.threads)
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.error: tuple[str, str | None, int] | None = None
        self.ready = None
        try:
            self.ready = ready_model(request)
        except CakeError as exc:
            self.error = (exc.message, exc.hint, exc.exit_code)
        except Exception as exc:  # noqa: BLE001 - reported as one line for the whole batch
            self.error = (failure_message(exc), None, 1)

    def info(self) -> dict:
        """Where the worker runs and how its model loaded: worker, threads, device, load_seconds, error."""
        loaded = self.ready.loaded if self.ready else None
        return {
            "worker": self.name,
            "threads": torch.get_num_threads(),
            "device": str(loaded.device) if loaded else None,
            "load_seconds": loaded.load_seconds if loaded else None,
            "error": self.error,
        }

    def run(self, row: BatchRow, plan: Plan) -> dict:
        """Run one checked row (`tasks.planning.plan` of its request) and return its output line.

        A failing row (CakeError or any other exception) gives a line with its one-line error;
        KeyboardInterrupt propagates.
        """
        start = time.perf_counter()
        try:
            # the worker's threads for prefill and decoding, unless it alone has the machine and no
            # --threads was given: then the single-document policy (idle cores, following the load)
            if not self.follow_load:
                plan = replace(plan, request=replace(plan.request, threads=self.threads))
            result = run_task(plan, model=self.ready).to_dict()
        except Exception as exc:  # noqa: BLE001 - the row fails, the batch goes on
            return row_line(
                row,
                plan.request.task,
                error=failure_message(exc),
                seconds=time.perf_counter() - start,
                worker=self.name,
            )
        return row_line(row, plan.request.task, result=result, seconds=time.perf_counter() - start, worker=self.name)


def process_main(conn, request: TaskRequest, threads: int, parent_pid: int) -> None:
    """Body of a `--workers N` process: load, report `("info", dict)`, then answer each
    `(row, plan)` received with `("line", dict)` until None or the pipe closes.

    The worker ignores Ctrl-C (the driver stops it) and exits within PARENT_POLL_SECONDS when its
    driver dies (even SIGKILLed), so a killed batch leaves no process behind.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    worker = RowWorker(request, threads)
    conn.send(("info", worker.info()))
    if worker.error:
        return
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        conn.send(("line", worker.run(*item)))


def _exit_with_parent(parent_pid: int) -> None:
    """Exit the process as soon as its parent is gone (it is re-parented, so getppid changes)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)
