"""`cake batch` output: one JSON line per row, and what an existing output already holds.

A line is `{"key", "task", "document", "fields", "error", "seconds", "worker", "result", "options"}`:
`result` is exactly what `cake TASK DOCUMENT --json` prints for that document (the answer and the
whole report), or null when the row failed; `error` is then the one-line error the single-document
command would print. `seconds` is the row's run time on its worker (wall clock, seconds, the model
load excluded); `worker` is `host:pid`; `options` the task options the row ran with
(`rows.key_options`).

One file holds the rows of one set of options: a run with other options is refused
(`check_same_options`). Lines are appended as rows finish (a killed run loses no finished row);
a row run again (it failed before) appends its new line, and at the end of the run the file is
rewritten atomically with the last line of each key only (`compact`), so a reader finds one line
per key.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from cake_cli.batch.rows import BatchRow, option_difference
from cake_cli.errors import CakeError, UsageError, first_line
from cake_cli.files import write_atomic

_FOREIGN_HINT = "choose a new --output file (cake batch appends to a file of its own results only)"


def row_line(
    row: BatchRow,
    task: str,
    *,
    result: dict | None = None,
    error: str | None = None,
    seconds: float = 0.0,
    worker: str = "",
) -> dict:
    """The output line of one row: its result (a `RunResult.to_dict()`) or its one-line error."""
    return {
        "key": row.key,
        "task": task,
        "document": row.document,
        "fields": row.fields,
        "error": error,
        "seconds": round(seconds, 4),
        "worker": worker,
        "result": result,
    }


def failure_message(exc: BaseException) -> str:
    """The one-line error a row records: a CakeError's line, else "internal error: Type: message".

    Raises:
        exc itself when CAKE_DEBUG=1 and it is not a CakeError (to see the traceback).
    """
    if isinstance(exc, CakeError):
        return exc.one_line()
    if os.environ.get("CAKE_DEBUG") == "1":
        raise exc
    return f"internal error: {type(exc).__name__}: {first_line(exc)} — rerun with CAKE_DEBUG=1 and report it"


def line_tokens(line: dict) -> int:
    """Tokens a finished row processed: prompt tokens prefilled plus tokens generated (0 if it failed)."""
    result = line.get("result") or {}
    return int(result.get("prompt_tokens", 0)) + int(result.get("generated_tokens", 0))


@dataclass
class Existing:
    """What an output file already holds (its complete lines)."""

    done: dict[str, bool] = field(default_factory=dict)  # key -> whether its last line succeeded
    options: list[dict] = field(default_factory=list)  # the distinct `options` its lines record, in order
    last: dict[str, bytes] = field(default_factory=dict)  # key -> its last line (first-seen order)
    lines: int = 0  # complete, non-blank lines


def read_output(path: Path) -> Existing:
    """The rows an existing output holds (see `Existing`); an absent file holds none.

    Only complete lines are read: a last line without a newline (a killed run's) is ignored
    (`files.LineAppender` cuts it before appending).

    Raises:
        CakeError: a complete line that is not a `cake batch` result (another kind of file).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Existing()
    except OSError as exc:
        raise CakeError(f"cannot read --output {path}: {exc.strerror}", "check the path and permissions") from None
    existing = Existing()
    complete = data[: data.rfind(b"\n") + 1]
    for number, raw in enumerate(complete.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            line = None
        if not isinstance(line, dict) or not isinstance(line.get("key"), str):
            raise CakeError(f"--output {path} line {number} is not a cake batch result", _FOREIGN_HINT)
        existing.done[line["key"]] = line.get("error") is None
        existing.last[line["key"]] = raw
        existing.lines += 1
        if isinstance(line.get("options"), dict) and line["options"] not in existing.options:
            existing.options.append(line["options"])
    return existing


def read_results(path: Path) -> dict[str, bool]:
    """The keys an existing output holds and whether each row succeeded (its last line wins).

    Raises:
        CakeError: see `read_output`.
    """
    return read_output(path).done


def check_same_options(path: Path, options: dict) -> None:
    """Refuse to add rows made with `options` (`rows.key_options`) to an output whose rows were made
    with others: one file, one set of options (else a reader finds a document twice, with two answers).

    Raises:
        UsageError: naming the first option that differs and a new file to write instead.
        CakeError: see `read_output`.
    """
    for before in read_output(path).options:
        difference = option_difference(before, options)
        if difference is not None:
            raise UsageError(
                f"--output {path} holds rows made with other options ({difference})",
                f"rerun with the file's options to resume it, or start a new file, e.g. -o {free_name(path)}",
            )


def free_name(path: Path) -> Path:
    """A file next to `path` that does not exist yet: results.jsonl -> results-2.jsonl (-3, …)."""
    number = 2
    while (candidate := path.with_name(f"{path.stem}-{number}{path.suffix}")).exists():
        number += 1
    return candidate


def compact(path: Path) -> int:
    """Rewrite the output atomically with one line per key, its last (a row run again replaces its
    old line; keys keep the place of their first line); returns the lines dropped (0: untouched).

    Raises:
        CakeError: the file cannot be read or written (it is then left as it was).
    """
    existing = read_output(path)
    dropped = existing.lines - len(existing.last)
    if dropped:
        write_atomic(path, b"".join(raw + b"\n" for raw in existing.last.values()), "--output")
    return dropped


def encode_line(line: dict) -> str:
    """One JSON line (no newline inside: JSON escapes those in strings)."""
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"))
