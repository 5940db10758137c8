"""`cake compress --scoring reconstruct` through the real CLI on the tiny random profile: a file that
holds only the budget, answers from it equal the answers from the same compression in this process,
and the options it cannot go with are one-line usage errors."""

from __future__ import annotations

import json

import pytest

from cake_cli.tasks.saved import fileformat as cachefile
from tests.helpers.cli import TINY, compressed, invoke, one_error_line

QUESTIONS = ["Who holds the copyright?", "What does the license permit?"]


@pytest.fixture
def rebuilt(doc, cli_env):
    """A .cake scored by reconstruction (CAKE budgets)."""
    return compressed(doc, cli_env / "rec.cake", "--scoring", "reconstruct")


def test_reconstruct_file_holds_only_the_budget(rebuilt, doc, cli_env):
    path, report = rebuilt
    meta = cachefile.read_saved(path).meta
    assert report["scoring"] == meta.scoring == "reconstruct" and meta.evicted and report["evicted"]
    kept = [layer.kept for layer in meta.layers]
    assert 64 * 4 - 4 <= sum(kept) <= 64 * 4, "B·L tokens (the window included)"
    assert [layer.budget + 8 for layer in meta.layers] == kept
    assert all(layer.dispersion and layer.shift for layer in meta.layers), "statistics of the reconstruction rows"
    assert meta.probe_ids, "the repeat prompt's ids are recorded"
    _, whole = compressed(doc, cli_env / "whole.cake")
    assert report["file_bytes"] < whole["file_bytes"] / 3 and report["kv_bytes_kept"] < report["kv_bytes_full"]
    assert report["eviction_seconds"] > 0, "reconstruction + eviction time is reported"


def test_uniform_allocation_and_the_text_report(doc, cli_env):
    path, report = compressed(doc, cli_env / "uni.cake", "--scoring", "reconstruct", "--allocation", "uniform")
    assert len({layer["kept"] for layer in report["layers"]}) == 1 and report["evicted"]
    text = invoke("compress", doc, "-o", cli_env / "t.cake", *TINY, "-b", "64", "--scoring", "reconstruct")
    assert text.exit_code == 0 and text.stdout == "", text.stderr
    assert "repeating the document" in text.stderr and "summed over heads and reconstruction rows" in text.stderr
    assert "reconstruction: chunk 1 of 1" in text.stderr


def test_answers_from_the_file_equal_the_in_process_compression(rebuilt, doc):
    path, _ = rebuilt
    piped = "\n".join(QUESTIONS) + "\n"
    chat = invoke("chat", doc, *TINY, "-b", "64", "--dtype", "fp32", "--scoring", "reconstruct", "-n", "8", "--json",
                  input=piped)  # fmt: skip
    assert chat.exit_code == 0, chat.stderr
    for turn in map(json.loads, chat.stdout.splitlines()):
        got = json.loads(invoke("qa", path, turn["question"], "-n", "8", "--json").stdout)
        assert got["answer"] == turn["answer"]
        # two prefills (the file's, the chat's): the same budgets and tokens kept; statistics equal up to
        # float rounding, since the thread count (and so the reduction order) may differ between runs
        for mine, theirs in zip(got["layers"], turn["layers"], strict=True):
            assert {k: v for k, v in mine.items() if not isinstance(v, float)} == {
                k: v for k, v in theirs.items() if not isinstance(v, float)
            }
            assert all(v == pytest.approx(theirs[k], rel=1e-9) for k, v in mine.items() if isinstance(v, float))
        assert got["cache"]["scoring"] == "reconstruct" and got["cache"]["kv_bytes"] == turn["cache"]["kv_bytes"]


def test_reconstruct_refuses_what_it_cannot_go_with(doc, cli_env):
    out = cli_env / "x.cake"
    line = one_error_line(invoke("compress", doc, "-o", out, *TINY, "--scoring", "reconstruct", "--method", "full"),
                          2, "--method full")  # fmt: skip
    assert "--scoring question" in line
    line = one_error_line(invoke("compress", doc, "-o", out, *TINY, "--scoring", "reconstruct", "--method", "snapkv"),
                          2, "snapkv indicator")  # fmt: skip
    one_error_line(invoke("chat", doc, *TINY, "--scoring", "reconstruct", "--method", "full"), 2, "--method full")
    assert not out.exists(), "nothing written"
