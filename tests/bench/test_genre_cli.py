"""`cake bench quality --suite genres` and `cake bench tau-search --suite genres` end to end on the
tiny random model (CliRunner), on the two genres that need no extra package."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
from cake_cli.cli.main import app

runner = CliRunner()
TINY = ["--model", "tiny-test", "--suite", "genres", "--genres", "reference,code", "--lengths", "400"]
TINY += ["--depths", "0.5", "--threads", "1"]


def test_quality_genres_splits_intervals_and_survival(cli_env):
    out = cli_env / "genres.json"
    args = ["bench", "quality", *TINY, "--tasks", "s-rt,m-each", "--repeats", "3", "--budgets", "32"]
    args += ["--methods", "full,snapkv,cake", "--diagnose", "survival", "-o", str(out), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data["splits"]["score"]) == {"tune", "held-out"}  # reference is tuned on, code held out
    assert data["meta"]["genres"] == ["reference", "code"] and data["meta"]["seed"] == 0
    splits = {r["genres"] for r in data["intervals"]}
    assert splits == {"tune", "held-out", "all genres"}
    assert all(r["cake vs"] in ("full", "snapkv") for r in data["intervals"])
    assert any(line.startswith(("SUPPORTED", "NOT SHOWN")) and "held-out" in line for line in data["claims"])
    assert {r["method"] for r in data["survival"]} == {"snapkv", "cake"}
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 3 * 3  # genres x tasks x repeats x (full, snapkv@32, cake@32)
    for r in rows:
        assert r["genre"] in ("reference", "code") and r["split"] == (
            "tune" if r["genre"] == "reference" else "held-out"
        )
        assert len(r["survival"]) == 4 and all(
            len(layer) == (3 if r["task"] == "m-each" else 1) for layer in r["survival"]
        )
        if r["method"] == "full":
            assert all(v == 1.0 for layer in r["survival"] for v in layer)
    ids = {r["case_id"] for r in rows if r["task"] == "m-each"}
    assert ids == {f"{g}/d50-n{i}" for g in ("reference", "code") for i in range(3)}
    again = runner.invoke(app, args)  # resumed: nothing left to run, the same tables
    assert again.exit_code == 0 and json.loads(again.stdout)["intervals"] == data["intervals"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--genres", "poetry"], "unknown genre"),
        (["--tasks", "s-rt,xx"], "unknown task"),
        (["--diagnose", "memory"], "--diagnose"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_quality_genres_usage_errors(cli_env, extra, message):
    result = runner.invoke(app, ["bench", "quality", *TINY, "--budgets", "32", *extra])
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr and result.stdout == ""


def test_genre_options_need_the_genre_suite(cli_env):
    result = runner.invoke(app, ["bench", "quality", "--model", "tiny-test", "--genres", "code"])
    assert result.exit_code == 2 and "--suite genres" in result.stderr
    result = runner.invoke(app, ["bench", "tau-search", "--model", "tiny-test", "--pooling", "max"])
    assert result.exit_code == 2 and "--suite genres" in result.stderr
    result = runner.invoke(app, ["bench", "tau-search", *TINY, "--kernels", "4"])
    assert result.exit_code == 2 and "odd" in result.stderr
    result = runner.invoke(app, ["bench", "tau-search", *TINY[:4], "--genres", "reference", "--lengths", "400"])
    assert result.exit_code == 2 and "none of the held-out genres" in result.stderr


def test_profile_search_writes_pooling_gamma_and_taus(cli_env, tiny_profile_dir, tmp_path):
    profile = tmp_path / "tiny-test.yaml"
    profile.write_text((tiny_profile_dir / "tiny-test.yaml").read_text())
    out = tmp_path / "search.json"
    args = ["bench", "tau-search", *TINY, "--tasks", "s-rt", "--budgets", "32", "--tau1", "1,2", "--tau2", "1"]
    args += ["--pooling", "avg,max", "--kernels", "3,7", "--gammas", "100,200", "-o", str(out)]
    result = runner.invoke(app, [*args, "--write-profile", str(profile), "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    (chosen,) = data["budgets"]
    assert len(chosen["points"]) == 2 * 1 * 2 * 2 * 2  # every grid point scored, on both genre sides
    best = chosen["best"]
    held = [
        p
        for p in chosen["points"]
        if (p["pooling"], p["kernel"], p["gamma"]) == (best["pooling"], best["kernel"], best["gamma"])
    ]
    assert best["score"] == max(p["score"] for p in held)
    assert {r["method"] for r in data["references"]} == {"full", "snapkv"}
    written = yaml.safe_load(profile.read_text())
    assert (
        written["pooling"] == {"kind": best["pooling"], "kernel": best["kernel"]} and written["gamma"] == best["gamma"]
    )
    assert "held-out genres" in written["tau_source"]
    rows = json.loads(out.read_text())["rows"]
    assert len({r["method"] for r in rows}) == 16 + 2  # every answer is in the run file


def test_survival_tables_on_the_needle_suite(cli_env):
    args = ["bench", "quality", "--model", "tiny-test", "--haystack", "python-docs", "--tasks", "s-rt,m-rt"]
    args += ["--lengths", "400", "--depths", "0.5", "--repeats", "1", "--budgets", "32,64", "--threads", "1"]
    result = runner.invoke(app, [*args, "--methods", "full,cake,streamingllm", "--diagnose", "survival"])
    assert result.exit_code == 0, result.stderr
    assert "fact tokens kept: mean % over layers" in result.stdout
    assert "fact tokens kept per layer at B=32" in result.stdout
    plain = runner.invoke(app, [*args, "--methods", "full,cake"])
    assert plain.exit_code == 0 and "fact tokens kept" not in plain.stdout


def test_dry_run_prints_the_cost_without_loading(cli_env, monkeypatch):
    import cake_cli.cli.runners.bench as bench_runner  # noqa: PLC0415 - patched where the runner loads

    monkeypatch.setattr(bench_runner, "load", lambda *a, **k: pytest.fail("the model must not load on --dry-run"))
    args = ["bench", "tau-search", *TINY, "--tasks", "s-rt,m-rt", "--budgets", "32,64", "--tau1", "1,2"]
    args += ["--tau2", "1", "--pooling", "avg,max", "--kernels", "3", "--dry-run"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    # 2 tasks x 2 genres x 1 depth x 1 repeat x 1 length = 4 prefills; (2 x 1 x 2 x 1 = 4 configs + snapkv) x 2 + full
    assert result.stdout.startswith("6 configs x 2 budgets: 4 recorded prefills, 44 replays")


def test_the_multi_fact_target_line():
    from cake_cli.bench.quality.genre_report import multi_fact_check  # noqa: PLC0415

    def row(method, budget, exact, task="m-rt", genre_split="held-out", length=16384):
        return {
            "task": task,
            "method": method,
            "budget": budget,
            "exact": exact,
            "split": genre_split,
            "length": length,
        }

    rows = [row("full", None, 1.0), row("full", None, 1.0), row("cake", 256, 1.0), row("cake", 256, 0.0)]
    rows += [row("cake", 256, 0.0, genre_split="tune"), row("cake", 256, 0.0, task="s-rt"), row("cake", 128, 0.0)]
    (line,) = multi_fact_check(rows)
    assert line.startswith("FAIL B=256 at 16384 tokens") and "50% of full" in line and "2 cases" in line
    rows += [row("cake", 256, 1.0, task="m-each")] + [row("cake", 256, 1.0, task="m-rs")] * 8  # 10 of 11
    (line,) = multi_fact_check(rows)
    assert line.startswith("PASS") and "91% of full" in line and "11 cases" in line
    assert multi_fact_check([r for r in rows if r["method"] != "full"]) == []
