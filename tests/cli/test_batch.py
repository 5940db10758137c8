"""`cake batch` through the real CLI on the tiny random profile: rows equal the single-document
`--json` results, bad rows get their one-line errors, reruns resume, `--workers 2`, and a batch
killed with SIGKILL (the driver, or one worker process) loses no finished row.

The oracle is the single-document command itself: a batch row's `result` must equal what
`cake TASK DOCUMENT --json` prints for the same inputs, every field but the timings.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fpdf import FPDF

from cake_cli.cores import usable_cores
from tests.helpers.batch import TINY, invoke, lines, untimed, write_docs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def docs(cli_env) -> Path:
    folder = cli_env / "docs"
    write_docs(folder, 3)
    return folder


# ---------------------------------------------------------------- rows = single-document --json
def test_rows_equal_single_document_json_results(cli_env, docs):
    manifest = cli_env / "questions.jsonl"
    rows = [{"document": "docs/doc0.txt", "question": "Who holds the copyright?"}, {"document": "docs/doc2.txt"}]
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    out = cli_env / "results.jsonl"
    result = invoke("batch", "qa", manifest, "-o", out, "--field", "question=What is licensed?", *TINY)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "", "the results go to the file; stdout stays empty without --json"
    got = lines(out)
    assert [line["document"] for line in got] == [str(docs / "doc0.txt"), str(docs / "doc2.txt")]
    assert [line["fields"] for line in got] == [
        {"question": "Who holds the copyright?"},
        {"question": "What is licensed?"},
    ]
    for line in got:
        assert line["error"] is None and line["task"] == "qa" and len(line["key"]) == 32
        single = invoke("qa", line["document"], line["fields"]["question"], *TINY, "--json")
        assert single.exit_code == 0, single.stderr
        assert untimed(line["result"]) == untimed(json.loads(single.stdout))
    assert got[0]["result"]["answer"] != got[1]["result"]["answer"] or got[0]["key"] != got[1]["key"]


def test_csv_manifest_and_a_folder_give_the_same_rows(cli_env, docs):
    manifest = cli_env / "m.csv"
    with manifest.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "path"])  # an extra column is ignored; 'path' names the document
        writer.writerows([[n, f"docs/doc{n}.txt"] for n in range(3)])
    from_csv, from_folder = cli_env / "a.jsonl", cli_env / "b.jsonl"
    assert invoke("batch", "summarize", manifest, "-o", from_csv, *TINY).exit_code == 0
    assert invoke("batch", "summarize", docs, "-o", from_folder, "--pattern", "*.txt", *TINY).exit_code == 0
    a, b = lines(from_csv), lines(from_folder)
    assert [x["key"] for x in a] == [x["key"] for x in b]  # same absolute paths, fields and options
    assert [untimed(x["result"]) for x in a] == [untimed(x["result"]) for x in b]


# ---------------------------------------------------------------- bad rows
def test_bad_rows_get_one_line_errors_and_the_batch_goes_on(cli_env, docs):
    (docs / "empty.txt").write_bytes(b"")
    (docs / "blob.bin").write_bytes(bytes(range(256)) * 8)
    pdf = FPDF()
    pdf.add_page()  # a page without text: what a scanned PDF looks like to a text extractor
    pdf.output(str(docs / "scan.pdf"))
    (docs / ".hidden.txt").write_text("skipped", encoding="utf-8")
    out = cli_env / "results.jsonl"
    result = invoke("batch", "summarize", docs, "-o", out, *TINY, "--json")
    assert result.exit_code == 1, result.stderr
    assert "Traceback" not in result.stderr
    by_name = {Path(line["document"]).name: line for line in lines(out)}
    assert sorted(by_name) == ["blob.bin", "doc0.txt", "doc1.txt", "doc2.txt", "empty.txt", "scan.pdf"]
    assert "is empty" in by_name["empty.txt"]["error"]
    assert "looks binary" in by_name["blob.bin"]["error"]
    assert "looks scanned" in by_name["scan.pdf"]["error"]
    for name in ("empty.txt", "blob.bin", "scan.pdf"):
        assert by_name[name]["result"] is None and "\n" not in by_name[name]["error"]
        assert "stdin" not in by_name[name]["error"] and "pipe" not in by_name[name]["error"], "no hint of the CLI's"
        assert by_name[name]["error"] in result.stderr  # shown as it happened
    assert all(by_name[f"doc{n}.txt"]["result"]["answer"] for n in range(3))
    summary = json.loads(result.stdout)
    assert (summary["rows"], summary["done"], summary["failed"], summary["succeeded"]) == (6, 6, 3, False)


def test_a_missing_manifest_document_is_a_row_error(cli_env, docs):
    manifest = cli_env / "m.jsonl"
    manifest.write_text('{"document": "docs/doc0.txt"}\n{"document": "docs/gone.txt"}\n', encoding="utf-8")
    out = cli_env / "results.jsonl"
    result = invoke("batch", "summarize", manifest, "-o", out, *TINY)
    assert result.exit_code == 1
    ok, missing = lines(out)
    assert ok["error"] is None and missing["result"] is None
    assert missing["error"] == f"{cli_env / 'docs' / 'gone.txt'}: no such file — check the path", "no stdin hint"


# ---------------------------------------------------------------- resume
def test_a_rerun_skips_the_rows_already_in_the_output(cli_env, docs):
    out = cli_env / "results.jsonl"
    assert invoke("batch", "summarize", docs, "-o", out, *TINY).exit_code == 0
    before = out.read_bytes()
    write_docs(docs, 5)  # two more documents (the first three are rewritten with the same text)
    again = invoke("batch", "summarize", docs, "-o", out, *TINY, "--json")
    assert again.exit_code == 0, again.stderr
    summary = json.loads(again.stdout)
    assert (summary["rows"], summary["skipped"], summary["done"]) == (5, 3, 2)
    assert out.read_bytes().startswith(before), "the finished rows are left exactly as they were"
    assert [Path(line["document"]).name for line in lines(out)] == [f"doc{n}.txt" for n in range(5)]
    nothing = invoke("batch", "summarize", docs, "-o", out, *TINY, "--json")
    assert nothing.exit_code == 0 and json.loads(nothing.stdout)["done"] == 0
    assert "loading the model" not in nothing.stderr, "nothing to do: no model is loaded"
    kept = out.read_bytes()
    other = invoke("batch", "summarize", docs, "-o", out, *TINY, "-n", "5")  # other options: refused, in one line
    assert other.exit_code == 2 and other.stdout == "" and out.read_bytes() == kept
    assert other.stderr.count("\n") == 1 and "--max-new-tokens 4, this run --max-new-tokens 5" in other.stderr
    assert "-o " + str(cli_env / "results-2.jsonl") in other.stderr
    assert all(line["options"]["max_new_tokens"] == 4 for line in lines(out))


def test_a_rerun_runs_the_failed_rows_again(cli_env, docs):
    (docs / "empty.txt").write_bytes(b"")
    out = cli_env / "results.jsonl"
    assert invoke("batch", "summarize", docs, "-o", out, *TINY).exit_code == 1
    again = invoke("batch", "summarize", docs, "-o", out, *TINY, "--json")  # still empty: fails again
    summary = json.loads(again.stdout)
    assert again.exit_code == 1 and (summary["skipped"], summary["failed_before"], summary["failed"]) == (3, 1, 1)
    assert len(lines(out)) == 4, "the row run again replaced its line: one line per document"
    assert summary["documents_per_hour"] is None and "documents/hour" not in again.stderr, "no rate from failures"
    (docs / "empty.txt").write_text("Now the file has words in it, enough to summarize.", encoding="utf-8")
    fixed = invoke("batch", "summarize", docs, "-o", out, *TINY, "--json")
    summary = json.loads(fixed.stdout)
    assert fixed.exit_code == 0, fixed.stderr
    assert (summary["skipped"], summary["done"], summary["failed"], summary["succeeded"]) == (3, 1, 0, True)
    assert lines(out)[-1]["error"] is None and len(lines(out)) == 4  # the row's last line, in its place


def test_one_worker_follows_the_load_and_threads_do_not_change_the_key(cli_env, docs):
    out = cli_env / "results.jsonl"
    assert invoke("batch", "summarize", docs, "-o", out, *TINY).exit_code == 0
    first = lines(out)
    assert all(line["result"]["threads_reason"].startswith("auto") for line in first)  # not "--threads"
    again = invoke("batch", "summarize", docs, "-o", out, *TINY, "--threads", "1", "--json")
    assert json.loads(again.stdout)["done"] == 0 and len(lines(out)) == len(first)  # same answers: skipped
    other = cli_env / "fixed.jsonl"
    assert invoke("batch", "summarize", docs, "-o", other, *TINY, "--threads", "1").exit_code == 0
    assert {line["result"]["threads_reason"] for line in lines(other)} == {"--threads"}


def test_threads_per_worker_are_capped_at_the_usable_cores(cli_env, docs):
    out = cli_env / "results.jsonl"
    result = invoke("batch", "summarize", docs, "-o", out, *TINY, "--threads", "999", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["threads"] == usable_cores()
    assert result.stderr.count("--threads 999 is more than the") == 1, "one warning, not one per row"
    assert {line["result"]["prefill_threads"] for line in lines(out)} == {usable_cores()}
    assert not any(line["result"]["warnings"] for line in lines(out))


# ---------------------------------------------------------------- workers
@pytest.mark.slow
def test_two_workers_give_the_rows_of_one(cli_env, docs):
    write_docs(docs, 4)
    one, two = cli_env / "one.jsonl", cli_env / "two.jsonl"
    assert invoke("batch", "summarize", docs, "-o", one, *TINY).exit_code == 0
    result = invoke("batch", "summarize", docs, "-o", two, *TINY, "--workers", "2", "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["executor"], summary["workers"], summary["done"]) == ("processes", 2, 4)
    a = {line["key"]: untimed(line["result"]) for line in lines(one)}
    b = {line["key"]: untimed(line["result"]) for line in lines(two)}
    assert a == b
    assert len({line["worker"] for line in lines(two)}) == 2, "both workers took rows"


# ---------------------------------------------------------------- usage errors
@pytest.mark.parametrize(
    "args, code, words",
    [
        (["summarize", "{docs}"], 2, "Missing option"),
        (["summarise", "{docs}", "-o", "{out}"], 2, "did you mean 'summarize'"),
        (["summarize", "{docs}", "-o", "{out}", "--workers", "0"], 2, "--workers must be at least 1"),
        (["qa", "{manifest}", "-o", "{out}"], 2, "no 'question' column"),
        (["summarize", "{docs}", "-o", "{out}", "--pattern", "*.pdf"], 1, "no file in"),
        (["summarize", "{docs}", "-o", "{out}", "--field", "question"], 2, "is not NAME=VALUE"),
        (["summarize", "{docs}", "-o", "{out}", "-b", "4"], 2, "--budget 4 is not above"),
    ],
)
def test_usage_errors_are_one_line(cli_env, docs, args, code, words):
    manifest = cli_env / "m.jsonl"
    manifest.write_text('{"document": "docs/doc0.txt", "quesiton": "typo"}\n', encoding="utf-8")
    subs = {"{docs}": str(docs), "{out}": str(cli_env / "out.jsonl"), "{manifest}": str(manifest)}
    result = invoke("batch", *[subs.get(a, a) for a in args], "-m", "tiny-test")
    assert result.exit_code == code, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr
    assert not (cli_env / "out.jsonl").exists()


def test_an_output_that_is_not_a_results_file_is_refused(cli_env, docs):
    out = cli_env / "notes.txt"
    out.write_text("my notes\n", encoding="utf-8")
    result = invoke("batch", "summarize", docs, "-o", out, *TINY)
    assert result.exit_code == 1 and "is not a cake batch result" in result.stderr
    assert out.read_text(encoding="utf-8") == "my notes\n"


# ---------------------------------------------------------------- killed runs (real processes, SIGKILL)
def spawn_batch(cli_env: Path, docs: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "cake_cli", "batch", "summarize", str(docs), "-o", str(out), *TINY, *extra]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_lines(out: Path, count: int, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out.exists() and out.read_bytes().count(b"\n") >= count:
            return
        if process.poll() is not None:
            pytest.fail(f"the batch ended early: {process.stderr.read()}")
        time.sleep(0.02)
    process.kill()
    pytest.fail("no finished row in time")


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_killed_batch_loses_no_finished_row_and_the_rerun_runs_exactly_the_rest(cli_env, docs, workers):
    write_docs(docs, 5)
    out = cli_env / "results.jsonl"
    process = spawn_batch(cli_env, docs, out, "--workers", workers)
    wait_for_lines(out, 1, process)
    orphans = children(process.pid)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    process.stdout.close()
    process.stderr.close()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in orphans) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in orphans if Path(f"/proc/{pid}").exists()], "the workers exit with their driver"
    kept = out.read_bytes()
    finished = kept.count(b"\n")
    assert 1 <= finished < 5, "killed mid-run"
    with out.open("ab") as f:
        f.write(b'{"key": "a line cut by the kill')  # what a kill in the middle of a write would leave
    rerun = invoke("batch", "summarize", docs, "-o", out, *TINY, "--json")
    assert rerun.exit_code == 0, rerun.stderr
    assert "cut an unfinished last line" in rerun.stderr
    summary = json.loads(rerun.stdout)
    assert (summary["skipped"], summary["done"]) == (finished, 5 - finished)
    assert out.read_bytes().startswith(kept)
    names = [Path(line["document"]).name for line in lines(out)]
    assert sorted(names) == [f"doc{n}.txt" for n in range(5)], "every row exactly once"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_killed_worker_process_is_restarted_and_its_row_runs_again(cli_env, docs):
    write_docs(docs, 4)
    out = cli_env / "results.jsonl"
    process = spawn_batch(cli_env, docs, out, "--workers", "2", "--json")
    wait_for_lines(out, 1, process)
    workers = [pid for pid in children(process.pid) if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == 0, stderr
    assert "died (exit code -9)" in stderr and "restarting it" in stderr
    names = [Path(line["document"]).name for line in lines(out)]
    assert sorted(names) == [f"doc{n}.txt" for n in range(4)], "every row exactly once"
    assert json.loads(stdout)["failed"] == 0
    time.sleep(1.0)
    assert not [pid for pid in workers[1:] if Path(f"/proc/{pid}").exists()], "no worker left behind"
