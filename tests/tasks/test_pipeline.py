"""The task pipeline (`tasks.pipeline`) on the tiny profile: `stream` hands out exactly the text `run` streams,
for a fresh prefill and for a compressed prefix alike; a compressed prefix saved and read back answers as the
one in memory; `cancel` stops a run between pieces and frees the model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cake_cli.tasks import pipeline
from cake_cli.tasks.planning import plan
from cake_cli.tasks.request import COMPRESS, Callbacks, TaskRequest
from cake_cli.tasks.runner import load_ready
from tests.helpers.texts import license_text

QUESTION = "Who may use the software?"


@pytest.fixture
def setup(cli_env):
    doc = cli_env / "notes.txt"
    doc.write_text(license_text()[:1300], encoding="utf-8")
    request = TaskRequest(
        task="qa", document=str(doc), fields={"question": QUESTION}, model="tiny-test", budget=64, max_new_tokens=12
    )
    return load_ready("tiny-test", "float32", "auto"), request, cli_env


def streamed(ready, checked, prefix=pipeline.FRESH):
    """(the text `run` streamed through its callback, its result)."""
    pieces = []
    result = pipeline.run(ready, checked, prefix, Callbacks(on_text=pieces.append))
    return "".join(pieces), result


@pytest.mark.parametrize("compressed", [False, True])
def test_stream_iterator_gives_what_run_streams(setup, compressed):
    ready, request, _ = setup
    checked = plan(request)
    prefix = pipeline.open_prefix(ready, checked) if compressed else pipeline.FRESH
    text, result = streamed(ready, checked, prefix)
    it = pipeline.stream(ready, checked, prefix)
    assert "".join(it) == text and text.strip() == result.printed
    assert it.result.printed == result.printed and it.result.generated_tokens == result.generated_tokens
    it.close()
    assert not it.cancelled  # closing a finished run cancels nothing
    assert (it.result.cache is not None) is compressed


def test_saved_prefix_answers_as_the_one_in_memory(setup):
    ready, request, folder = setup
    whole = pipeline.open_prefix(ready, plan(replace(request, task=COMPRESS, fields={})))
    path = folder / "notes.cake"
    assert pipeline.save_prefix(whole, path) == path.stat().st_size
    on_file = plan(replace(request, document=str(path)))
    from_file = pipeline.run(ready, on_file, pipeline.open_prefix(ready, on_file))
    in_memory = pipeline.run(ready, on_file, whole)
    assert from_file.printed == in_memory.printed and from_file.cache.path == str(path)
    with pytest.raises(Exception, match="no compressed document"):
        pipeline.save_prefix(pipeline.FRESH, folder / "x.cake")


def test_cancel_stops_between_pieces(setup):
    ready, request, _ = setup
    checked = plan(replace(request, max_new_tokens=1000))
    it = pipeline.stream(ready, checked)
    next(it)
    it.cancel()
    with pytest.raises(pipeline.Cancelled):
        for _ in it:
            pass
    assert it.cancelled and it.result is None and not it._thread.is_alive()
