"""Answers that cite or abstain, the middle cut that says what it dropped, and `--long sections`,
through the real CLI (CliRunner) on the tiny random profile (1500-token prompt limit).

Known replies are fed through the real engine by teacher forcing (`forced`), so prefill, eviction,
the reply's reading, the passage's location, the report and the JSON all run for real.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from cake_cli.cli.main import app
from cake_cli.tasks.sections import split_sections
from tests.helpers.texts import license_text

runner = CliRunner()
TINY = ["-m", "tiny-test", "-b", "64"]
FOUNDED = "Python was created in the early 1990s by Guido van Rossum at Stichting Mathematisch Centrum"
STALLMAN = "According to Richard Stallman, 1.6.1 is not GPL-compatible, because its license has a choice of law clause."


@pytest.fixture
def tokenizer(tiny_profile_dir):
    return AutoTokenizer.from_pretrained(tiny_profile_dir.parent / "model")


@pytest.fixture
def forced(monkeypatch, tokenizer):
    """`forced(text)`: from now on the engine generates exactly `text` (teacher forcing), from a document
    or from a .cake file."""
    from cake_cli.tasks import runner as engine  # the runner's reference to engine.generate.decode
    from cake_cli.tasks.saved import compress as saved  # and the saved path's

    real = engine.decode

    def use(text: str) -> None:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]

        def decode(*args, **kwargs):
            kwargs["max_new_tokens"] = len(ids)
            return real(*args, forced_tokens=ids, **kwargs)

        monkeypatch.setattr(engine, "decode", decode)
        monkeypatch.setattr(saved, "decode", decode)

    return use


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def short_doc(cli_env):
    path = cli_env / "notes.txt"
    path.write_text(license_text()[:1200], encoding="utf-8")  # fits the tiny model's 1500 tokens
    return path


@pytest.fixture
def long_doc(cli_env):
    path = cli_env / "long.txt"
    path.write_text(license_text()[:5200], encoding="utf-8")  # ~3.5x the tiny model's prompt limit
    return path


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def as_json(result) -> dict:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


# ---- cite or abstain ----------------------------------------------------------------------


def test_a_cited_passage_is_located_with_its_offset(short_doc, forced):
    reply = f'Answer: Guido van Rossum\nPassage: "{FOUNDED}"'
    forced(reply)
    streamed = invoke("qa", short_doc, "Who created Python?", *TINY)
    assert streamed.exit_code == 0, streamed.stderr
    assert streamed.stdout == reply + "\n"  # stdout: the reply as streamed, nothing else
    at = flat(short_doc.read_text()).index(FOUNDED)
    assert "location" in streamed.stderr and "characters" in streamed.stderr and "UNSUPPORTED" not in streamed.stderr
    data = as_json(invoke("qa", short_doc, "Who created Python?", *TINY, "--json"))
    assert 0.0 < data["support"].pop("abstain_probability") < 1.0  # the default --abstain doubt reads it
    assert data["support"] == {
        "status": "located",
        "answer": "Guido van Rossum",
        "passage": FOUNDED,
        "reason": "",
        "withheld": False,
    }
    assert data["answer"] == "Guido van Rossum" and data["reply"] == reply  # the short answer; the reply as streamed
    loc = data["location"]
    assert flat(loc["text"]).startswith(FOUNDED[:40]) and abs(loc["start"] - at) < 40
    assert data["dropped"] is None and data["sections"] == []


def test_an_answer_whose_passage_is_nowhere_is_flagged_unsupported(short_doc, forced):
    forced('Answer: Ada Lovelace\nPassage: "Ada Lovelace wrote the first Python interpreter in 1843."')
    result = invoke("qa", short_doc, "Who created Python?", *TINY, "--abstain", "never")
    assert result.exit_code == 0 and "UNSUPPORTED" in result.stderr and "unsupported answer" in result.stderr
    data = as_json(invoke("qa", short_doc, "Who created Python?", *TINY, "--json", "--quiet", "--abstain", "never"))
    assert data["support"]["status"] == "unsupported" and data["location"] is None
    assert data["support"]["answer"] == "Ada Lovelace"
    assert any(w.startswith("unsupported answer") for w in data["warnings"])


def test_a_passage_that_does_not_hold_the_answer_is_unsupported(short_doc, forced):
    forced(f'Answer: Ada Lovelace\nPassage: "{FOUNDED}"')  # a real passage, but not of this answer
    data = as_json(invoke("qa", short_doc, "Who created Python?", *TINY, "--json"))
    assert data["support"]["status"] == "unsupported" and "does not hold the answer" in data["support"]["reason"]


def test_an_abstention_is_reported_as_such(short_doc, forced):
    forced("Answer: not in the document")
    result = invoke("qa", short_doc, "What is the airspeed of a swallow?", *TINY)
    assert result.exit_code == 0 and "abstained" in result.stderr and "UNSUPPORTED" not in result.stderr
    data = as_json(invoke("qa", short_doc, "What is the airspeed of a swallow?", *TINY, "--json"))
    assert data["support"]["status"] == "abstained" and data["location"] is None
    assert data["answer"] == "not in the document" and data["reply"] == "Answer: not in the document"
    assert not any("unsupported" in w for w in data["warnings"])


def test_a_warning_of_several_questions_names_its_question(short_doc, forced):
    forced('Answer: Ada Lovelace\nPassage: "Ada Lovelace wrote the first Python interpreter in 1843."')
    result = invoke("qa", short_doc, "Who created Python?", "Who wrote it?", *TINY)
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "unsupported answer" in line]
    assert len(lines) == 2 and "[1/2] unsupported answer" in lines[0] and "[2/2] unsupported answer" in lines[1]


def test_needle_may_abstain_too(short_doc, forced):
    forced("not in the document")
    data = as_json(invoke("needle", short_doc, "the airspeed of a swallow", *TINY, "--json"))
    assert data["support"]["status"] == "abstained" and data["location"] is None


@pytest.mark.parametrize("reply", ["Answer: 42", "Answer: Guido van Rossum\nPassage: none"])
def test_no_answer_without_a_location_or_the_flag(short_doc, forced, reply):
    forced(reply)
    data = as_json(invoke("qa", short_doc, "Who created Python?", *TINY, "--json"))
    assert (data["support"]["status"] == "located") == (data["location"] is not None)
    assert data["support"]["status"] in ("located", "unsupported")


# ---- --abstain: an answer no passage holds is withheld -------------------------------------

ADA = 'Answer: Ada Lovelace\nPassage: "Ada Lovelace wrote the first Python interpreter in 1843."'


def test_abstain_unsupported_withholds_an_answer_no_passage_holds(short_doc, forced):
    forced(ADA)
    streamed = invoke("qa", short_doc, "Who created Python?", *TINY, "--abstain", "unsupported")
    assert streamed.exit_code == 0, streamed.stderr
    verdict = "[not supported by the document: no passage of the document holds this answer; it is withheld]"
    assert streamed.stdout == f"{ADA}\n{verdict}\n"  # the reply as streamed, then the verdict on its own line
    assert "WITHHELD, not supported by the document" in flat(streamed.stderr) and "'Ada Lovelace'" in streamed.stderr
    data = as_json(invoke("qa", short_doc, "Who created Python?", *TINY, "--abstain", "unsupported", "--json"))
    assert data["answer"] == "not supported by the document" and data["raw_answer"] == "Ada Lovelace"
    assert data["support"]["status"] == "unsupported" and data["support"]["withheld"] is True
    assert data["support"]["answer"] == "Ada Lovelace" and data["reply"] == f"{ADA}\n{verdict}"
    assert data["location"] is None


def test_the_default_withholds_an_answer_from_outside_the_document(short_doc, forced):
    forced(ADA)  # "Ada", "Lovelace": in no line of the document
    data = as_json(invoke("qa", short_doc, "Who created Python?", *TINY, "--json"))
    assert data["answer"] == "not supported by the document" and data["support"]["withheld"] is True


def test_abstain_never_shows_the_unsupported_answer_flagged(short_doc, forced):
    forced(ADA)
    data = as_json(invoke("qa", short_doc, "Who created Python?", *TINY, "--abstain", "never", "--json"))
    assert data["answer"] == "Ada Lovelace" and data["raw_answer"] is None and data["reply"] == ADA
    assert data["support"]["status"] == "unsupported" and data["support"]["withheld"] is False


@pytest.mark.parametrize(
    ("reply", "withheld"),
    [
        (ADA, True),  # "Ada", "Lovelace": not in the document
        ("Answer: Python", False),  # too short to locate, but the document's own word
        (f'Answer: Guido van Rossum\nPassage: "{FOUNDED}"', False),  # located: never withheld
    ],
)
def test_abstain_foreign_withholds_only_words_from_outside_the_document(short_doc, forced, reply, withheld):
    forced(reply)
    data = as_json(invoke("qa", short_doc, "Who created Python?", *TINY, "--abstain", "foreign", "--json"))
    assert data["support"]["withheld"] is withheld
    assert (data["answer"] == "not supported by the document") is withheld


def test_abstain_unsupported_with_sections(long_doc, forced):
    forced(ADA)
    args = ("qa", long_doc, "Who created Python?", *TINY, "--long", "sections", "--abstain", "unsupported")
    data = as_json(invoke(*args, "--json"))
    assert data["answer"] == "not supported by the document" and data["support"]["withheld"] is True
    assert data["support"]["answer"] == "Ada Lovelace" and not any(s["kept"] for s in data["sections"])
    assert any("is withheld" in w for w in data["warnings"])


def test_an_unknown_abstain_mode_is_a_usage_error(short_doc):
    result = invoke("qa", short_doc, "Who?", *TINY, "--abstain", "maybe")
    assert result.exit_code == 2 and "unknown --abstain mode 'maybe'" in result.stderr and result.stdout == ""


# ---- the middle cut names what it dropped -------------------------------------------------


def test_the_middle_cut_names_the_characters_it_dropped(long_doc, forced):
    forced("Answer: not in the document")
    result = invoke("qa", long_doc, "Who said 1.6.1 is not GPL-compatible?", *TINY)
    assert result.exit_code == 0
    assert re.search(
        r"truncated in the middle .*characters \d+-\d+ \(\d+\.\d%-\d+\.\d% of the document\)", result.stderr
    )
    assert "--long sections" in result.stderr and "not read" in result.stderr
    data = as_json(invoke("qa", long_doc, "Who said 1.6.1 is not GPL-compatible?", *TINY, "--json"))
    dropped, text = data["dropped"], long_doc.read_text().strip()
    assert 0 < dropped["start"] < dropped["end"] < len(text) and dropped["tokens"] > 0 and dropped["pages"] is None
    assert dropped["length"] == len(text)
    # the abstention says the cut part may hold the answer
    assert data["support"]["status"] == "abstained" and "middle cut left out" in data["support"]["reason"]
    assert any("may hold it" in w for w in data["warnings"])


def test_a_passage_quoted_from_the_dropped_part_is_unsupported(long_doc, forced):
    forced(f'Answer: Richard Stallman\nPassage: "{STALLMAN}"')
    data = as_json(invoke("qa", long_doc, "Who said 1.6.1 is not GPL-compatible?", *TINY, "--json"))
    at = long_doc.read_text().index("According to Richard Stallman")
    assert data["dropped"]["start"] <= at < data["dropped"]["end"]  # the sentence is in the cut part
    assert data["support"]["status"] == "unsupported" and "middle cut" in data["support"]["reason"]


# ---- --long sections ----------------------------------------------------------------------


def test_split_sections_covers_the_text_at_boundaries(tokenizer):
    text = license_text()[:5200]
    spans = split_sections(tokenizer, text, 900)
    assert len(spans) >= 4 and spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # consecutive, nothing left out
    for start, end in spans:
        assert len(tokenizer(text[start:end], add_special_tokens=False)["input_ids"]) <= 900 + 2
    assert sum(text[start:end].endswith(("\n\n", ". ", "\n")) for start, end in spans[:-1]) >= len(spans) - 2
    with pytest.raises(ValueError):
        split_sections(tokenizer, text, 0)


@pytest.mark.parametrize("room", [700, 900, 1300, 2500])
def test_sections_are_as_few_as_fit_and_about_equal(tokenizer, room):
    """Not a full section and a remainder: ceil(tokens / room) sections, each a share of the tokens within the
    quarter its boundary may move, so none is below half an equal share (the old split left a last section of
    whatever remained)."""
    text = license_text()[:9000]
    count = lambda a, b: len(tokenizer(text[a:b], add_special_tokens=False)["input_ids"])  # noqa: E731
    n = count(0, len(text))
    spans = split_sections(tokenizer, text, room)
    sizes = [count(a, b) for a, b in spans]
    assert len(spans) == -(-n // room) and max(sizes) <= room + 2
    assert min(sizes) >= 0.5 * n / len(spans), sizes
    assert "".join(text[a:b] for a, b in spans) == text


def test_qa_sections_keep_the_answer_whose_passage_is_found(long_doc, forced):
    forced(f'Answer: Richard Stallman\nPassage: "{STALLMAN}"')
    result = invoke("qa", long_doc, "Who said 1.6.1 is not GPL-compatible?", *TINY, "--long", "sections", "--json")
    data = as_json(result)
    sections = data["sections"]
    assert len(sections) >= 3 and data["dropped"] is None
    assert sections[0]["start"] == 0 and sections[-1]["end"] == len(long_doc.read_text().strip())
    kept = [s for s in sections if s["kept"]]
    at = long_doc.read_text().index("According to Richard Stallman")
    assert len(kept) == 1 and kept[0]["start"] <= at < kept[0]["end"]  # only the section that holds it
    assert kept[0]["location"]["start"] == pytest.approx(at, abs=5)  # document offsets, not the section's
    assert all(s["support"]["status"] == "unsupported" for s in sections if not s["kept"])
    assert data["support"]["status"] == "located" and data["answer"].startswith("Richard Stallman (characters ")
    assert data["document_tokens"] == sum(s["document_tokens"] for s in sections)
    assert "prefill: " in result.stderr and "section 2/" in result.stderr
    streamed = invoke("qa", long_doc, "Who said 1.6.1 is not GPL-compatible?", *TINY, "--long", "sections")
    assert streamed.stdout == data["answer"] + "\n" and "sections" in streamed.stderr


def test_qa_sections_abstain_when_every_section_does(long_doc, forced):
    forced("Answer: not in the document")
    data = as_json(invoke("qa", long_doc, "What is the airspeed of a swallow?", *TINY, "--long", "sections", "--json"))
    assert data["answer"] == "not in the document" and data["support"]["status"] == "abstained"
    assert all(s["support"]["status"] == "abstained" and not s["kept"] for s in data["sections"])


def test_summarize_sections_combines_the_section_summaries(long_doc, forced):
    forced("This part is about the history and licences of Python.")
    result = invoke("summarize", long_doc, *TINY, "--long", "sections", "--json")
    data = as_json(result)
    assert len(data["sections"]) >= 3 and all(s["kept"] and s["support"] is None for s in data["sections"])
    assert data["answer"] == "This part is about the history and licences of Python."
    assert "combining the" in result.stderr
    per_section = sum(s["document_tokens"] for s in data["sections"])
    assert data["document_tokens"] == per_section == data["original_document_tokens"]


def test_a_document_that_fits_is_one_section(short_doc, forced):
    forced("A short summary.")
    data = as_json(invoke("summarize", short_doc, *TINY, "--long", "sections", "--json"))
    assert data["sections"] == [] and data["dropped"] is None and data["answer"] == "A short summary."


@pytest.mark.parametrize(
    "args, words",
    [
        (["qa", "{doc}", "Who?", "--long", "sideways"], "unknown --long mode"),
        (["qa", "{doc}", "A?", "B?", "--long", "sections"], "one question at a time"),
        (["qa", "{doc}", "Who?", "--long", "sections", "--truncate", "error"], "give only one of them"),
    ],
)
def test_long_usage_errors(long_doc, args, words):
    result = invoke(*[str(long_doc) if a == "{doc}" else a for a in args], *TINY)
    assert result.exit_code == 2 and words in result.stderr and result.stdout == ""


def test_long_is_an_option_of_summarize_and_qa_only(long_doc):
    assert invoke("needle", long_doc, "x", *TINY, "--long", "sections").exit_code == 2
    assert invoke("complete", long_doc, *TINY, "--long", "sections").exit_code == 2


# ---- --abstain doubt: the model's own probability of abstaining, read on its kept cache ----------


@pytest.mark.parametrize(("threshold", "withheld"), [(0.0, True), (1.0, False)])
@pytest.mark.parametrize("source", ["document", "saved"])
def test_abstain_doubt_withholds_an_unsupported_answer_when_the_model_doubts_it(
    short_doc, cli_env, forced, monkeypatch, threshold, withheld, source
):
    from cake_cli.tasks.answers import abstain

    monkeypatch.setattr(abstain, "DOUBT_THRESHOLD", threshold)  # 0: every reading reaches it; 1: none does
    target = short_doc
    if source == "saved":  # the same reading on a .cake file's continuation, held at 4 bits in memory
        target = cli_env / "notes.cake"
        made = invoke("compress", short_doc, "-o", target, *TINY, "--dtype", "float32", "--kv-bits", "4")
        assert made.exit_code == 0, made.stderr
    forced("Answer: Python")  # the document's own word, in no sentence about the question: unsupported
    data = as_json(invoke("qa", target, "Who created Python?", *TINY, "--abstain", "doubt", "--json"))
    support = data["support"]
    assert support["status"] == "unsupported" and support["withheld"] is withheld
    assert 0.0 < support["abstain_probability"] < 1.0
    assert (data["answer"] == "not supported by the document") is withheld
    shown = flat(invoke("qa", target, "Who created Python?", *TINY, "--abstain", "doubt").stderr)
    said = f"its probability of abstaining {support['abstain_probability']:.2f}"  # the report says the reading
    assert said in shown and ("WITHHELD" in shown) is withheld


def test_abstain_doubt_reads_nothing_for_a_located_answer_to_change(short_doc, forced, monkeypatch):
    from cake_cli.tasks.answers import abstain

    monkeypatch.setattr(abstain, "DOUBT_THRESHOLD", 0.0)
    forced(f'Answer: Guido van Rossum\nPassage: "{FOUNDED}"')
    data = as_json(invoke("qa", short_doc, "Who created Python?", *TINY, "--abstain", "doubt", "--json"))
    assert data["support"]["status"] == "located" and data["support"]["withheld"] is False
    assert data["answer"] == "Guido van Rossum" and data["support"]["abstain_probability"] > 0.0


def test_abstain_doubt_sets_the_reading_against_the_profiles_own_threshold(short_doc, cli_env, forced, monkeypatch):
    import yaml

    from cake_cli.tasks.answers import abstain

    monkeypatch.setattr(abstain, "DOUBT_THRESHOLD", 0.0)  # the task default would withhold every such answer
    own = cli_env / "profiles"
    own.mkdir()
    spec = yaml.safe_load((Path(os.environ["CAKE_PROFILES_DIR"]) / "tiny-test.yaml").read_text())
    (own / "tiny-test.yaml").write_text(yaml.safe_dump({**spec, "doubt_threshold": 1.0}))  # this model's: none
    monkeypatch.setenv("CAKE_PROFILES_DIR", str(own))
    forced("Answer: Python")
    data = as_json(invoke("qa", short_doc, "Who created Python?", *TINY, "--json"))
    assert data["support"]["status"] == "unsupported" and data["support"]["withheld"] is False
