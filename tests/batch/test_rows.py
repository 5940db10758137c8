"""The light parts of `cake batch`: the JSONL appender, reading an existing output, row keys and
manifests (no model, no torch work)."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from cake_cli.batch.driver import BatchSummary
from cake_cli.batch.output import check_same_options, compact, encode_line, read_results
from cake_cli.batch.rows import batch_rows, key_options, option_difference, parse_fields, row_key
from cake_cli.errors import CakeError, UsageError
from cake_cli.files import LineAppender
from cake_cli.tasks.request import TaskRequest
from cake_cli.tasks.templates import load_template


# ---------------------------------------------------------------- LineAppender
def test_appender_writes_whole_lines_and_cuts_a_killed_runs_half_line(tmp_path):
    path = tmp_path / "out.jsonl"
    with LineAppender(path) as out:
        assert out.cut_bytes == 0
        out.write_line('{"key": "a"}')
        out.write_line('{"key": "b", "text": "é"}')
    with path.open("ab") as f:
        f.write(b'{"key": "c", "unfini')
    with LineAppender(path) as out:
        assert out.cut_bytes == len(b'{"key": "c", "unfini')
        out.write_line('{"key": "d"}')
    assert path.read_text(encoding="utf-8") == '{"key": "a"}\n{"key": "b", "text": "é"}\n{"key": "d"}\n'
    with pytest.raises(ValueError):
        LineAppender(path).write_line("two\nlines")


def test_appender_cuts_a_file_that_is_one_half_line(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"x" * 100_000)  # longer than one read-back chunk, no newline at all
    with LineAppender(path) as out:
        assert out.cut_bytes == 100_000
    assert path.read_bytes() == b""


def test_a_second_writer_is_refused_while_the_first_holds_the_file(tmp_path):
    path = tmp_path / "out.jsonl"
    with LineAppender(path, "--output"):
        with pytest.raises(CakeError, match="another run is writing --output"):
            LineAppender(path, "--output")
    LineAppender(path).close()  # free again once the first one closed


def test_appender_makes_a_plain_file(tmp_path):
    path = tmp_path / "out.jsonl"
    LineAppender(path).close()
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


# ---------------------------------------------------------------- read_results
def test_read_results_keeps_the_last_line_of_a_key_and_ignores_a_half_line(tmp_path):
    path = tmp_path / "out.jsonl"
    rows = [{"key": "a", "error": "x"}, {"key": "b", "error": None}, {"key": "a", "error": None}]
    path.write_text("".join(encode_line(r) + "\n" for r in rows) + '{"key": "c"', encoding="utf-8")
    assert read_results(path) == {"a": True, "b": True}
    assert read_results(tmp_path / "missing.jsonl") == {}


@pytest.mark.parametrize("text", ["hello\n", '["key"]\n', '{"no": "key"}\n', b"\xff\xfe\n"])
def test_read_results_refuses_a_file_that_is_not_a_batch_output(tmp_path, text):
    path = tmp_path / "out.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CakeError, match="line 1 is not a cake batch result"):
        read_results(path)


def test_compact_keeps_one_line_per_key_the_last_in_the_first_ones_place(tmp_path):
    path = tmp_path / "out.jsonl"
    rows = [{"key": "a", "error": "x"}, {"key": "b", "error": None}, {"key": "a", "error": None, "n": 2}]
    path.write_text("".join(encode_line(r) + "\n" for r in rows), encoding="utf-8")
    path.chmod(0o640)
    assert compact(path) == 1
    assert path.read_text(encoding="utf-8").splitlines() == [encode_line(rows[2]), encode_line(rows[1])]
    assert path.stat().st_mode & 0o777 == 0o640, "rewritten with the file's own mode"
    before = path.stat().st_mtime_ns
    assert compact(path) == 0 and path.stat().st_mtime_ns == before, "one line per key already: untouched"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"], "no temporary file left"


# ---------------------------------------------------------------- keys and rows
BASE = TaskRequest(task="qa", document="", model="smollm2", budget=256)


def test_an_output_of_other_options_is_refused_naming_the_option(tmp_path):
    path = tmp_path / "out.jsonl"
    made = key_options(replace(BASE, max_new_tokens=60))
    path.write_text(encode_line({"key": "a", "error": None, "options": made}) + "\n", encoding="utf-8")
    check_same_options(path, made)  # the same options: fine
    (tmp_path / "out-2.jsonl").touch()
    with pytest.raises(UsageError) as error:
        check_same_options(path, key_options(replace(BASE, max_new_tokens=61)))
    assert error.value.one_line() == (
        f"--output {path} holds rows made with other options (--max-new-tokens 60, this run --max-new-tokens 61) — "
        f"rerun with the file's options to resume it, or start a new file, e.g. -o {tmp_path / 'out-3.jsonl'}"
    )
    default = "--max-new-tokens 60, this run no --max-new-tokens (its default)"
    assert option_difference(made, key_options(BASE)) == default
    sampled = key_options(replace(BASE, sampling=replace(BASE.sampling, temperature=0.7)))
    assert option_difference(key_options(BASE), sampled) == "--temperature 0.0, this run --temperature 0.7"
    assert option_difference(key_options(BASE), key_options(replace(BASE, task="summarize"))).startswith("TASK qa")
    check_same_options(tmp_path / "new.jsonl", made)  # no file yet: nothing to contradict


def test_rates_count_only_rows_that_succeeded():
    """A rerun whose only rows fail again at once reported '146,207 documents/hour, 0 tokens/s'."""
    failing = BatchSummary("out.jsonl", rows=4, skipped=3, failed_before=1, done=1, failed=1, run_seconds=0.02)
    assert failing.to_dict()["documents_per_hour"] is None and failing.to_dict()["tokens_per_second"] is None
    nothing = BatchSummary("out.jsonl", rows=4, skipped=4, failed_before=0)
    assert nothing.to_dict()["documents_per_hour"] is None
    mixed = BatchSummary("out.jsonl", rows=4, skipped=0, failed_before=0, done=4, failed=1, tokens=600, run_seconds=60)
    assert (mixed.to_dict()["documents_per_hour"], mixed.to_dict()["tokens_per_second"]) == (180.0, 10.0)


def test_row_key_covers_document_fields_and_options_but_not_the_password(tmp_path, monkeypatch):
    doc = tmp_path / "a.txt"
    one = replace(BASE, document=str(doc), fields={"question": "Who?"})
    monkeypatch.chdir(tmp_path)
    assert row_key(one) == row_key(replace(one, document="a.txt")), "absolute path"
    assert row_key(one) == row_key(replace(one, password="secret"))
    for other in (
        replace(one, document=str(tmp_path / "b.txt")),
        replace(one, fields={"question": "Why?"}),
        replace(one, budget=512),
        replace(one, method="snapkv"),
        replace(one, max_new_tokens=10),
        replace(one, task="summarize"),
    ):
        assert row_key(other) != row_key(one)
    assert len(row_key(one)) == 32 and int(row_key(one), 16) >= 0


def test_manifest_rows_fields_and_duplicates(tmp_path):
    (tmp_path / "sub").mkdir()
    manifest = tmp_path / "sub" / "m.jsonl"
    records = [
        {"document": "a.txt", "question": "Who?", "label": 3},
        {"document": str(tmp_path / "b.txt")},
        {"document": "a.txt", "question": "Who?"},  # the same row again
        {"document": "a.txt", "question": ""},  # a blank field: the row fails when it is checked
    ]
    manifest.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    rows, duplicates = batch_rows(
        str(manifest), BASE, load_template("qa"), "*", {"question": "Default?"}, tmp_path / "o.jsonl"
    )
    assert duplicates == 1
    assert [(r.document, r.fields) for r in rows] == [
        (str(tmp_path / "sub" / "a.txt"), {"question": "Who?"}),
        (str(tmp_path / "b.txt"), {"question": "Default?"}),
        (str(tmp_path / "sub" / "a.txt"), {"question": ""}),
    ]
    assert [r.index for r in rows] == [0, 1, 2]


def test_folder_rows_skip_hidden_files_and_the_output(tmp_path):
    for name in ("b.txt", "a.pdf", ".hidden", "results.jsonl"):
        (tmp_path / name).write_text("x")
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "c.txt").write_text("x")
    summarize = load_template("summarize")
    rows, _ = batch_rows(str(tmp_path), BASE, summarize, "*", {}, tmp_path / "results.jsonl")
    assert [r.document for r in rows] == [str(tmp_path / n) for n in ("a.pdf", "b.txt")]
    rows, _ = batch_rows(str(tmp_path), BASE, summarize, "**/*.txt", {}, tmp_path / "results.jsonl")
    assert [r.document for r in rows] == [str(tmp_path / "b.txt"), str(tmp_path / "deep" / "c.txt")]


@pytest.mark.parametrize(
    "name, text, error, words",
    [
        ("m.jsonl", '{"document": "a"}\nnot json\n', CakeError, "line 2 is not JSON"),
        ("m.jsonl", "[1, 2]\n", CakeError, "line 1 is not a JSON object"),
        ("m.jsonl", "\n\n", CakeError, "has no rows"),
        ("m.csv", "file,question\na.txt,Who?\n", UsageError, "no 'document' column"),
        ("m.csv", "document,questoin\na.txt,Who?\n", UsageError, "did you mean 'questoin'"),
        ("m.jsonl", '{"document": "", "question": "q"}\n', CakeError, "row 1 has no document"),
        ("m.txt", "a.txt\n", UsageError, "neither a folder nor a manifest"),
    ],
)
def test_bad_manifests_are_one_line_errors(tmp_path, name, text, error, words):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(error, match=words):
        batch_rows(str(path), BASE, load_template("qa"), "*", {}, tmp_path / "o.jsonl")


def test_parse_fields():
    assert parse_fields(["question=Who = me?", " q2 ="]) == {"question": "Who = me?", "q2": ""}
    with pytest.raises(UsageError):
        parse_fields(["=x"])
