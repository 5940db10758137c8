"""`cake compress --scoring reconstruct --allocation global` (KVzip's one ranking over layers and KV heads)
through the real CLI on the tiny random profile: a format-4 file whose layers and KV heads keep unequal
shares, reported per head, with fewer bytes than the full cache; answers from it (16 and 4 bits) equal the
same compression in this process; `global` anywhere no reconstruction scores it is a one-line usage error."""

from __future__ import annotations

import json

import pytest

from cake_cli.engine.cachefile import requantized
from cake_cli.tasks.saved import compress as saved_compress
from cake_cli.tasks.saved import fileformat as cachefile
from tests.helpers.cli import TINY, compressed, flat, invoke, one_error_line

QUESTIONS = ["Who holds the copyright?", "What does the license permit?"]
GLOBAL = ("--scoring", "reconstruct", "--allocation", "global")


@pytest.fixture
def ranked(doc, cli_env):
    return compressed(doc, cli_env / "global.cake", *GLOBAL)


def test_a_global_file_keeps_unequal_heads_and_reports_them(ranked, doc, cli_env):
    path, report = ranked
    meta = cachefile.read_saved(path).meta
    assert meta.format_version == cachefile.FORMAT_VERSION == 6 and meta.allocation == "global"
    heads = [layer.heads for layer in meta.layers]
    assert any(h is not None for h in heads), "some layer's KV heads keep different numbers of tokens"
    assert [layer["heads"] for layer in report["layers"]] == heads
    for layer in meta.layers:
        assert layer.kept == (max(layer.heads) if layer.heads else layer.kept)
    assert report["kv_bytes_kept"] < report["kv_bytes_full"] and report["file_bytes"] < report["kv_bytes_full"]
    assert report["method"] == "global+cake"
    text = invoke("compress", doc, "-o", cli_env / "t.cake", *TINY, "-b", "64", *GLOBAL)
    assert text.exit_code == 0, text.stderr
    words = flat(text.stderr)
    assert "tokens per KV head" in words and "full cache" in words and "on disk" in words


@pytest.mark.parametrize("bits", [16, 4])
def test_answers_from_the_file_equal_the_in_process_compression(doc, cli_env, bits, monkeypatch):
    path, _ = compressed(doc, cli_env / f"g{bits}.cake", *GLOBAL, "--kv-bits", str(bits))
    engine_compress = saved_compress.compress_by_reconstruction

    def quantized_here(*args, **kwargs):  # the chat's in-process compression, quantized as the file is
        return requantized(engine_compress(*args, **kwargs), bits, 32, recent=8)

    piped = "\n".join(QUESTIONS) + "\n"
    with monkeypatch.context() as patch:
        patch.setattr(saved_compress, "compress_by_reconstruction", quantized_here)
        chat = invoke("chat", doc, *TINY, "-b", "64", "--dtype", "fp32", *GLOBAL, "-n", "8", "--json", input=piped)
    assert chat.exit_code == 0, chat.stderr
    for turn in map(json.loads, chat.stdout.splitlines()):
        got = json.loads(invoke("qa", path, turn["question"], "-n", "8", "--json").stdout)
        assert got["answer"] == turn["answer"] and got["generated_tokens"] == turn["generated_tokens"] > 0
        assert got["cache"]["kv_bytes"] == turn["cache"]["kv_bytes"]
        assert [x["heads"] for x in got["layers"]] == [x["heads"] for x in turn["layers"]]


def test_global_without_reconstruction_is_refused(doc, cli_env):
    out = cli_env / "x.cake"
    line = one_error_line(invoke("compress", doc, "-o", out, *TINY, "--scoring", "end", "--allocation", "global"),
                          2, "--allocation global")  # fmt: skip
    assert "--scoring reconstruct" in line
    one_error_line(invoke("compress", doc, "-o", out, *TINY, "--allocation", "global"), 2, "--allocation global")
    one_error_line(invoke("qa", doc, "Who?", *TINY, "--allocation", "global"), 2, "--allocation global")
    one_error_line(invoke("inspect-layers", doc, *TINY, "--allocation", "global"), 2, "--allocation global")
    assert not out.exists(), "nothing written"


def test_flash_attention_is_refused_for_a_global_file(ranked, cli_env, monkeypatch):
    from cake_cli.cli.runners import tasks as run
    from cake_cli.tasks import runner

    path, _ = ranked
    real = runner.ready_model

    def flash(*args, **kwargs):  # as if the machine had CUDA and flash-attn
        return runner.ReadyModel(real(*args, **kwargs).loaded, "flash_attention_2")

    monkeypatch.setattr(run, "ready_model", flash)
    out = cli_env / "answer.txt"
    one_error_line(invoke("qa", path, "Who?", "--quiet", "-o", out), 1, "flash_attention_2 cannot mask")
    assert not out.exists()
