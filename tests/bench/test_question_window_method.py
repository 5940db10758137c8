"""`cake-qwin` in `cake bench quality`: CAKE whose prefill scores with the question's window rows only."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import cake_cli.bench.quality.real as real
import cake_cli.bench.quality.run as run
import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
from cake_cli.bench.quality.run import kept_key
from cake_cli.bench.suites import Variant, parse_variants
from cake_cli.cli.main import app
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.methods import PAPER_METHODS, label
from cake_cli.errors import UsageError
from cake_cli.tasks.question_window import question_rows
from cake_cli.tasks.templates import load_template

runner = CliRunner()


def test_cake_qwin_is_cake_with_the_question_window_and_not_a_paper_method():
    full, cake, qwin = parse_variants("full,cake,cake-qwin")
    assert (qwin.name, qwin.allocation, qwin.indicator, qwin.question_window) == ("cake-qwin", "cake", "cake", True)
    assert not cake.question_window and cake.name == "cake"
    assert label(qwin.allocation, qwin.indicator) == "cake"  # the pairing is CAKE's; the variant name says qwin
    assert "cake-qwin" not in PAPER_METHODS
    base = CakeConfig(budget=64)
    assert qwin.config(base, 11).score_rows == 11 and cake.config(base, 11).score_rows == 0
    with pytest.raises(UsageError, match="cake-qwin"):
        parse_variants("cake-qwn")  # did you mean


def test_kept_key_tells_score_rows_apart():
    class State:  # what kept_key reads of a replayed prefill
        lengths = [3]
        cache = type("C", (), {"layers": []})()

    config = CakeConfig(budget=64)
    assert kept_key(State, config) != kept_key(State, replace(config, score_rows=12))


def test_a_grid_without_question_rows_refuses_cake_qwin():
    qwin = Variant("cake-qwin", "cake", "cake", question_window=True)
    with pytest.raises(ValueError, match="question_rows"):
        run.replay_cells(None, None, None, [(qwin, 64)], {64: CakeConfig(budget=64)}, 4, "case")


def test_the_needle_suite_refuses_cake_qwin(cli_env):
    result = runner.invoke(app, ["bench", "quality", "--model", "tiny-test", "--methods", "cake,cake-qwin"])
    assert result.exit_code == 2 and "cake-qwin runs on --suite real only" in result.stderr


def test_the_real_suite_runs_cake_qwin_with_each_prompts_question_rows(cli_env):
    out = cli_env / "real.json"
    args = ["bench", "quality", "--suite", "real", "--model", "tiny-test", "--threads", "1", "--quick"]
    args += ["--documents", "python-textwrap", "--lengths", "600", "--window", "64", "--budgets", "96"]
    args += ["--methods", "full,cake,cake-qwin", "--output", str(out)]
    seen = []  # the score_rows of every replay (None: the full cache)
    original = run.replay

    def spy(rec, config):
        seen.append(None if config is None else config.score_rows)
        return original(rec, config)

    short = lambda name: replace(load_template(name), max_new_tokens=8)  # noqa: E731 - the prefill is what differs
    cases = []
    build = real.build_case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run, "replay", spy)
        mp.setattr(real, "load_template", short)
        mp.setattr(real, "build_case", lambda *a, **k: cases.append(build(*a, **k)) or cases[-1])
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert sorted(r["method"] for r in rows) == sorted(["full", "cake", "cake-qwin"] * 2)  # 2 questions (quick)
    assert {r["budget"] for r in rows if r["method"] != "full"} == {96}
    from tests.helpers.tiny import build_tiny_tokenizer  # noqa: PLC0415 - the tiny-test model's tokenizer

    tok = build_tiny_tokenizer()
    want = [question_rows(tok, case.input_ids, case.question.question) for case in cases]
    assert len(cases) == 2 and all(0 < r < 64 for r in want)  # fewer rows than the window: it matters
    assert seen == [x for r in want for x in (None, 0, r)]  # full, cake, cake-qwin per case
