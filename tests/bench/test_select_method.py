"""`--methods NAME@select` in `cake bench quality --suite real`: a method answering on the prompt
`cake qa --prefill select` reads. Oracle: for every cell, the selection made afresh on the whole prompt
(no shared prefix) and a live prefill + decode of the kept tokens give the row's very answer."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import cake_cli.bench.quality.real as real
import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
from cake_cli.bench.suites import parse_variants
from cake_cli.cli.main import app
from cake_cli.engine.generate import generate
from cake_cli.engine.selection import select_tokens
from cake_cli.errors import UsageError
from cake_cli.tasks.request import SELECT_FACTOR
from cake_cli.tasks.templates import load_template

runner = CliRunner()


def test_select_variants_are_their_method_on_the_selected_prompt():
    chunk, sized, cake = parse_variants("cake-chunk@select,cake-chunk:20@select,cake")
    assert (chunk.name, chunk.allocation, chunk.indicator, chunk.select) == ("cake-chunk@select", "cake", "chunk", True)
    assert (sized.chunk, sized.select, sized.name) == (20, True, "cake-chunk:20@select")
    assert not cake.select
    for bad in ("full@select", "nonsense@select"):
        with pytest.raises(UsageError, match="runs a method with a budget"):
            parse_variants(bad)
    early, default = parse_variants("cake@select:3,cake@select")
    assert (early.name, early.select_layer, default.select_layer) == ("cake@select:3", 3, None)
    for bad in ("cake@select:x", "cake@select3", "cake@select:"):
        with pytest.raises(UsageError, match="whole number"):
            parse_variants(bad)


@pytest.mark.parametrize(
    "extra, message",
    [([], "runs on --suite real"), (["--suite", "real", "--long", "sections"], "--long middle only")],
    ids=["needle-suite", "sections"],
)
def test_select_variants_are_refused_where_no_single_prompt_is_selected(cli_env, extra, message):
    result = runner.invoke(app, ["bench", "quality", "--model", "tiny-test", "--methods", "cake,cake@select", *extra])
    assert result.exit_code == 2 and message in result.stderr


def test_each_select_answer_is_a_live_prefill_of_the_tokens_selected_on_the_whole_prompt(cli_env):
    out = cli_env / "real.json"
    args = ["bench", "quality", "--suite", "real", "--model", "tiny-test", "--threads", "1", "--quick"]
    args += ["--documents", "python-textwrap", "--lengths", "600", "--window", "16", "--budgets", "48,256"]
    args += ["--methods", "full,cake,cake@select,cake@select:0", "--output", str(out)]
    checked = []  # (budget, kept of n, the row's answer == the oracle's)
    kept_at = {}  # (method, budget) -> the tokens kept (the last question's)
    original = real.replay_selected

    def oracle(model, ids, protect_from, cells, configs, new_tokens, label, **kw):
        steps = []
        got = original(model, ids, protect_from, cells, configs, new_tokens, label, **(kw | {"on_step": steps.append}))
        assert len(steps) == len(cells) + real.selection_steps(cells)  # the progress bar's count is exact
        question = model.tokenizer.decode(ids[0, protect_from:].tolist())
        for (variant, budget), (_, _, config, text, *_) in zip(cells, got):
            assert kw["prefix"] is not None  # the suite's shared prefix was used; the oracle runs without it
            assert config == variant.config(configs[budget])
            tokens, layer = SELECT_FACTOR * budget, variant.select_layer
            sel = select_tokens(model.model, ids, protect_from=protect_from, tokens=tokens, layer=layer)
            live = generate(model.model, sel.ids(ids), variant.config(configs[budget]),
                            max_new_tokens=new_tokens, stop_ids=model.stop_ids)  # fmt: skip
            want = model.tokenizer.decode(list(live.token_ids), skip_special_tokens=True).strip()
            checked.append((budget, len(sel.kept), ids.shape[1], text == want, "Question" in question))
            kept_at[(variant.name, budget)] = sel.kept
        return got

    short = lambda name: replace(load_template(name), max_new_tokens=8)  # noqa: E731 - the prefill is what differs
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(real, "replay_selected", oracle)
        mp.setattr(real, "load_template", short)
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert sorted(r["method"] for r in rows) == sorted(["full"] * 2 + ["cake", "cake@select", "cake@select:0"] * 4)
    assert len(checked) == 8 and all(same for *_, same, _ in checked)
    assert kept_at[("cake@select:0", 48)] != kept_at[("cake@select", 48)]  # another layer, another selection
    assert all(has_question for *_, has_question in checked)
    small = [(kept, n) for budget, kept, n, *_ in checked if budget == 48]
    assert all(kept < n for kept, n in small)  # 4 x 48 document tokens kept: the selection dropped some
    assert all(kept == n for budget, kept, n, *_ in checked if budget == 256)  # 1024 >= the document: all kept
    answers = {(r["case_id"], r["method"], r["budget"]): r["prediction"] for r in rows}
    for (case, method, budget), text in answers.items():  # nothing dropped: the method's own answer
        if method == "cake@select" and budget == 256:
            assert text == answers[(case, "cake", 256)]


def test_a_selection_layer_past_the_model_is_refused_in_one_line(cli_env):
    args = ["bench", "quality", "--suite", "real", "--model", "tiny-test", "--threads", "1", "--quick"]
    args += ["--documents", "python-textwrap", "--lengths", "600", "--budgets", "48", "--methods", "cake@select:9"]
    result = runner.invoke(app, [*args, "--output", str(cli_env / "r.json")])
    assert result.exit_code == 1, result.stderr
    assert "'cake@select:9': layer 9 is past this model's 4 layers" in result.stderr
    assert "Traceback" not in result.stderr and not (cli_env / "r.json").exists()
