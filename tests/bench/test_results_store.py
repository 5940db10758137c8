"""The quality results store: rows of another suite setting never enter a run's tables unnoticed."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
from cake_cli.bench.quality.report import check_resumable, of_setting
from cake_cli.bench.quality.run import expected_taus
from cake_cli.bench.suites import CASE_DRAW, Suite, cell_keys, parse_variants
from cake_cli.cli.main import app
from cake_cli.engine.config import CakeConfig
from cake_cli.errors import UsageError
from tests.bench.test_quality import TINY

runner = CliRunner()


def stored(task, cid, length, method, budget, tau=(2.0, 1.5)):
    taus = tau if method == "cake" else (None, None)
    return {"task": task, "case_id": cid, "length": length, "method": method, "budget": budget,
            "tau1": taus[0], "tau2": taus[1], "score": 1.0}  # fmt: skip


def test_cell_keys_name_depth_repeat_and_length():
    variants = parse_variants("full,cake")
    keys = cell_keys(Suite(("s-rt",), (4096, 8192), (0.1, 0.5), 2), variants, [128])
    # depth 0.1 takes indexes 0, 1 and depth 0.5 indexes 2, 3, at each length; full once, cake per budget
    assert keys == {
        ("s-rt", cid, n, m, b)
        for cid in ("d10-n0", "d10-n1", "d50-n2", "d50-n3")
        for n in (4096, 8192)
        for m, b in (("full", None), ("cake", 128))
    }
    one = cell_keys(Suite(("s-rt",), (4096, 8192), (0.1, 0.5), 1), variants, [128])
    assert {k[1] for k in one} == {"d10-n0", "d50-n1"}  # d50-n1 was depth 0.1's second repeat above


def test_of_setting_keeps_only_this_grids_rows():
    variants = parse_variants("full,cake")
    configs = {128: CakeConfig(budget=128, tau1=2.0, tau2=1.5)}
    cells = cell_keys(Suite(("s-rt",), (4096,), (0.1, 0.5, 0.9), 1), variants, [128])
    taus = expected_taus(variants, configs)
    assert taus == {("full", None): None, ("cake", 128): (2.0, 1.5)}
    rows = [
        stored("s-rt", "d10-n0", 4096, "full", None),
        stored("s-rt", "d10-n0", 4096, "cake", 128),
        stored("s-rt", "d10-n1", 4096, "cake", 128),  # a second repeat of a two-repeat run
        stored("s-rt", "d50-n1", 4096, "cake", 128),
        stored("s-rt", "d50-n1", 8192, "cake", 128),  # another length
        stored("s-rt", "d25-n0", 4096, "cake", 128),  # another depth
        stored("s-rt", "d90-n2", 4096, "cake", 128, tau=(2.0, 0.4)),  # other taus (a retuned profile)
        stored("m-rt", "d10-n0", 4096, "cake", 128),  # another task
        stored("s-rt", "d10-n0", 4096, "cake", 256),  # another budget
    ]
    mine, others = of_setting(rows, cells, taus)
    assert mine == rows[:2] + [rows[3]]
    assert others == rows[2:3] + rows[4:]


def test_of_setting_counts_the_last_row_of_a_key():
    variants = parse_variants("full")
    cells = cell_keys(Suite(("s-rt",), (4096,), (0.1,), 1), variants, [128])
    first, last = stored("s-rt", "d10-n0", 4096, "full", None), stored("s-rt", "d10-n0", 4096, "full", None)
    last["score"] = 0.0
    mine, others = of_setting([first, last], cells, expected_taus(variants, {}))
    assert mine == [last] and others == [first]


def test_a_file_of_another_case_draw_is_refused(tmp_path):
    new = {"model": "m", "split": "eval", "haystack": "essays", "window": 32, "dtype": "bfloat16", "draw": CASE_DRAW}
    check_resumable(tmp_path / "r.json", {}, new)  # a new file
    check_resumable(tmp_path / "r.json", dict(new), new)
    old = {k: v for k, v in new.items() if k != "draw"}  # written before the draw was recorded: draw 1
    with pytest.raises(UsageError, match="draw 1"):
        check_resumable(tmp_path / "r.json", old, new)
    with pytest.raises(UsageError, match="dtype"):
        check_resumable(tmp_path / "r.json", {**new, "dtype": "float32"}, new)


def test_a_real_file_scored_under_another_abstention_rule_is_refused(tmp_path):
    new = {"model": "m", "split": "held-out", "window": 32, "dtype": "bfloat16", "draw": CASE_DRAW,
           "abstain": "doubt", "doubt_threshold": None}  # fmt: skip
    check_resumable(tmp_path / "r.json", {}, new)
    check_resumable(tmp_path / "r.json", dict(new), new)
    with pytest.raises(UsageError, match="scored with --abstain foreign") as err:
        check_resumable(tmp_path / "r.json", {**new, "abstain": "foreign"}, new)
    assert "real_merge.py" in err.value.hint and "--abstain doubt" in err.value.hint
    with pytest.raises(UsageError, match="--abstain never"):  # a file from before the mode was stored
        check_resumable(tmp_path / "r.json", {k: v for k, v in new.items() if k != "abstain"}, new)
    with pytest.raises(UsageError, match="doubt threshold 0.3"):
        check_resumable(tmp_path / "r.json", {**new, "doubt_threshold": 0.3}, new)
    foreign = {**new, "abstain": "foreign"}
    check_resumable(tmp_path / "r.json", {**foreign, "doubt_threshold": None}, foreign)  # read by doubt only
    genre = {k: v for k, v in new.items() if k not in ("abstain", "doubt_threshold")}
    check_resumable(tmp_path / "r.json", {**genre, "abstain": "foreign"}, genre)  # not a real-suite run: no rule


def test_resuming_with_fewer_repeats_leaves_the_other_rows_out(cli_env):
    out = cli_env / "r.json"
    base = ["bench", "quality", *TINY, "--tasks", "s-rt", "--budgets", "32", "--methods", "full,cake", "-o", str(out)]
    args_two = list(base)
    args_two[args_two.index("--repeats") + 1] = "2"  # depth 0.5 x 2 repeats: cases d50-n0 and d50-n1
    two = runner.invoke(app, args_two)
    assert two.exit_code == 0, two.stderr
    stored_rows = json.loads(out.read_text())["rows"]
    assert {r["case_id"] for r in stored_rows} == {"d50-n0", "d50-n1"}
    assert json.loads(out.read_text())["meta"]["draw"] == CASE_DRAW

    one = runner.invoke(app, [*base, "--json"])  # --repeats 1: case d50-n0 only
    assert one.exit_code == 0, one.stderr
    assert "2 stored results of another setting" in one.stderr  # d50-n1's full and cake rows, said aloud
    summary = json.loads(one.stdout)["summary"]
    scores = {(s["task"], s["method"], s["budget"], s["length"]): s for s in summary["scores"]}
    assert scores[("s-rt", "cake", 32, None)]["rows"] == 1  # not 2: the second repeat stays out of the tables
    assert json.loads(out.read_text())["rows"] == stored_rows  # nothing rerun, nothing dropped from the file

    meta = json.loads(out.read_text())
    del meta["meta"]["draw"]  # a file from before the QA draw changed
    out.write_text(json.dumps(meta))
    refused = runner.invoke(app, base)
    assert refused.exit_code == 2 and "draw 1" in refused.stderr
