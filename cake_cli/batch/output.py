"""`cake batch` output: one JSON line per row, and what an existing output already holds.

A line is `{"key", "task", "document", "fields", "error", "seconds", "worker", "result"}`:
`result` is exactly what `cake TASK DOCUMENT --json` prints for that document (the answer and the
whole report), or null when the row failed; `error` is then the one-line error the single-document
command would print. `seconds` is the row's run time on its worker (wall clock, seconds, the model
load excluded); `worker` is `host:pid`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cake_cli.batch.rows import BatchRow
from cake_cli.errors import CakeError, first_line

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


def read_results(path: Path) -> dict[str, bool]:
    """The keys an existing output holds and whether each row succeeded (its last line wins).

    Only complete lines are read: a last line without a newline (a killed run's) is ignored
    (`files.LineAppender` cuts it before appending).

    Raises:
        CakeError: a complete line that is not a `cake batch` result (another kind of file).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CakeError(f"cannot read --output {path}: {exc.strerror}", "check the path and permissions") from None
    done: dict[str, bool] = {}
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
        done[line["key"]] = line.get("error") is None
    return done


def encode_line(line: dict) -> str:
    """One JSON line (no newline inside: JSON escapes those in strings)."""
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"))
