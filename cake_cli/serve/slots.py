"""The one model's request queue: requests run one at a time, in arrival order, behind the running one at
most `capacity` wait, and the next is refused (429). The state (`status`) is what GET /v1/cake/status shows:
the running request's phase and progress (prefill layers, tokens) and the counts since the start."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from cake_cli.serve.errors import BUSY, ApiError


@dataclass
class Job:
    """One admitted request; its progress fields are written by the model's worker thread."""

    id: int
    kind: str  # chat | completion | upload
    document: str | None
    admitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    phase: str = "waiting"  # waiting | preparing | prefill | generating | done | cancelled
    layer: int = 0
    layers: int = 0
    pieces: int = 0  # text pieces streamed so far

    def on_layer(self, index: int, count: int) -> None:
        self.phase, self.layer, self.layers = "prefill", index + 1, count

    def on_text(self, _piece: str) -> None:
        self.phase, self.pieces = "generating", self.pieces + 1

    def view(self) -> dict:
        now = time.perf_counter()
        return {
            "id": self.id,
            "kind": self.kind,
            "document": self.document,
            "phase": self.phase,
            "layer": self.layer,
            "layers": self.layers,
            "pieces": self.pieces,
            "seconds": round(now - (self.started or self.admitted), 3),
        }


class RequestQueue:
    """Admission (`admit`, refusing with 429 when full) and the model's turn (`async with queue.turn(job)`)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._lock = asyncio.Lock()  # FIFO: waiters are woken in arrival order
        self._ids = itertools.count(1)
        self.waiting: list[Job] = []
        self.running: Job | None = None
        self.counts = {"served": 0, "refused_busy": 0, "cancelled": 0, "failed": 0}

    def admit(self, kind: str, document: str | None) -> Job:
        """A place in the queue.

        Raises:
            ApiError: 429 when `capacity` requests already wait behind the running one.
        """
        busy = self.running is not None or self._lock.locked()
        if busy and len(self.waiting) >= self.capacity:
            self.counts["refused_busy"] += 1
            raise ApiError(
                429, f"the server is busy: {len(self.waiting)} requests wait for the model; retry later", BUSY, "busy"
            )
        job = Job(next(self._ids), kind, document)
        self.waiting.append(job)
        return job

    def leave(self, job: Job) -> None:
        """Drop a job that never got its turn (its client went away first); safe to call twice."""
        if job in self.waiting:
            self.waiting.remove(job)

    def turn(self, job: Job) -> _Turn:
        """`async with`: wait for the model, hold it while the body runs."""
        return _Turn(self, job)

    def status(self) -> dict:
        return {
            "running": self.running.view() if self.running else None,
            "waiting": [j.view() for j in self.waiting],
            "capacity": self.capacity,
            **self.counts,
        }


class _Turn:
    def __init__(self, queue: RequestQueue, job: Job):
        self.queue, self.job = queue, job

    async def __aenter__(self) -> Job:
        try:
            await self.queue._lock.acquire()
        finally:
            self.queue.leave(self.job)
        self.queue.running, self.job.started, self.job.phase = self.job, time.perf_counter(), "preparing"
        return self.job

    async def __aexit__(self, kind, exc, tb) -> None:
        self.queue.running = None
        self.queue._lock.release()
