"""`cake bench quality` and `cake bench tau-search` end to end on the tiny random model (CliRunner)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml
from typer.testing import CliRunner

import cake_cli.bench.quality.run as quality_module
import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
from cake_cli.bench.quality.report import summarize, target_checks
from cake_cli.bench.quality.tables import markdown
from cake_cli.bench.suites import parse_variants
from cake_cli.cli.main import app
from cake_cli.errors import UsageError

runner = CliRunner()
TINY = [
    "--model",
    "tiny-test",
    "--haystack",
    "python-docs",
    "--tasks",
    "s-rt,m-rt,m-rs",
    "--lengths",
    "400",
    "--depths",
    "0.5",
    "--repeats",
    "1",
    "--threads",
    "1",
]  # 1 thread: fastest on a busy CI box


@pytest.fixture
def count_prefills(monkeypatch):
    """Counts the recorded prefills (one per case and length)."""
    calls = []
    real = quality_module.record

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(quality_module, "record", counting)  # where the grid runner looks it up
    return calls


@pytest.mark.slow
def test_quality_end_to_end_then_resume(cli_env, count_prefills):
    out = cli_env / "results.json"
    args = [
        "bench",
        "quality",
        *TINY,
        "--budgets",
        "32,64",
        "--methods",
        "full,snapkv,cake",
        "--pairings",
        "cake+snapkv",
        "--output",
        str(out),
        "--markdown",
        str(cli_env / "tables.md"),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert len(rows) == 3 * (1 + 3 * 2)  # 3 tasks x (full once + 3 evicting variants x 2 budgets)
    assert len(count_prefills) == 3  # one recorded prefill per case
    assert all(0.0 <= r["score"] <= 1.0 for r in rows)
    assert {r["method"] for r in rows} == {"full", "snapkv", "cake", "cake+snapkv"}
    assert all(r["prompt_tokens"] <= 1500 and abs(r["prompt_tokens"] - 400) <= 40 for r in rows)
    assert data["meta"]["split"] == "eval" and data["meta"]["model"].startswith("tiny-test")
    keys = {(r["task"], r["case_id"], r["length"], r["method"], r["budget"]) for r in rows}
    assert len(keys) == len(rows)
    assert "overall" in result.stdout and "B=32" in result.stdout
    assert "| method | B=32 | B=64 |" in (cli_env / "tables.md").read_text()
    if importlib.util.find_spec("matplotlib") is not None:
        png = out.with_suffix(".png")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # resume: nothing left to do, nothing recomputed
    count_prefills.clear()
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.stderr
    assert count_prefills == []
    assert json.loads(out.read_text())["rows"] == rows
    assert "resuming" in again.stderr
    # a subset with nothing to run still records its own settings in the file's meta
    subset = runner.invoke(app, [a if a != "32,64" else "32" for a in args])
    assert subset.exit_code == 0, subset.stderr
    assert count_prefills == [] and set(json.loads(out.read_text())["meta"]["taus"]) == {"32"}

    # a new budget: only its cells run (one prefill per case again), old rows kept as they were
    more = runner.invoke(app, [a if a != "32,64" else "32,64,128" for a in args])
    assert more.exit_code == 0, more.stderr
    rows3 = json.loads(out.read_text())["rows"]
    assert len(count_prefills) == 3
    assert len(rows3) == len(rows) + 3 * 3 and rows3[: len(rows)] == rows


def test_quality_json_summary(cli_env):
    result = runner.invoke(
        app, ["bench", "quality", *TINY, "--tasks", "s-rt", "--budgets", "32", "--methods", "full,cake", "--json"]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert {"meta", "summary", "checks"} <= set(data)
    scores = {(s["task"], s["method"], s["budget"], s["length"]) for s in data["summary"]["scores"]}
    assert ("overall", "cake", 32, None) in scores and ("s-rt", "full", 32, 400) in scores


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--methods", "cak"], "did you mean 'cake'"),
        (["--pairings", "cake+nope"], "unknown pairing"),
        (["--tasks", "s-rt,xx"], "unknown task"),
        (["--budgets", "4"], "not above the 8-token observation window"),
        (["--depths", "1.5"], "--depths"),
        (["--haystack", "nope"], "unknown haystack"),
    ],
)
def test_quality_usage_errors(cli_env, extra, message):
    result = runner.invoke(app, ["bench", "quality", *TINY, "--budgets", "32", *extra])
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert result.stdout == ""


def test_resume_refuses_a_file_from_another_setup(cli_env):
    out = cli_env / "r.json"
    base = ["bench", "quality", *TINY, "--tasks", "s-rt", "--budgets", "32", "--methods", "cake", "-o", str(out)]
    assert runner.invoke(app, base).exit_code == 0
    other = runner.invoke(app, [*base, "--window", "16"])
    assert other.exit_code == 2 and "window" in other.stderr


def test_tau_search_writes_the_profile(cli_env, tiny_profile_dir, tmp_path):
    profile = tmp_path / "tiny-test.yaml"
    original = (tiny_profile_dir / "tiny-test.yaml").read_text()
    profile.write_text("# a comment kept\n" + original)
    result = runner.invoke(
        app,
        [
            "bench",
            "tau-search",
            *TINY,
            "--tasks",
            "s-rt,m-rs",
            "--budgets",
            "32",
            "--tau1",
            "0.5,1",
            "--tau2",
            "1,2",
            "--write-profile",
            str(profile),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    (chosen,) = data["budgets"]
    assert chosen["budget"] == 32 and len(chosen["grid"]) == 4
    best = max(chosen["grid"], key=lambda g: g["score"])["score"]
    assert chosen["best"]["score"] == best
    text = profile.read_text()
    assert text.startswith("# a comment kept\n")
    written = yaml.safe_load(text)
    points = {p["budget"]: (p["tau1"], p["tau2"]) for p in written["taus"]}
    assert points[32] == (chosen["best"]["tau1"], chosen["best"]["tau2"])
    assert points[256] == (0.5, 2.0)  # a budget not searched keeps its point
    assert written["tau_source"].startswith("cake bench tau-search") and "tune split" in written["tau_source"]
    assert {k: v for k, v in written.items() if k not in ("taus", "tau_source")} == {
        k: v for k, v in yaml.safe_load(original).items() if k not in ("taus", "tau_source")
    }


def test_parse_variants_and_target_checks():
    names = [v.name for v in parse_variants("full,cake,cake", "cake+snapkv,uniform+cake")]
    assert names == ["full", "cake", "cake+snapkv", "uniform+cake"]
    with pytest.raises(UsageError):
        parse_variants("", "")
    rows = [
        {"task": "s-rt", "case_id": "a", "length": 100, "method": m, "budget": b, "score": s}
        for m, b, s in [
            ("full", None, 1.0),
            ("cake", 32, 0.96),
            ("snapkv", 32, 0.5),
            ("cake", 64, 0.4),
            ("snapkv", 64, 0.6),
        ]
    ]
    summary = summarize(rows, ["full", "snapkv", "cake"], [32, 64])
    assert summary.get("overall", "full", 64) == 1.0  # full shown at every budget
    checks = target_checks(summary, targets=[(32, 100, 0.95)])
    assert checks[0].startswith("PASS B=32 at all lengths") and checks[1].startswith("FAIL B=64 at all lengths")
    assert checks[2].startswith("PASS B=32 at 100 tokens: cake") and checks[3].startswith("FAIL B=64 at 100 tokens")
    assert "beaten by snapkv 60.0" in checks[3]
    assert checks[4].startswith("PASS B=32 at 100 tokens: cake 96.0 vs full") and "96% of full" in checks[4]
    assert len(checks) == 5


def test_paired_counts_compare_the_same_cases():
    # two cases at one length; full has no budget and is compared at every budget
    scores = {
        ("a", "full", None): 1.0,
        ("a", "cake", 32): 0.5,
        ("a", "snapkv", 32): 0.5,
        ("b", "full", None): 0.2,
        ("b", "cake", 32): 0.9,
        ("b", "snapkv", 32): 0.1,
        ("a", "cake", 64): 1.0,
        ("a", "snapkv", 64): 0.7,
    }  # case b has no B=64 answers: not counted
    rows = [
        {"task": "s-rt", "case_id": c, "length": 100, "method": m, "budget": b, "score": s}
        for (c, m, b), s in scores.items()
    ]
    summary = summarize(rows, ["full", "snapkv", "cake"], [32, 64])
    assert summary.paired == {
        ("full", 32): (1, 0, 1),
        ("snapkv", 32): (1, 1, 0),
        ("full", 64): (0, 1, 0),
        ("snapkv", 64): (1, 0, 0),
    }
    assert summary.paired_grid() == [["full", "1-0-1", "0-1-0"], ["snapkv", "1-1-0", "1-0-0"]]
    assert {"method": "cake", "versus": "snapkv", "budget": 32, "wins": 1, "ties": 1, "losses": 0} in summary.to_json()[
        "paired"
    ]
    assert "| snapkv | 1-1-0 | 1-0-0 |" in markdown(summary)
