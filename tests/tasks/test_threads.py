"""Thread choice (`tasks.threads`): auto from idle cores, --threads fixed, decoding following the load."""

from __future__ import annotations

import types

import pytest
import torch

from cake_cli.cores import capped_threads
from cake_cli.tasks import threads as th


def test_auto_uses_idle_cores_for_prefill_and_decode_start():
    quiet = th.choose(None, idle=1.96, cores=2)
    assert (quiet.prefill, quiet.decode, quiet.adaptive) == (2, 2, True)
    busy = th.choose(None, idle=0.9, cores=2)
    assert (busy.prefill, busy.decode) == (1, 1)
    assert "0.9 of 2 cores idle" in busy.reason
    assert th.choose(None, idle=0.0, cores=2).prefill == 1  # never zero threads


def test_requested_threads_are_fixed():
    fixed = th.choose(3, idle=0.1, cores=2)
    assert (fixed.prefill, fixed.decode, fixed.adaptive, fixed.reason) == (3, 3, False, "--threads")
    with pytest.raises(ValueError, match="at least 1"):
        th.choose(0)


def test_threads_above_the_usable_cores_are_capped_with_a_warning():
    assert capped_threads(999, cores=2) == (
        2,
        "--threads 999 is more than the 2 usable cores of this machine: using 2 (more threads than cores only "
        "wait for each other)",
    )
    assert capped_threads(2, cores=2) == (2, None) and capped_threads(None, cores=2) == (None, None)
    assert capped_threads(3, cores=1)[1].startswith("--threads 3 is more than the 1 usable core of")


def test_one_core_is_never_adaptive():
    assert th.choose(None, idle=1.0, cores=1).adaptive is False


@pytest.mark.parametrize(
    ("cores", "others", "expected"), [(2, 0.1, 2), (2, 0.49, 2), (2, 0.7, 1), (2, 1.9, 1), (4, 1.0, 3), (4, 6.0, 1)]
)
def test_free_cores(cores, others, expected):
    assert th.free_cores(cores, others) == expected


def test_cpu_times_reads_idle_and_total(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 20 1 2 0 0 0\ncpu0 50 2 25 400 10 0 1 0 0 0\n")
    assert th._cpu_times(stat) == (820, 978)
    assert th._cpu_times(tmp_path / "missing") is None


class _Clock:
    """A fake machine: wall time, this process's CPU seconds and /proc/stat, advanced by hand."""

    def __init__(self, stat, monkeypatch):
        self.stat, self.wall, self.mine, self.busy, self.idle = stat, 0.0, 0.0, 0, 0
        monkeypatch.setattr(th.time, "perf_counter", lambda: self.wall)
        monkeypatch.setattr(th.os, "times", lambda: types.SimpleNamespace(user=self.mine, system=0.0))
        self.write()

    def write(self):
        self.stat.write_text(f"cpu  {self.busy} 0 0 {self.idle} 0 0 0 0 0 0\n")

    def advance(self, seconds, mine_cores, others_cores, cores=2, tick=100):
        """`seconds` pass with this process on `mine_cores` and others on `others_cores`."""
        self.wall += seconds
        self.mine += seconds * mine_cores
        busy = round(seconds * (mine_cores + others_cores) * tick)
        self.busy += busy
        self.idle += round(seconds * cores * tick) - busy
        self.write()


def _steps(governor, n):
    for _ in range(n):
        governor.step()


def test_governor_follows_other_processes_load(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    clock = _Clock(stat, monkeypatch)
    monkeypatch.setattr(th.os, "sysconf", lambda name: 100)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        governor = th.DecodeGovernor(th.Threads(2, 2, "auto", adaptive=True), cores=2, stat=stat)
        clock.advance(1.0, mine_cores=1.3, others_cores=0.7)  # a busy loop started on the other core
        _steps(governor, th.CHECK_TOKENS - 1)
        assert torch.get_num_threads() == 2  # not yet: only every CHECK_TOKENS steps
        governor.step()
        assert (torch.get_num_threads(), governor.count) == (1, 1)
        clock.advance(1.0, mine_cores=1.0, others_cores=0.0)  # it ended
        _steps(governor, th.CHECK_TOKENS)
        assert (torch.get_num_threads(), governor.used) == (2, {1, 2})
        clock.advance(0.1, mine_cores=1.0, others_cores=1.0)  # too short an interval to judge
        _steps(governor, th.CHECK_TOKENS)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_governor_leaves_fixed_threads_alone(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    clock = _Clock(stat, monkeypatch)
    monkeypatch.setattr(th.os, "sysconf", lambda name: 100)
    before = torch.get_num_threads()
    try:
        with th.decoding(th.Threads(2, 2, "--threads")) as governor:
            clock.advance(1.0, mine_cores=1.0, others_cores=1.0)
            _steps(governor, 4 * th.CHECK_TOKENS)
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == before  # restored after the block
    finally:
        torch.set_num_threads(before)


def test_governor_without_proc_stat_changes_nothing(tmp_path):
    governor = th.DecodeGovernor(th.Threads(2, 2, "auto", adaptive=True), cores=2, stat=tmp_path / "missing")
    seen = []
    on_token = governor.wrap(seen.append)
    for token in range(3 * th.CHECK_TOKENS):
        on_token(token)
    assert seen == list(range(3 * th.CHECK_TOKENS))
    assert governor.count == 2 and governor.steps == 3 * th.CHECK_TOKENS


def test_decode_following_load_steps_the_governor_per_token_and_keeps_the_callback():
    seen = []

    def fake_decode(a, b, *, on_token=None, extra=None):
        for token in range(3):
            on_token(token)
        return (a, b, extra, torch.get_num_threads())

    before = torch.get_num_threads()
    out = th.decode_following_load(th.Threads(1, 1, "--threads"), fake_decode, "x", "y", on_token=seen.append, extra=7)
    assert out == ("x", "y", 7, 1) and seen == [0, 1, 2]
    assert torch.get_num_threads() == before
