"""Progress on a piped stderr: plain lines (a live bar would show nothing until it ends)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import Progress, TextColumn

from cake_cli.cli import progress as pr


def _piped() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, force_terminal=False), out


def test_piped_progress_prints_labels_and_the_end(monkeypatch):
    console, out = _piped()
    clock = [0.0]
    monkeypatch.setattr(pr.time, "monotonic", lambda: clock[0])
    bar = pr.live_progress(console, TextColumn("x"), label="bench")
    assert isinstance(bar, pr.LineProgress)
    with bar:
        task = bar.add_task("speed", total=3)
        bar.update(task, description="cake @ 1024 tokens")
        bar.advance(task)  # same label, 0 s later: no line
        clock[0] = pr.LINE_SECONDS + 1
        bar.advance(task)  # a while later: a line
        bar.update(task, advance=1, rate="1,234")  # the end: a line
    assert out.getvalue().splitlines() == [
        "bench speed: 0/3",
        "bench cake @ 1024 tokens: 0/3",
        "bench cake @ 1024 tokens: 2/3",
        "bench cake @ 1024 tokens: 3/3 · rate 1,234",
    ]


def test_piped_progress_without_total_and_brackets_kept():
    console, out = _piped()
    with pr.live_progress(console) as bar:
        task = bar.add_task("notes[v2].txt")
        bar.update(task, description="notes[v3].txt", advance=1)
    assert out.getvalue().splitlines() == ["notes[v2].txt: 0", "notes[v3].txt: 1"]


def test_disabled_piped_progress_prints_nothing():
    console, out = _piped()
    with pr.live_progress(console, disable=True) as bar:
        bar.update(bar.add_task("batch", total=1), advance=1)
    assert out.getvalue() == ""


def test_terminal_gets_rich_progress():
    console = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(pr.live_progress(console, TextColumn("x")), Progress)


def test_prefill_layers_show_when_piped_with_the_time_left(monkeypatch):
    progress = pr.StderrProgress(quiet=False)
    out = io.StringIO()
    progress.console = Console(file=out, width=200, force_terminal=False)
    clock = [100.0]
    monkeypatch.setattr(pr.time, "monotonic", lambda: clock[0])
    for layer in range(4):
        progress.layer(layer, 4)
        clock[0] += pr.LINE_SECONDS + 2  # 12 s a layer: a line for each
    assert out.getvalue().splitlines() == [
        "prefill layers: 1/4 · ETA …",
        "prefill layers: 2/4 · ETA 0:24",
        "prefill layers: 3/4 · ETA 0:12",
        "prefill layers: 4/4 · ETA 0:00",
    ]
    out.truncate(0), out.seek(0)
    for layer in range(2):  # a second prefill (another question) gets a bar of its own
        progress.layer(layer, 2)
    assert out.getvalue().splitlines() == ["prefill layers: 1/2 · ETA …", "prefill layers: 2/2 · ETA 0:00"]


def test_clock():
    assert (pr.clock(0.4), pr.clock(12.3), pr.clock(725), pr.clock(3725)) == ("0:00", "0:12", "12:05", "1:02:05")
