"""`cake compress`, tasks on a .cake file, `cake qa DOC Q1 Q2 …` and `cake chat` through the real CLI on
the tiny random profile: answers from a saved cache are token-identical to answers from the cache
compressed in the same process; bad .cake files and contradicting options are one-line errors."""

from __future__ import annotations

import json

import pytest

from cake_cli.tasks.results import human_bytes
from cake_cli.tasks.saved import fileformat as cachefile
from tests.helpers.cli import TINY, compressed, flat, invoke, one_error_line

QUESTIONS = ["Who holds the copyright?", "What does the license permit?", "When was it written?"]


@pytest.fixture
def cake(doc, cli_env):
    """A question-agnostic .cake: evicted once, before any question (scoring `instruction`)."""
    return compressed(doc, cli_env / "notes.cake", "--scoring", "instruction")


@pytest.fixture
def whole(doc, cli_env):
    """A .cake made with the default scoring (`question`): the prefix kept whole, evicted per question."""
    return compressed(doc, cli_env / "whole.cake")


def test_compress_report_shows_layers_only_when_evicted(doc, cli_env):
    evicted = invoke("compress", doc, "-o", cli_env / "e.cake", *TINY, "-b", "64", "--scoring", "end")
    whole = invoke("compress", doc, "-o", cli_env / "w.cake", *TINY, "-b", "64")
    assert evicted.exit_code == 0 and whole.exit_code == 0, (evicted.stderr, whole.stderr)
    assert "allocation across layers" in evicted.stderr
    assert "allocation across layers" not in whole.stderr and "kept whole" in whole.stderr


def test_every_prefill_shows_layer_progress(doc, cli_env):
    """Prefills kept whole (compress's default scoring, qa with several questions, chat) show the same
    per-layer progress as a task, with the time left (piped stderr: plain lines)."""
    runs = [
        invoke("compress", doc, "-o", cli_env / "p.cake", *TINY, "-b", "64"),
        invoke("qa", doc, QUESTIONS[0], QUESTIONS[1], *TINY, "-b", "64", "-n", "2"),
        invoke("chat", doc, *TINY, "-b", "64", "-n", "2", input=f"{QUESTIONS[0]}\n"),
        invoke("summarize", doc, *TINY, "-b", "64", "-n", "2"),
    ]
    for result in runs:
        assert result.exit_code == 0, result.stderr
        assert "prefill layers: 1/4 · ETA …" in result.stderr and "prefill layers: 4/4 · ETA 0:00" in result.stderr


def test_compress_writes_a_checked_cake_file(cake):
    path, report = cake
    saved = cachefile.read_saved(path)
    meta = saved.meta
    assert report["file_bytes"] == saved.file_bytes == path.stat().st_size
    assert meta.budget == report["budget"] == 64 and meta.window == 8 and meta.method == "cake"
    assert meta.evicted and meta.scoring == "instruction" and meta.model == "tiny-test"
    assert len(meta.prefix_ids) == report["prompt_tokens"] and meta.dtype == "float32"
    assert [layer.kept for layer in meta.layers] == [layer["kept"] for layer in report["layers"]]
    # B·L tokens kept in all, less at most one per layer (Prop. 1 rounding); the instruction probe took g = w
    # window slots while scoring, so each layer kept g more evictable tokens: kept = B_l + w - g = B_l
    assert 64 * 4 - 4 <= sum(layer.kept for layer in meta.layers) <= 64 * 4
    assert len(meta.probe_ids) == 8 and [layer.kept for layer in meta.layers] == [layer.budget for layer in meta.layers]
    assert report["kv_bytes_kept"] < report["kv_bytes_full"]
    positions_bytes = sum(2 * 2 * layer.kept for layer in meta.layers)  # int16 per KV head and token
    header = saved.file_bytes - report["kv_bytes_kept"] - positions_bytes
    assert 0 < header < 200_000, "the rest is the JSON header (metadata)"
    assert report["kv_bytes_kept"] + positions_bytes <= 1.05 * report["kv_bytes_kept"]


@pytest.mark.parametrize("policy", ["fixed", "grow"])
def test_saved_answers_equal_in_process_answers(whole, doc, policy):
    """The oracle: `qa FILE.cake` (loaded from disk) == `qa DOC Q1 Q2 Q3` (compressed in this process)."""
    path, made = whole
    assert not made["evicted"] and made["scoring"] == "question" and made["kv_bytes_kept"] == made["kv_bytes_full"]
    here = invoke(
        "qa", doc, *QUESTIONS, "--decode-policy", policy, *TINY, "-b", "64", "--dtype", "fp32", "-n", "12", "--json",
        "--abstain", "never",  # a random model's answers as given: the default would withhold them all
    )  # fmt: skip
    assert here.exit_code == 0, here.stderr
    in_process = json.loads(here.stdout)["results"]
    assert [r["question"] for r in in_process] == QUESTIONS
    for question, expected in zip(QUESTIONS, in_process):
        loaded = invoke("qa", path, question, "-n", "12", "--decode-policy", policy, "--json", "--abstain", "never")
        assert loaded.exit_code == 0, loaded.stderr
        got = json.loads(loaded.stdout)
        assert got["answer"] == expected["answer"] and got["generated_tokens"] == expected["generated_tokens"] > 0
        assert got["cache"]["path"] == str(path) and expected["cache"]["path"] is None
        assert got["layers"] == expected["layers"] and got["evicted"], "evicted with the question in the window"
        assert got["kv_bytes_kept"] < got["cache"]["kv_bytes"], "the task's budget, not the whole prefix"
        assert got["cache"]["continuation_tokens"] == got["prompt_tokens"] - got["cache"]["prefix_tokens"] > 0
    assert len({r["answer"] for r in in_process}) > 1, "different questions, different answers"
    assert len({json.dumps(r["layers"]) for r in in_process}) > 1, "each question keeps its own tokens"


def test_agnostic_saved_answers_equal_in_process_answers(cake, doc):
    path, _ = cake
    piped = "\n".join(QUESTIONS[:2]) + "\n"
    chat = invoke("chat", doc, *TINY, "-b", "64", "--dtype", "fp32", "--scoring", "instruction", "-n", "10", "--json",
                  input=piped)  # fmt: skip
    assert chat.exit_code == 0, chat.stderr
    for turn in map(json.loads, chat.stdout.splitlines()):
        got = json.loads(invoke("qa", path, turn["question"], "-n", "10", "--json").stdout)
        assert got["answer"] == turn["answer"] and got["layers"] == turn["layers"]
        assert got["cache"]["kv_bytes"] == turn["cache"]["kv_bytes"] and got["cache"]["scoring"] == "instruction"


def test_whole_file_takes_each_task_budget_and_method(whole):
    path, made = whole
    small = json.loads(invoke("qa", path, QUESTIONS[0], "-n", "4", "-b", "32", "--json").stdout)
    default = json.loads(invoke("qa", path, QUESTIONS[0], "-n", "4", "--json").stdout)
    full = json.loads(invoke("qa", path, QUESTIONS[0], "-n", "4", "--method", "full", "--json").stdout)
    assert small["budget"] == 32 and default["budget"] == 64 and full["budget"] is None
    assert small["kv_bytes_kept"] < default["kv_bytes_kept"] < full["kv_bytes_kept"]
    assert not full["evicted"] and full["kv_bytes_kept"] > made["kv_bytes_kept"], "whole prefix + the question"
    assert made["file_ratio"] < 1.05 + 200_000 / made["kv_bytes_kept"]


@pytest.mark.parametrize("policy", ["fixed", "grow"])
def test_saved_cache_text_report_and_decode_policy(cake, policy):
    path, _ = cake
    result = invoke("qa", path, QUESTIONS[0], "-n", "6", "--decode-policy", policy)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() and "saved cache" in result.stderr and "saved ·" in result.stderr
    assert "when compressed, read now in" in flat(result.stderr)


def test_prefill_times_have_one_definition(cake, doc):
    """`prefill_seconds` is the forward over the answer's own tokens; the document's prefill is
    `cache.prefix_prefill_seconds` (once in this run, or when the file was made), and only a file saves it."""
    path, made = cake
    loaded = json.loads(invoke("qa", path, QUESTIONS[0], "-n", "2", "--json").stdout)
    cache = loaded["cache"]
    assert cache["prefix_prefill_seconds"] == made["prefill_seconds"] > 0, "the prefill the file records"
    assert cache["prefill_saved_seconds"] == pytest.approx(cache["prefix_prefill_seconds"] - cache["read_seconds"])
    assert "continuation_seconds" not in cache and "stored_prefill_seconds" not in cache
    here = invoke("qa", doc, *QUESTIONS[:2], *TINY, "-b", "64", "-n", "2", "--json")
    first, second = (r["cache"] for r in json.loads(here.stdout)["results"])
    assert first["prefix_prefill_seconds"] == second["prefix_prefill_seconds"] > 0, "one prefill for both questions"
    assert first["prefill_saved_seconds"] == second["prefill_saved_seconds"] == 0.0, "nothing was loaded"
    assert first["read_seconds"] == 0.0 and first["path"] is None
    report = flat(invoke("qa", doc, *QUESTIONS[:2], *TINY, "-b", "64", "-n", "2").stderr)
    assert "document prefix prefilled in this run in" in report and "once for every question" in report
    assert f"prefill of the {first['continuation_tokens']} task tokens" in report


def test_summarize_and_needle_take_a_cake_file(cake):
    path, _ = cake
    summary = invoke("summarize", path, "-n", "5", "--json")
    needle = invoke("needle", path, "copyright", "-n", "5", "--json")
    for result in (summary, needle):
        assert result.exit_code == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["cache"]["path"] == str(path) and data["generated_tokens"] <= 5


@pytest.fixture
def forced_answers(monkeypatch, tiny_profile_dir):
    """`forced_answers(texts)`: the answers after a compressed prefix are exactly `texts`, in turn
    (teacher forcing through the real continuation and decoding)."""
    from transformers import AutoTokenizer

    from cake_cli.tasks.saved import compress as saved

    real, tokenizer = saved.decode, AutoTokenizer.from_pretrained(tiny_profile_dir.parent / "model")

    def use(texts: list[str]) -> None:
        queue = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

        def decode(*args, **kwargs):
            ids = queue.pop(0)
            kwargs["max_new_tokens"] = len(ids)
            return real(*args, forced_tokens=ids, **kwargs)

        monkeypatch.setattr(saved, "decode", decode)

    return use


def split_answers(text: str, questions: list[str]) -> list[str]:
    """What a downstream reader does with several plain-text answers: cut at each numbered heading, in order."""
    answers, rest = [], text
    headings = [f"[{i}/{len(questions)}] {q}\n" for i, q in enumerate(questions, 1)]
    for heading, following in zip(headings, [*headings[1:], None]):
        assert rest.startswith(heading)
        end = rest.index("\n" + following) if following else len(rest)
        answers.append(rest[len(heading) : end].removesuffix("\n"))
        rest = rest[end + 1 :]
    return answers


def test_several_answers_in_plain_text_can_be_split(doc, forced_answers, cli_env):
    """Answers holding blank lines (the issue: they could not be told apart) split at their numbered headings."""
    texts = ["First part.\n\nSecond part of answer one.", "Answer two,\n\n\nafter two blank lines.", "Three."]
    forced_answers(texts)
    out = cli_env / "answers.txt"
    result = invoke("qa", doc, *QUESTIONS, *TINY, "-b", "64", "--quiet", "-o", out, "--abstain", "never")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"[1/3] {QUESTIONS[0]}\nFirst part.")
    assert split_answers(result.stdout, QUESTIONS) == texts
    assert out.read_text() == result.stdout, "the file holds what stdout showed"


def test_chat_piped_json_lines_and_memory_bounded(cake):
    path, _ = cake
    piped = "\n".join([QUESTIONS[0], "", QUESTIONS[1], QUESTIONS[0]]) + "\n"
    result = invoke("chat", path, "-n", "8", "--json", input=piped)
    assert result.exit_code == 0, result.stderr
    turns = [json.loads(line) for line in result.stdout.splitlines()]
    assert [t["turn"] for t in turns] == [1, 2, 3] and [t["question"] for t in turns] == [*QUESTIONS[:2], QUESTIONS[0]]
    assert turns[0]["answer"] == turns[2]["answer"], "each turn starts from the compressed document again"
    assert len({t["cache"]["kv_bytes"] for t in turns}) == 1
    assert turns[2]["kv_bytes_kept"] == turns[0]["kv_bytes_kept"], "turn 3 holds nothing of turns 1 and 2"
    single = json.loads(invoke("qa", path, QUESTIONS[1], "-n", "8", "--json").stdout)
    assert turns[1]["answer"] == single["answer"], "a chat turn answers as `qa FILE.cake` does"


def test_a_piped_exit_line_ends_the_chat(cake):
    """`exit` leaves whether typed or piped (it was sent to the model as a question when piped)."""
    path, _ = cake
    result = invoke("chat", path, "-n", "4", "--json", input=f"{QUESTIONS[0]}\nexit\n{QUESTIONS[1]}\n")
    assert result.exit_code == 0, result.stderr
    assert [json.loads(line)["question"] for line in result.stdout.splitlines()] == [QUESTIONS[0]]


def test_chat_text_on_a_document(doc, cli_env):
    out = cli_env / "transcript.txt"
    result = invoke("chat", doc, *TINY, "-b", "64", "-n", "4", "-o", out, input=f"{QUESTIONS[0]}\n")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() and "turn 1:" in result.stderr
    assert out.read_text().startswith(f"Q: {QUESTIONS[0]}\nA: ")


def scripted_terminal(monkeypatch, lines, stdout_tty=True):
    """Chat on a terminal: stdin (and stdout) are ttys, and `input()` answers from `lines` in turn; an
    exception class in `lines` is raised instead (KeyboardInterrupt: Ctrl-C, EOFError: Ctrl-D)."""
    from cake_cli.cli.runners import compress as sessions

    monkeypatch.setattr(sessions, "terminal", lambda: (True, stdout_tty))
    script = list(lines)

    def typed(prompt=""):
        assert prompt == sessions.PROMPT
        item = script.pop(0)
        if isinstance(item, type):
            raise item
        return item

    monkeypatch.setattr("builtins.input", typed)


def test_ctrl_c_in_chat_stops_the_answer_and_asks_again(cake, cli_env, monkeypatch):
    """Ctrl-C while an answer streams (simulated from the streaming callback) ends that answer only: the
    next question is answered from the same compressed document, and Ctrl-D then leaves with exit 0."""
    from cake_cli.cli import stream

    path, _ = cake
    real, pieces = stream.AnswerStream.text, []

    def text(self, piece):
        pieces.append(piece)
        if len(pieces) == 2:  # the first answer, mid-stream
            raise KeyboardInterrupt
        real(self, piece)

    monkeypatch.setattr(stream.AnswerStream, "text", text)
    scripted_terminal(monkeypatch, [QUESTIONS[0], QUESTIONS[1], EOFError])
    out = cli_env / "chat.txt"
    result = invoke("chat", path, "-n", "6", "-o", out)
    assert result.exit_code == 0, result.stderr
    assert "answer stopped" in result.stderr and "interrupted" not in result.stderr
    single = json.loads(invoke("qa", path, QUESTIONS[1], "-n", "6", "--json").stdout)
    assert out.read_text() == f"Q: {QUESTIONS[1]}\nA: {single['reply']}\n", "the stopped turn is not in it"
    assert result.stdout.endswith(single["reply"] + "\n")
    assert "turn 1:" in result.stderr and "turn 2:" not in result.stderr


def test_ctrl_c_at_the_chat_prompt_leaves_with_130(cake, cli_env, monkeypatch):
    path, _ = cake
    scripted_terminal(monkeypatch, [QUESTIONS[0], KeyboardInterrupt])
    out = cli_env / "chat.txt"
    result = invoke("chat", path, "-n", "4", "-o", out)
    assert result.exit_code == 130, result.stderr
    assert result.stderr.rstrip().endswith("interrupted")
    assert out.read_text().startswith(f"Q: {QUESTIONS[0]}\nA: "), "what was answered is kept"
    from cake_cli.cli.runners import compress as sessions

    assert sessions.readline is not None, "the prompt's input() has readline's line editing and history"


def test_ctrl_d_at_the_chat_prompt_ends_its_line(cake, monkeypatch):
    """stdin a terminal, stdout piped: the prompt goes to stderr, and Ctrl-D (end of input) ends its line."""
    path, _ = cake
    scripted_terminal(monkeypatch, [], stdout_tty=False)
    result = invoke("chat", path, "-n", "4", input=f"{QUESTIONS[0]}\n")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("question> ") == 2 and result.stderr.endswith("question> \n")
    assert "question>" not in result.stdout and result.stdout.strip()


# ---------------------------------------------------------------- bad input
def test_truncated_cake(cake, cli_env):
    path, _ = cake
    cut = cli_env / "cut.cake"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    line = one_error_line(invoke("qa", cut, "Who?"), 1, "truncated")
    assert "cake compress" in line


def test_corrupt_cake(cake, cli_env):
    path, _ = cake
    blob = bytearray(path.read_bytes())
    blob[-100] ^= 0xFF  # one flipped byte in the tensor data
    bad = cli_env / "bad.cake"
    bad.write_bytes(bytes(blob))
    one_error_line(invoke("qa", bad, "Who?"), 1, "checksum")
    (cli_env / "junk.cake").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    one_error_line(invoke("qa", cli_env / "junk.cake", "Who?"), 1, "not a saved cake-cli cache")
    one_error_line(invoke("qa", cli_env / "missing.cake", "Who?"), 1, "no such file")
    (cli_env / "text.cake").write_text("A text file renamed .cake: its first 8 bytes read as a huge header size.")
    line = one_error_line(invoke("qa", cli_env / "text.cake", "Who?"), 1, "not a saved cake-cli cache")
    assert "truncated" not in line


def rewrite_meta(path, target, sign=True, **changes) -> None:
    """A copy of a .cake with some metadata changed; `sign`: with the checksum made again (a file that
    another cake-cli or another model really wrote), else the old checksum (an edited file)."""
    blob = path.read_bytes()
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size])
    meta = json.loads(header["__metadata__"]["cake_cli"])
    meta.update(changes)
    if sign:
        meta["sha256"] = cachefile.file_sha256(header, meta, blob[8 + size :])
    header["__metadata__"]["cake_cli"] = json.dumps(meta)
    raw = json.dumps(header).encode()
    target.write_bytes(len(raw).to_bytes(8, "little") + raw + blob[8 + size :])


def edit_in_place(path, target, old: str, new: str) -> None:
    """A copy of a .cake with the first `old` of its metadata replaced by `new` (same length: the file
    is otherwise byte for byte the same, as a hex editor leaves it). The metadata is a JSON string in
    the safetensors header, so its quotes are escaped there."""
    old_bytes, new_bytes = (text.replace('"', '\\"').encode() for text in (old, new))
    blob = path.read_bytes()
    size = int.from_bytes(blob[:8], "little")
    assert len(old_bytes) == len(new_bytes) and old_bytes in blob[8 : 8 + size]
    target.write_bytes(blob.replace(old_bytes, new_bytes, 1))


def test_edited_metadata_is_refused(cake, cli_env):
    """The checksum covers the header: an edited budget (same length, the JSON still valid) or an edited
    per-layer kept count is refused in one line, as a flipped tensor byte is."""
    path, report = cake
    edit_in_place(path, cli_env / "budget.cake", '"budget":64,', '"budget":99,')
    line = one_error_line(invoke("qa", cli_env / "budget.cake", "Who?"), 1, "checksum")
    assert "edited" in line and line.endswith(f"-o {cli_env / 'budget.cake'}"), "the remake command keeps the folder"
    kept = report["layers"][0]["kept"]
    edit_in_place(path, cli_env / "kept.cake", f'"kept":{kept},', f'"kept":{kept - 1},')
    one_error_line(invoke("qa", cli_env / "kept.cake", "Who?"), 1, "checksum")
    rewrite_meta(path, cli_env / "renamed.cake", sign=False, source="other.txt")
    one_error_line(invoke("summarize", cli_env / "renamed.cake"), 1, "checksum")
    rewrite_meta(path, cli_env / "resigned.cake", budget=64)  # the same content written again: fine
    assert invoke("qa", cli_env / "resigned.cake", "Who?", "-n", "2").exit_code == 0


def test_other_format_version(cake, cli_env):
    path, _ = cake
    rewrite_meta(path, cli_env / "v9.cake", format_version=9, cake_cli_version="9.0")
    line = one_error_line(invoke("qa", cli_env / "v9.cake", "Who?"), 1, "format version 9")
    assert "compress the document again" in line


def test_other_model_weights(cake, cli_env):
    path, _ = cake
    rewrite_meta(path, cli_env / "other.cake", fingerprint="0" * 32)
    line = one_error_line(invoke("qa", cli_env / "other.cake", "Who?", "--quiet"), 1, "other weights")
    assert line.endswith(f"-o {cli_env / 'other.cake'}"), "the remake command replaces the file where it is"
    assert "answer with the --weights it was compressed with" in line  # e.g. int8 before auto chose w8a8


def test_model_not_matching_the_file(cake):
    path, _ = cake
    line = one_error_line(invoke("qa", path, "Who?", "-m", "smollm2"), 2, "does not match")
    assert "drop --model" in line


@pytest.mark.parametrize(
    "args, flag",
    [
        (["-b", "128"], "--budget"),
        (["--method", "snapkv"], "--method"),
        (["-w", "4"], "--window"),
        (["--dtype", "bfloat16"], "--dtype"),
        (["--indicator", "h2o"], "--method"),
    ],
)
def test_options_contradicting_the_file(cake, args, flag):
    path, _ = cake
    line = one_error_line(invoke("qa", path, "Who?", *args), 2, f"{flag}")
    assert "contradicts" in line and "drop" in line


def test_same_options_as_the_file_are_fine(cake):
    path, _ = cake
    result = invoke("qa", path, "Who?", "-b", "64", "--method", "cake", "-m", "tiny-test", "-w", "8", "-n", "2")
    assert result.exit_code == 0, result.stderr


def test_usage_errors(cake, doc, cli_env):
    path, _ = cake
    one_error_line(invoke("complete", path), 2, "raw text")
    one_error_line(invoke("compress", doc, *TINY), 2, "--output")
    one_error_line(invoke("compress", doc, "-o", cli_env / "x.bin", *TINY), 2, "does not end in .cake")
    one_error_line(invoke("compress", path, "-o", cli_env / "y.cake", *TINY), 2, "already a compressed cache")
    one_error_line(invoke("compress", doc, "-o", cli_env / "y.cake", "--scoring", "magic", *TINY), 2, "--scoring")
    one_error_line(invoke("qa", doc, *TINY), 2, "needs a question")
    one_error_line(invoke("qa", doc, "A?", " ", *TINY), 2, "non-empty question")
    one_error_line(invoke("chat", "-", *TINY), 2, "stdin")
    one_error_line(invoke("inspect-layers", path), 2, "already compressed")


def test_full_cache_and_end_scoring(doc, cli_env):
    full, end = cli_env / "full.cake", cli_env / "end.cake"
    made = [
        json.loads(invoke("compress", doc, "-o", path, *TINY, *args, "--json").stdout)
        for path, args in ((full, ["--method", "full"]), (end, ["-b", "64", "--scoring", "end"]))
    ]
    assert not made[0]["evicted"] and made[0]["kv_bytes_kept"] == made[0]["kv_bytes_full"]
    assert made[1]["evicted"] and made[1]["scoring"] == "end" and cachefile.read_saved(end).meta.probe_ids == []
    assert made[0]["file_bytes"] > 3 * made[1]["file_bytes"]
    answers = [json.loads(invoke("qa", path, QUESTIONS[0], "-n", "6", "--json").stdout) for path in (full, end)]
    assert answers[0]["method"] == "full" and answers[0]["cache"]["kv_bytes"] == made[0]["kv_bytes_kept"]
    evicted_now = json.loads(invoke("qa", full, QUESTIONS[0], "-n", "6", "-b", "64", "--json").stdout)
    assert evicted_now["method"] == "cake" and evicted_now["evicted"], "a --budget evicts a full file with the question"
    assert answers[1]["cache"]["scoring"] == "end"
    q = answers[1]["cache"]["continuation_tokens"]
    assert [(r["budget"], r["kept"]) for r in answers[1]["layers"]] == [
        (r["budget"], r["kept"] + q) for r in made[1]["layers"]
    ]


def test_compress_says_when_the_file_dwarfs_the_document(doc, cli_env):
    """The tiny model's file is over 100× its 1,300-byte document: the report and --json give the line, with the
    sizes a compression at 8 / 4 / 2 bits actually writes (keys and values exact, the header's
    growth left out)."""
    path, report = compressed(doc, cli_env / "big.cake")
    text_bytes = len(cachefile.read_saved(path).meta.used_text.encode("utf-8"))  # as extracted: 1,292 of 1,300
    assert 1250 < text_bytes <= len(doc.read_bytes())
    assert report["document_bytes"] == text_bytes and report["file_bytes"] > 100 * text_bytes
    for bits, predicted in report["smaller_files"]:
        _, actual = compressed(doc, cli_env / f"b{bits}.cake", "--kv-bits", str(bits))
        header = 4 * 8 * 100  # 4 layers, 8 more tensor names each (5 parts a kind, not 1), under 100 bytes a name
        assert 0 < actual["file_bytes"] - predicted < header, (bits, predicted, actual["file_bytes"])
        # the keys and values exactly: the prediction only takes the header and positions as unchanged
        assert predicted - report["file_bytes"] + report["kv_bytes_file"] == actual["kv_bytes_file"]
    assert [bits for bits, _ in report["smaller_files"]] == [8, 4, 2]
    sizes = " / ".join(human_bytes(size) for _, size in report["smaller_files"])
    file, ratio = human_bytes(report["file_bytes"]), report["file_bytes"] / text_bytes
    assert report["size_hint"] == (
        f"the file is {ratio:.0f}× the document's text ({file} for {human_bytes(text_bytes)}): "
        f"--kv-bits 8 / 4 / 2 would write about {sizes} (2 bits loses answers: benchmarks/cache.md)"
    )
    human = invoke("compress", doc, "-o", cli_env / "h.cake", *TINY, "-b", "64", "--dtype", "float32")
    assert human.exit_code == 0, human.stderr
    # another run's header holds other timings (their digits move the sizes by tens of bytes): the line, not the digits
    line = report["size_hint"].split(" (")[0]
    assert f"size: {line} (" in flat(human.stderr) and "--kv-bits 8 / 4 / 2 would write about" in flat(human.stderr)
    smallest = invoke(
        "compress", doc, "-o", cli_env / "s.cake", *TINY, "-b", "64", "--dtype", "float32", "--kv-bits", "2"
    )
    assert smallest.exit_code == 0 and "--kv-bits" not in flat(smallest.stderr)
    two = invoke("compress", doc, "-o", cli_env / "j.cake", *TINY, "-b", "64", "--kv-bits", "2", "--json")
    assert json.loads(two.stdout)["size_hint"] is None
