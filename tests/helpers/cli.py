"""The real CLI on the tiny profile (`cli_env`): invoking it, one-line errors, the rich report as words."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cake_cli.cli.main import app

runner = CliRunner()
TINY = ["-m", "tiny-test"]


def invoke(*args, input=None):
    """`cake ARGS…` in process (stdout and stderr apart)."""
    return runner.invoke(app, [str(a) for a in args], input=input)


def one_error_line(result, code: int, words: str) -> str:
    """The one stderr line of a refused command: exit `code`, no traceback, nothing on stdout, `words` in it."""
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], lines
    return lines[0]


def flat(report: str) -> str:
    """A rich report as one line of words (panel borders and line wrapping gone)."""
    return " ".join(report.replace("│", " ").split())


def compressed(doc, path, *args):
    """`cake compress DOC -o PATH` at B = 64 in float32 (plus `args`) -> (path, its --json report)."""
    result = invoke("compress", doc, "-o", path, *TINY, "-b", "64", "--dtype", "float32", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return path, json.loads(result.stdout)
