"""`cake qa`, `cake needle`, `cake complete` through the real CLI (CliRunner) on the tiny random profile.

The tiny model's words are random, so tests that need a known answer feed it through the real
engine by teacher forcing (`generate(..., forced_tokens=...)`): prefill, eviction, streaming,
post-processing, location, report and JSON all run for real.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cake_cli.cli.main import app
from cake_cli.tasks.answers.completion import filter_code
from tests.helpers.texts import license_text

runner = CliRunner()
NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
TINY = ["-m", "tiny-test", "-b", "64"]


@pytest.fixture
def doc(cli_env):
    path = cli_env / "notes.txt"
    path.write_text(license_text()[:1300], encoding="utf-8")  # ~1,300 tiny-tokenizer tokens: fits its 1500
    return path


@pytest.fixture
def code_file(cli_env):
    path = cli_env / "wrap.py"
    path.write_text(
        "import textwrap\n\n\ndef wrap(text, width=70):\n    lines = textwrap.wrap(text, width)\n"
        "    return '\\n'.join(lines)\n\n\ndef shout(text):\n    return text.upper()\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def forced(monkeypatch, tiny_profile_dir):
    """`forced(text)`: from now on the engine generates exactly `text` (teacher forcing)."""
    from transformers import AutoTokenizer

    from cake_cli.tasks import runner as engine  # the runner's reference to engine.generate.decode

    real = engine.decode
    tokenizer = AutoTokenizer.from_pretrained(tiny_profile_dir.parent / "model")

    def use(text: str) -> None:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]

        def decode(*args, **kwargs):
            kwargs["max_new_tokens"] = len(ids)
            return real(*args, forced_tokens=ids, **kwargs)

        monkeypatch.setattr(engine, "decode", decode)

    return use


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def one_error_line(result, code: int, words: str) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], lines


# ---------------------------------------------------------------- qa
def test_q_means_quiet_in_qa_too(doc):
    """One meaning for -q in every command: --quiet (several questions are arguments)."""
    quiet = invoke("qa", doc, "Who holds the copyright?", *TINY, "-n", "3", "-q")
    assert quiet.exit_code == 0, quiet.stderr
    assert quiet.stdout.strip(), "the answer"
    # no report and no progress; warnings (here: the random model's answer cites no passage) still show
    assert all(line.startswith("warning: ") for line in quiet.stderr.splitlines()), quiet.stderr
    for command in ("summarize", "qa", "needle", "complete", "chat", "compress", "inspect-layers", "batch"):
        line = next(line for line in invoke(command, "--help").stdout.splitlines() if "--quiet" in line)
        assert line.split("--quiet")[1].split()[0] == "-q", command


def test_qa_answer_on_stdout_report_on_stderr(doc):
    streamed = invoke("qa", doc, "Who holds the copyright?", *TINY, "-n", "10")
    as_json = invoke("qa", doc, "Who holds the copyright?", *TINY, "-n", "10", "--json")
    assert streamed.exit_code == 0 and as_json.exit_code == 0, streamed.stderr
    data = json.loads(as_json.stdout)
    assert streamed.stdout.strip() == data["reply"], "stdout carries the reply and nothing else"
    support = data["support"]
    assert data["answer"] == support["answer"] or support["status"] == "abstained" or support["withheld"]
    if support["withheld"]:  # a random model's reply from outside the document: the default withholds it
        assert data["answer"] == "not supported by the document" and data["raw_answer"] == support["answer"]
    assert "CAKE report · qa" in streamed.stderr and "allocation across layers" in streamed.stderr
    assert "CAKE report" not in as_json.stderr  # --json: the report is in the JSON; progress stays on stderr
    assert "prefill: " in as_json.stderr and "prefill: " in streamed.stderr


def test_qa_json_schema_and_stdin(doc):
    via_file = invoke("qa", doc, "Who?", *TINY, "-n", "6", "--json")
    via_stdin = invoke("qa", "-", "Who?", *TINY, "-n", "6", "--json", input=doc.read_text())
    assert via_file.exit_code == 0 and via_stdin.exit_code == 0, via_stdin.stderr
    data = json.loads(via_file.stdout)
    for key in (
        "task",
        "answer",
        "model",
        "prompt_tokens",
        "budget",
        "window",
        "layers",
        "saved_fraction",
        "location",
        "raw_answer",
        "warnings",
        "cake_cli_version",
    ):
        assert key in data
    assert data["task"] == "qa" and data["budget"] == 64 and data["window"] == 8 and data["evicted"]
    assert data["location"] is None  # a random model's reply: not located
    assert data["support"]["withheld"] is (data["raw_answer"] is not None)  # the answer withheld is kept there
    assert data["support"]["status"] in ("unsupported", "abstained") and set(data["support"]) == {
        "status", "answer", "passage", "reason", "withheld", "abstain_probability",
    }  # fmt: skip
    assert json.loads(via_stdin.stdout)["answer"] == data["answer"]
    assert json.loads(via_stdin.stdout)["prompt_tokens"] == data["prompt_tokens"]


def test_qa_window_option(doc):
    result = invoke("qa", doc, "Who?", *TINY, "-w", "16", "-n", "4", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["window"] == 16 and all(layer["kept"] == layer["budget"] + 16 for layer in data["layers"])


def test_qa_usage_errors(doc):
    missing = invoke("qa", doc, *TINY)
    assert missing.exit_code == 2 and missing.stdout == ""
    one_error_line(invoke("qa", doc, "   ", *TINY), 2, "question")
    one_error_line(invoke("qa", doc, "Who?", "-m", "tiny-test", "-b", "4"), 2, "window")
    one_error_line(invoke("qa", doc, "Who?", *TINY, "--truncate", "sideways"), 2, "truncate")
    one_error_line(invoke("qa", "missing.txt", "Who?", *TINY), 1, "missing.txt")


def test_a_looping_answer_stops_with_a_reason(doc, forced):
    forced("Ian M." + " M." * 30)  # what SmolLM2 answered at B = 256 for 64 tokens
    result = invoke("qa", doc, "Who signed?", *TINY, "--json", "--abstain", "never")  # the answer as given
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["stop_reason"] == "repetition" and data["generated_tokens"] < 20
    assert data["answer"].startswith("Ian M.") and data["answer"].count("M.") <= 6
    report = invoke("qa", doc, "Who signed?", *TINY)
    assert "stopped by a loop: the answer began repeating itself" in report.stderr


def test_method_full_reports_the_full_cache_only(doc):
    result = invoke("qa", doc, "Who?", *TINY, "-n", "3", "--method", "full", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["budget"] is None and data["tau1"] is None and data["allocation"] is None
    assert data["eviction_seconds"] == 0.0 and not data["evicted"] and data["saved_fraction"] == 0.0
    assert all(layer["dispersion"] is None and layer["budget"] is None for layer in data["layers"])
    report = invoke("qa", doc, "Who?", *TINY, "-n", "3", "--method", "full").stderr
    assert "full cache: nothing scored or evicted" in report
    assert "tau1" not in report and "scoring + eviction" not in report and "allocation across layers" not in report


def test_qa_truncate_error_exits_1(cli_env):
    long_doc = cli_env / "long.txt"
    long_doc.write_text(license_text() * 2, encoding="utf-8")  # over tiny-test's 1500-token limit
    one_error_line(invoke("qa", long_doc, "Who?", *TINY, "--truncate", "error", "--quiet"), 1, "limit")
    result = invoke("qa", long_doc, "Who?", *TINY, "-n", "2", "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["document_tokens"] < data["original_document_tokens"]
    assert any("truncated in the middle" in w for w in data["warnings"])


# ---------------------------------------------------------------- needle
def planted_doc(cli_env, fraction: float = 0.5):
    text = license_text()[:1200]
    at = text.find("\n\n", int(len(text) * fraction)) + 2
    path = cli_env / "haystack.txt"
    path.write_text(text[:at] + NEEDLE + "\n\n" + text[at:], encoding="utf-8")
    return path, at


def test_needle_quote_on_stdout_location_in_report_and_json(cli_env, forced):
    path, at = planted_doc(cli_env)
    forced(NEEDLE)
    streamed = invoke("needle", path, "What is the best thing to do in San Francisco?", *TINY)
    assert streamed.exit_code == 0, streamed.stderr
    assert streamed.stdout == NEEDLE + "\n"
    assert "CAKE report · needle" in streamed.stderr and f"characters {at}-" in streamed.stderr
    data = json.loads(invoke("needle", path, "best thing in San Francisco?", *TINY, "--json").stdout)
    loc = data["location"]
    assert set(loc) == {"start", "end", "percent", "page", "similarity", "text"}
    assert loc["start"] == at and loc["text"] == NEEDLE.rstrip(".") and loc["page"] is None
    assert loc["similarity"] == 100 and loc["percent"] == pytest.approx(100 * at / len(path.read_text().strip()))


def test_needle_reports_the_pdf_page(cli_env, forced):
    from fpdf import FPDF

    filler = license_text()[:1500].encode("latin-1", "replace").decode("latin-1")
    pdf = FPDF()
    pdf.set_font("Helvetica", size=10)
    for page in range(3):
        pdf.add_page()
        pdf.multi_cell(0, 5, filler[:600] + ("\n\n" + NEEDLE if page == 1 else ""))
    path = cli_env / "haystack.pdf"
    pdf.output(str(path))
    forced(NEEDLE)
    result = invoke("needle", path, "What is the best thing to do in San Francisco?", *TINY, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["location"]["page"] == 2


def test_needle_without_a_match_warns_and_reports_no_location(cli_env, forced):
    path, _ = planted_doc(cli_env)
    forced("Nothing in here is about sandwiches at all.")
    result = invoke("needle", path, "What about San Francisco?", *TINY)
    assert result.exit_code == 0
    assert result.stdout == "Nothing in here is about sandwiches at all.\n"
    assert "no location reported" in result.stderr and "not found in the document" in result.stderr
    data = json.loads(invoke("needle", path, "What about San Francisco?", *TINY, "--json").stdout)
    assert data["location"] is None and any("no location" in w for w in data["warnings"])


# ---------------------------------------------------------------- complete
def test_complete_prints_code_only(code_file, forced):
    raw = "Here is the code:\n```python\n    y = 2\n    z = 3\n```\nThis sets y and z."
    forced(raw)
    result = invoke("complete", code_file, "--at", "6", *TINY)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "    y = 2\n    z = 3\n"
    data = json.loads(invoke("complete", code_file, "--at", "6", *TINY, "--json").stdout)
    assert data["answer"] == "    y = 2\n    z = 3" and data["task"] == "complete"
    # the closing fence ended the code, so generation stopped there (the prose after it is not generated)
    assert data["raw_answer"] == raw[: raw.index("This sets")] and data["stop_reason"] == "complete"


def test_complete_at_prints_that_line_first(code_file, forced):
    """`--at 5`: the model first finishes line 4 (the prompt ends inside it); the output starts at line 5."""
    line5 = code_file.read_text().splitlines()[4]
    forced(f"  # width is in characters\n{line5}\n    return lines\n")
    result = invoke("complete", code_file, "--at", "5", *TINY, "--lines", "2")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{line5}\n    return lines\n"


def test_complete_stops_after_lines(code_file):
    streamed = invoke("complete", code_file, *TINY, "--lines", "2", "-n", "40")
    as_json = invoke("complete", code_file, *TINY, "--lines", "2", "-n", "40", "--json")
    assert streamed.exit_code == 0 and as_json.exit_code == 0, streamed.stderr
    data = json.loads(as_json.stdout)
    assert data["answer"] == filter_code(data["raw_answer"], 2, continues_line=True)
    assert len([line for line in data["answer"].split("\n") if line.strip()]) <= 2
    assert streamed.stdout.rstrip("\n") == data["answer"], "the streamed code equals the final answer"
    assert "```" not in streamed.stdout and "CAKE report · complete" in streamed.stderr


def test_complete_at_line_uses_the_lines_before_it(code_file, tiny_profile_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_profile_dir.parent / "model")
    whole = json.loads(invoke("complete", code_file, *TINY, "-n", "2", "--json").stdout)
    at5 = json.loads(invoke("complete", code_file, "--at", "5", *TINY, "-n", "2", "--json").stdout)
    context = "import textwrap\n\n\ndef wrap(text, width=70):"
    assert at5["document_tokens"] == len(tokenizer(context, add_special_tokens=False)["input_ids"])
    assert at5["prompt_tokens"] < whole["prompt_tokens"]


def test_complete_reads_stdin(code_file):
    via_stdin = invoke("complete", "-", *TINY, "-n", "8", "--json", input=code_file.read_text())
    via_file = invoke("complete", code_file, *TINY, "-n", "8", "--json")
    assert via_stdin.exit_code == 0, via_stdin.stderr
    assert json.loads(via_stdin.stdout)["raw_answer"] == json.loads(via_file.stdout)["raw_answer"]


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--at", "1"], 2, "--at"),
        (["--at", "99"], 2, "outside the file"),
        (["--lines", "0"], 2, "--lines"),
        (["-n", "0"], 2, "--max-new-tokens"),
    ],
)
def test_complete_usage_errors(code_file, args, code, words):
    one_error_line(invoke("complete", code_file, *TINY, *args), code, words)


# ---------------------------------------------------------------- shared
@pytest.mark.parametrize("command", ["summarize", "qa", "needle", "complete"])
def test_every_task_has_the_shared_options(command):
    result = invoke(command, "--help")
    assert result.exit_code == 0
    for option in ("--budget", "--window", "--json", "--model", "--device-map", "--truncate", "--max-new-tokens"):
        assert option in result.stdout


@pytest.mark.parametrize("command", [["qa"], ["compress"], ["batch"], ["env"], ["bench", "speed"]])
def test_help_shows_no_python_types(command):
    """Metavars say what an option takes; a flag takes nothing: no `<bool>` / `<str>` / `<int>`."""
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    for shown in ("<bool>", "<str>", "<int>"):
        assert shown not in result.stdout
    assert "--help" in result.stdout and "--json" in result.stdout


def test_device_map_reaches_the_loader(doc, monkeypatch):
    from cake_cli.tasks import runner as loader  # the runner's reference to models.loader.load_model

    seen = []
    real = loader.load_model

    def load_model(*args, **kwargs):
        seen.append(kwargs.get("device_map"))
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "load_model", load_model)
    result = invoke("qa", doc, "Who?", *TINY, "-n", "2", "--device-map", "auto", "--json")
    assert result.exit_code == 0, result.stderr
    assert seen == ["auto"]
