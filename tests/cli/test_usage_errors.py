"""Every mistake on the command line is one line on stderr, with the exit code of its kind (issue 49).

Usage errors (an unknown option, a bad value, an unknown name of anything: model, method, task, …)
exit 2 and name the fix ("did you mean" for a near name); a missing or unreadable file exits 1.
The table runs the real entry point (`cake_cli.cli.main.run`, what `cake` and `python -m cake_cli`
call): Typer's own parse errors are formatted there, outside any command.
"""

from __future__ import annotations

import pytest

from cake_cli.cli.main import run
from cake_cli.errors import EXIT_ERROR, EXIT_USAGE

DOC = "{doc}"  # replaced by the test's document path
TASK_OPTIONS = ["-m", "tiny-test", "-n", "2", "-b", "48"]

# (argv, exit code, words the one line must hold). Each option that takes a name is misspelt by one
# letter, so the "did you mean" must name the right one.
USAGE = [
    (["summarize", DOC, "-b", "abc"], "invalid value for '--budget'"),
    (["summarize", DOC, "--budgte", "64"], "no such option --budgte; did you mean '--budget'"),
    (["summarize", DOC, "--bogus"], "no such option --bogus"),
    (["summarize", DOC, "-b"], "requires an argument"),
    (["qa", DOC, "--temperature", "hot"], "invalid value for '--temperature'"),
    (["qa", DOC], "needs a question"),
    (["sumarize", DOC], "no such command 'sumarize'; did you mean 'summarize'"),
    (["bench", "sped"], "no such command 'sped'; did you mean 'speed'"),
]
NAMES = [  # (argv, the name's correct spelling, which the one line must suggest)
    (["summarize", DOC, "--model", "tiny-tst"], "tiny-test"),
    (["summarize", DOC, "--model", "smollm"], "smollm2"),
    (["summarize", DOC, "--method", "snapk"], "snapkv"),
    (["summarize", DOC, "--allocation", "pyramd"], "pyramid"),
    (["summarize", DOC, "--indicator", "tovaa"], "tova"),
    (["summarize", DOC, "--dtype", "float33"], "float32"),
    (["summarize", DOC, "--weights", "int9"], "int8"),
    (["summarize", DOC, "--attention", "sdpaa"], "sdpa"),
    (["summarize", DOC, "--truncate", "midle"], "middle"),
    (["summarize", DOC, "--decode-policy", "grw"], "grow"),
    (["summarize", DOC, "--long", "section"], "sections"),
    (["needle", DOC, "where", "--method", "cake+snapk"], "snapkv"),
    (["complete", DOC, "--indicator", "h2"], "h2o"),
    (["compress", DOC, "-o", "{tmp}/d.cake", "--scoring", "questin"], "question"),
    (["inspect-layers", DOC, "--allocation", "cak"], "cake"),
    (["batch", "sumarize", "{tmp}", "-o", "{tmp}/out.jsonl"], "summarize"),
    (["profiles", "show", "tiny-tst"], "tiny-test"),
    (["bench", "quality", "--suite", "nedle"], "needle"),
    (["bench", "quality", "--tasks", "s-rtt"], "s-rt"),
    (["bench", "quality", "--methods", "cake,snapk"], "snapkv"),
    (["bench", "quality", "--haystack", "essay"], "essays"),
    (["bench", "speed", "--methods", "cake,ful"], "full"),
    (["bench", "cache", "--parts", "timng"], "timing"),
]
FILES = [  # a file that is not there or cannot be read: exit 1
    (["summarize", "{tmp}/missing.txt"], "no such file"),
    (["qa", "{tmp}/missing.pdf", "who?"], "no such file"),
    (["complete", "{tmp}/missing.py"], "no such file"),
    (["compress", "{tmp}/missing.txt", "-o", "{tmp}/d.cake"], "no such file"),
    (["summarize", "{tmp}"], "is a directory"),
]


def cake(capsys, doc, args) -> tuple[int, str, str]:
    """`cake ARGS…` through the entry point -> (exit code, stdout, stderr)."""
    argv = [a.replace(DOC, str(doc)).replace("{tmp}", str(doc.parent)) for a in args]
    if argv[0] in ("summarize", "qa", "needle", "complete"):  # the tiny model, unless the case names one
        argv[1:1] = TASK_OPTIONS
    elif argv[0] in ("compress", "inspect-layers"):
        argv[1:1] = TASK_OPTIONS[:2]
    code = run(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def the_one_line(code, out, err, expected_code) -> str:
    assert code == expected_code, err
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize("args, words", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_a_usage_error_is_one_line_and_exit_2(cli_env, doc, capsys, args, words):
    line = the_one_line(*cake(capsys, doc, args), EXIT_USAGE)
    assert words in line and " — " in line, line


@pytest.mark.parametrize("args, right", NAMES, ids=[" ".join(a) for a, _ in NAMES])
def test_an_unknown_name_is_a_usage_error_that_suggests_the_right_one(cli_env, doc, capsys, args, right):
    line = the_one_line(*cake(capsys, doc, args), EXIT_USAGE)
    assert "did you mean" in line and f"'{right}'" in line.split("did you mean")[1], line


@pytest.mark.parametrize("args, words", FILES, ids=[" ".join(a) for a, _ in FILES])
def test_a_missing_or_unreadable_file_is_exit_1(cli_env, doc, capsys, args, words):
    line = the_one_line(*cake(capsys, doc, args), EXIT_ERROR)
    assert words in line, line


def test_help_is_still_the_full_help(cli_env, doc, capsys):
    assert run(["summarize", "-h"]) == 0
    out = capsys.readouterr().out
    assert "--budget" in out and "--model" in out and "Usage" in out


def test_cake_alone_prints_the_help(cli_env, capsys):
    assert run([]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert "summarize" in captured.out + captured.err and "error" not in captured.err


def test_a_good_command_runs_through_the_same_entry_point(cli_env, doc, capsys):
    assert run(["summarize", str(doc), *TASK_OPTIONS, "-q"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "error" not in captured.err
