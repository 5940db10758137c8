"""`cake batch --ray` on a local Ray instance (2 CPUs) that this module starts once and shares:
the rows equal those of `--workers 1`, bad rows and resume work the same, and an actor killed
mid-run is brought back by Ray with its row run again. Skipped when Ray is not installed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

import pytest

from cake_cli.batch.ray_actors import LOCAL, RayExecutor, connect, init_options, ray_slots
from cake_cli.cores import usable_cores
from cake_cli.errors import CakeError, UsageError
from cake_cli.tasks.request import TaskRequest
from tests.helpers.batch import TINY, invoke, lines, untimed, write_docs

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (start-up takes seconds); the CLI joins it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_rows_equal_the_rows_of_one_local_worker(local_ray, cli_env):
    docs = cli_env / "docs"
    write_docs(docs, 4)
    (docs / "empty.txt").write_bytes(b"")
    local, on_ray = cli_env / "local.jsonl", cli_env / "ray.jsonl"
    assert invoke("batch", "summarize", docs, "-o", local, *TINY).exit_code == 1  # the empty file
    result = invoke("batch", "summarize", docs, "-o", on_ray, *TINY, "--ray", "local", "--workers", "2", "--json")
    assert result.exit_code == 1, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["executor"], summary["workers"], summary["threads"]) == ("ray", 2, 1)
    assert (summary["done"], summary["failed"]) == (5, 1)
    a = {line["key"]: (line["error"], line["result"] and untimed(line["result"])) for line in lines(local)}
    b = {line["key"]: (line["error"], line["result"] and untimed(line["result"])) for line in lines(on_ray)}
    assert a == b
    workers = {line["worker"] for line in lines(on_ray) if line["result"]}
    assert len(workers) == 2 and all(w.split(":")[1] != str(os.getpid()) for w in workers), "rows ran in the actors"
    again = invoke("batch", "summarize", docs, "-o", on_ray, *TINY, "--ray", "local", "--json")
    summary = json.loads(again.stdout)  # the finished rows are skipped; the failed one runs again
    assert (summary["skipped"], summary["done"], summary["failed"]) == (4, 1, 1) and len(lines(on_ray)) == 5


def test_a_killed_ray_actor_is_restarted_and_its_row_runs_again(local_ray, cli_env):
    docs = cli_env / "docs"
    write_docs(docs, 4)
    out = cli_env / "results.jsonl"
    killed, finished = [], threading.Event()

    def kill_the_first_worker():  # as soon as a row is written, SIGKILL the actor that wrote it
        while not finished.is_set() and not killed:  # (actors can take minutes to start on a busy machine)
            if out.exists() and out.read_bytes().count(b"\n") >= 1:
                pid = int(lines(out)[0]["worker"].split(":")[1])
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_the_first_worker)
    watcher.start()
    result = invoke("batch", "summarize", docs, "-o", out, *TINY, "--ray", "local", "--json")
    finished.set()
    watcher.join()
    assert killed and result.exit_code == 0, result.stderr
    got = lines(out)
    assert sorted(line["document"] for line in got) == sorted(str(p) for p in docs.iterdir()), "every row once"
    assert killed[0] not in {int(line["worker"].split(":")[1]) for line in got[1:]}, "a new actor ran the rest"


# ---------------------------------------------------------------- slots (no cluster needed)
def node(cpus: int, gpus: int = 0, alive: bool = True) -> dict:
    return {"Alive": alive, "Resources": {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {})}}


def test_ray_slots_cpu_nodes_share_their_cores():
    assert ray_slots([node(2)], None, None) == (1, 2, False)
    assert ray_slots([node(2)], 2, None) == (2, 1, False)
    assert ray_slots([node(16), node(8), node(4, alive=False)], None, None) == (2, 8, False)
    assert ray_slots([node(16), node(16)], 4, None) == (4, 8, False)
    with pytest.raises(UsageError, match="do not fit"):
        ray_slots([node(2)], 2, 2)
    with pytest.raises(CakeError, match="no alive node"):
        ray_slots([node(4, alive=False)], None, None)


def test_ray_local_defaults_to_one_actor_per_usable_core():
    """`--ray local` ran one actor (170 s against 51 s with --workers 2 on 4 documents)."""
    assert ray_slots([node(4)], None, None, default_workers=4) == (4, 1, False)
    assert ray_slots([node(32, gpus=2)], None, None, default_workers=4) == (2, 1, True), "GPUs: one per GPU"
    request = TaskRequest(task="summarize", document="")
    cores = usable_cores()
    assert RayExecutor(request, LOCAL, None, None, rows=100).default_workers == cores
    assert RayExecutor(request, LOCAL, None, None, rows=1).default_workers == 1, "no more actors than rows"
    assert RayExecutor(request, "auto", None, None, rows=100).default_workers is None, "a cluster: one per node"


class FakeRay:
    def __init__(self):
        self.calls = []

    def is_initialized(self):
        return False

    def init(self, **kwargs):
        self.calls.append(kwargs)


def test_rays_own_logging_stays_off_stderr_unless_verbose():
    """Ray printed its token-authentication warning on every run (a WARNING of its logger, checked by
    hand: gone at logging_level ERROR) and the actors' output went to the driver."""
    quiet, loud = FakeRay(), FakeRay()
    assert connect(quiet, LOCAL) and connect(loud, "ray://head:10001", verbose=True)
    assert quiet.calls == [
        dict(address="local", include_dashboard=False, num_cpus=usable_cores(), log_to_driver=False,
             logging_level=logging.ERROR)
    ]  # fmt: skip
    assert loud.calls == [dict(address="ray://head:10001", log_to_driver=True, logging_level=logging.INFO)]
    assert init_options("auto")["logging_level"] == logging.ERROR


def test_ray_slots_one_actor_per_gpu():
    assert ray_slots([node(32, gpus=4), node(32, gpus=4)], None, None) == (8, 1, True)
    assert ray_slots([node(32, gpus=4)], 2, 4) == (2, 4, True)
    with pytest.raises(UsageError, match="more than the cluster's 4 GPUs"):
        ray_slots([node(32, gpus=4)], 5, None)
