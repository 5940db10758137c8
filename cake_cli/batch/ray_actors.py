"""`cake batch --ray ADDRESS`: the rows as tasks of Ray actors, one actor per worker slot.

Each actor is a `batch_worker.RowWorker` (the model loads once per actor, on a GPU when the
cluster has GPUs: one actor per GPU; else `--threads` CPUs each, one actor per node by default).
Ray runs the rows and brings a crashed actor back once (`max_restarts=1`), running its row again
(`max_task_retries=1`); the lines stream back to the driver, the only writer of the output.
Rows are sent already checked, with their document's text (`tasks.planning.plan` ran in the
driver), so the cluster needs no access to the documents; each node needs cake-cli and the model.

ADDRESS: `local` starts a Ray instance on this machine for the batch (stopped after it), with one
actor per usable core by default (at most one per row); `auto`, `HOST:PORT` or `ray://HOST:10001`
connect to a running cluster (Ray's own address forms). Ray's own logging (its warnings, the
actors' output) stays off stderr unless `--verbose`. Ray is an optional dependency
(`pip install 'cake-cli[ray]'`), imported only here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from cake_cli.batch.output import row_line
from cake_cli.batch.pool import RERUN_HINT, load_error
from cake_cli.batch.rows import BatchRow
from cake_cli.batch.worker import RowWorker
from cake_cli.cores import usable_cores
from cake_cli.errors import CakeError, UsageError, first_line
from cake_cli.tasks.request import Plan, TaskRequest

LOCAL = "local"
PASSED_ENV = ("CAKE_", "HF_", "TRANSFORMERS_")  # the driver's variables the actors get (profiles, caches, offline)


def import_ray():
    """The `ray` module. Raises: CakeError (Ray is not installed)."""
    try:
        import ray  # noqa: PLC0415 - optional dependency, needed only for --ray
    except ImportError:
        raise CakeError("--ray needs Ray, which is not installed", "pip install 'cake-cli[ray]'") from None
    return ray


def ray_slots(
    nodes: list[dict], workers: int | None, threads: int | None, default_workers: int | None = None
) -> tuple[int, int, bool]:
    """How many actors and torch threads each, from `ray.nodes()` (alive nodes' `Resources`).

    With GPUs: one actor per GPU by default (`workers` at most the GPU count), 1 thread each
    unless `threads`. Without: `default_workers` actors by default (`--ray local`: one per usable
    core), else one per node, each with the smallest node's CPUs shared by the actors per node,
    unless `threads`.

    Returns:
        (workers, threads, on_gpu).

    Raises:
        CakeError: no alive node. UsageError: the actors do not fit the cluster's GPUs or CPUs.
    """
    alive = [node.get("Resources", {}) for node in nodes if node.get("Alive")]
    if not alive:
        raise CakeError("the Ray cluster has no alive node", "start one with `ray start --head`")
    gpus = sum(int(r.get("GPU", 0)) for r in alive)
    if gpus:
        count = workers or gpus
        if count > gpus:
            raise UsageError(f"--workers {count} is more than the cluster's {gpus} GPUs", f"use --workers {gpus}")
        return count, threads or 1, True
    cpus = [int(r.get("CPU", 0)) for r in alive]
    count = workers or default_workers or len(alive)
    per_node = -(-count // len(alive))  # ceil
    threads = threads or max(1, min(cpus) // per_node)
    fits = sum(c // threads for c in cpus)
    if fits < count:
        raise UsageError(
            f"{count} Ray workers of {threads} CPUs each do not fit the cluster's CPUs ({', '.join(map(str, cpus))})",
            f"use --workers {max(1, fits)} or fewer --threads",
        )
    return count, threads, False


def init_options(address: str, verbose: bool = False) -> dict:
    """`ray.init` keywords for `address`: Ray's log lines and the actors' output reach stderr only
    when `verbose` (else Ray logs errors only, e.g. no token-authentication warning on every run);
    `local` starts an instance without the dashboard, on the usable cores."""
    logs = dict(log_to_driver=verbose, logging_level=logging.INFO if verbose else logging.ERROR)
    if address == LOCAL:
        return dict(address="local", include_dashboard=False, num_cpus=usable_cores(), **logs)
    return dict(address=address, **logs)


def connect(ray, address: str, verbose: bool = False) -> bool:
    """Join `address` (see the module doc; `init_options`); returns True when this call started the
    connection (so `close` ends it). A process already connected (a test's `ray.init`) keeps its instance.

    Raises:
        CakeError: the cluster cannot be reached.
    """
    if ray.is_initialized():
        return False
    try:
        ray.init(**init_options(address, verbose))
    except Exception as exc:  # noqa: BLE001 - Ray raises several types for an unreachable cluster
        raise CakeError(
            f"cannot connect to the Ray cluster at {address}: {first_line(exc)}",
            "start it with `ray start --head`, or use --ray local",
        ) from None
    return True


class RayExecutor:
    """Rows as Ray actor tasks; the same interface as `batch_pool.ProcessExecutor`."""

    kind = "ray"

    def __init__(
        self,
        request: TaskRequest,
        address: str,
        workers: int | None,
        threads: int | None,
        on_warning: Callable[[str], None] | None = None,
        verbose: bool = False,
        rows: int | None = None,
    ):
        self.request, self.address, self.verbose = request, address, verbose
        self.workers, self.threads = workers or 0, threads or 0
        self._asked = (workers, threads)
        # `--ray local` without --workers: one actor per usable core (per --threads cores), at most one per row
        self.default_workers = None
        if address == LOCAL:
            self.default_workers = max(1, min(usable_cores() // (threads or 1), rows or usable_cores()))
        self.on_warning = on_warning or (lambda message: None)
        self.ray = import_ray()
        self.started = False
        self.actors: list = []
        self.idle: list = []
        self.pending: dict = {}  # ObjectRef -> (actor, row, task)

    def start(self) -> list[dict]:
        """Connect, create the actors and wait until each has loaded its model.

        Raises:
            CakeError: Ray is unreachable or a model cannot load; UsageError: the actors do not fit.
        """
        ray = self.ray
        self.started = connect(ray, self.address, self.verbose)
        self.workers, self.threads, on_gpu = ray_slots(ray.nodes(), *self._asked, self.default_workers)
        env = {k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV)}
        actor = ray.remote(RowWorker).options(
            num_cpus=self.threads,
            num_gpus=1 if on_gpu else 0,
            max_restarts=1,
            max_task_retries=1,
            runtime_env={"env_vars": env},
        )
        self.actors = [actor.remote(self.request, self.threads) for _ in range(self.workers)]
        infos = ray.get([a.info.remote() for a in self.actors])
        for info in infos:
            if error := load_error(info):
                raise error
        self.idle = list(self.actors)
        return infos

    def free(self) -> int:
        return len(self.idle)

    def submit(self, row: BatchRow, plan: Plan) -> None:
        actor = self.idle.pop()
        self.pending[actor.run.remote(row, plan)] = (actor, row, plan.request.task)

    def next(self) -> tuple[BatchRow, dict]:
        """The next finished row and its line (blocks). An actor that died for good (twice) gives
        its row an error line and takes no more rows.

        Raises:
            CakeError: no actor is left while rows are in flight.
        """
        if not self.pending:
            raise CakeError("no Ray worker is left", RERUN_HINT)
        (ref,), _ = self.ray.wait(list(self.pending), num_returns=1)
        actor, row, task = self.pending.pop(ref)
        try:
            return row, self.ray.get(ref)
        except self.ray.exceptions.RayActorError as exc:  # died twice: Ray's one restart is spent
            self.actors.remove(actor)
            self.on_warning(f"a Ray worker died running {row.document} and is not restarted again")
            return row, row_line(row, task, error=f"the Ray worker running this row died: {first_line(exc)}")
        except self.ray.exceptions.RayError as exc:  # e.g. the row could not be sent or its line returned
            return row, row_line(row, task, error=f"Ray could not run this row: {first_line(exc)}")
        finally:
            if actor in self.actors:
                self.idle.append(actor)

    def close(self) -> None:
        """Kill the actors; disconnect (and stop a local instance) when `start` connected."""
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001, S110 - already gone
                pass
        self.actors, self.idle, self.pending = [], [], {}
        if self.started:
            self.ray.shutdown()
            self.started = False
