"""What `cake batch` runs: the rows of a folder or a manifest, each with a key, checked before torch.

INPUT is a folder (its files matching `--pattern`, sorted by path, hidden files skipped) or a
manifest: a JSONL file (one object per line) or a CSV file (a header row), each row naming a
`document` (or `path`) plus the task's fields (e.g. `question`); other columns are ignored.
Relative paths in a manifest are relative to the manifest's folder. `--field NAME=VALUE` gives a
field to every row (a manifest's own column wins).

A row's key is a hash of its document's absolute path, its fields and every task option that can
change the answer (not the PDF password): a rerun with the same options skips the rows whose key
is already in the output (`batch.output`).
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cake_cli.errors import CakeError, UsageError, did_you_mean, unknown_name
from cake_cli.models.profiles import check_model_spec
from cake_cli.tasks.planning import cake_config_for, check_request
from cake_cli.tasks.request import TaskRequest
from cake_cli.tasks.templates import Template, load_template, task_names

TASKS = task_names()  # the task commands a batch can run
PATH_COLUMNS = ("document", "path")  # the manifest column that names each row's document
MANIFEST_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
# request fields that are not options of the key (threads change the speed, not the answer)
KEY_EXCLUDED = ("document", "fields", "password", "threads")


@dataclass(frozen=True)
class BatchRow:
    """One document of a batch: its path as the batch reads it, its task fields and its key."""

    index: int  # 0-based position in INPUT
    document: str  # the path as given (folder joined, or the manifest's folder joined)
    fields: dict[str, str]
    key: str  # `row_key`: 32 hex digits


def check_options(base: TaskRequest) -> Template:
    """Check the options every row shares once, before any row: a bad one fails the whole batch.

    Returns:
        the task's template (its `fields` are what each row must give).

    Raises:
        UsageError / ConfigError: an unknown task, a bad option value; CakeError: an unknown model.
    """
    if base.task not in TASKS:
        raise unknown_name("task", base.task, TASKS)
    check_request(base)
    template = load_template(base.task)
    profile = check_model_spec(base.model)
    cake_config_for(profile, base)  # budget, window, method… (ConfigError names the flag)
    return template


def key_options(request: TaskRequest) -> dict:
    """The options a row's key covers: the request's task and settings that can change the answer,
    those set (None means the default, so adding an option to `TaskRequest` later keeps old keys);
    JSON-ready. Every line of an output records them (`batch.output`)."""
    options = {k: v for k, v in asdict(request).items() if k not in KEY_EXCLUDED and v is not None}
    return json.loads(json.dumps(options, sort_keys=True, default=str, ensure_ascii=False))


# what the user typed for each key option (a dotted name: a field of a nested settings object)
OPTION_FLAGS = {
    "task": "TASK",
    "model": "--model",
    "budget": "--budget",
    "window": "--window",
    "decode_policy": "--decode-policy",
    "dtype": "--dtype",
    "weights": "--weights",
    "attention": "--attention",
    "device_map": "--device-map",
    "max_new_tokens": "--max-new-tokens",
    "sampling.temperature": "--temperature",
    "sampling.top_p": "--top-p",
    "sampling.seed": "--seed",
    "sampling.no_repeat_ngram_size": "--no-repeat-ngram",
    "no_repeat_ngram_size": "--no-repeat-ngram",
    "truncate": "--truncate",
    "method": "--method",
    "allocation": "--allocation",
    "indicator": "--indicator",
    "at_line": "--at",
    "max_lines": "--lines",
}


def _flat(options: dict, prefix: str = "") -> dict:
    out = {}
    for name, value in options.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def option_difference(before: dict, now: dict) -> str | None:
    """The first option (as the command line names it) that differs between two `key_options`, as
    '--max-new-tokens 60, this run --max-new-tokens 61'; None when they are the same."""
    old, new = _flat(before), _flat(now)
    order = list(OPTION_FLAGS)
    for name in sorted(set(old) | set(new), key=lambda n: (order.index(n) if n in order else len(order), n)):
        if old.get(name) != new.get(name):
            flag = OPTION_FLAGS.get(name, f"--{name.replace('_', '-')}")

            def shown(value, flag=flag):
                return f"no {flag} (its default)" if value is None else f"{flag} {value}"

            return f"{shown(old.get(name))}, this run {shown(new.get(name))}"
    return None


def row_key(request: TaskRequest) -> str:
    """The resume key of one row's request: sha-256 (first 32 hex digits) of its task, absolute
    document path, fields and options (`key_options`)."""
    data = {
        "document": str(Path(request.document).expanduser().resolve()),
        "fields": dict(sorted(request.fields.items())),
        "options": key_options(request),
    }
    text = json.dumps(data, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def row_request(base: TaskRequest, row: BatchRow) -> TaskRequest:
    """The single-document request of `row` (what `cake TASK DOCUMENT --json` would run)."""
    return replace(base, document=row.document, fields=row.fields)


def parse_fields(pairs: list[str]) -> dict[str, str]:
    """`--field NAME=VALUE` options as a dict.

    Raises:
        UsageError: a pair without '='.
    """
    fields = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--field '{pair}' is not NAME=VALUE", 'e.g. --field question="Who signed?"')
        fields[name.strip()] = value
    return fields


def batch_rows(
    source: str, base: TaskRequest, template: Template, pattern: str, fields: dict[str, str], output: Path
) -> tuple[list[BatchRow], int]:
    """The rows of INPUT (a folder or a manifest), without duplicates.

    Returns:
        (rows, duplicates): rows in INPUT order; how many repeated keys were dropped.

    Raises:
        CakeError: INPUT missing, no file matches, a manifest unreadable or with no rows.
        UsageError: a manifest without a document column or without a field the task needs.
    """
    path = Path(source).expanduser()
    if source == "-":
        raise UsageError(
            "cake batch reads a folder or a manifest file, not stdin", "pass a folder or a .jsonl/.csv file"
        )
    if path.is_dir():
        entries = [(str(p), {}) for p in _folder_files(path, pattern, output)]
    elif path.is_file():
        entries = _manifest_entries(path, template, set(fields))
    else:
        raise CakeError(f"{source}: no such folder or file", "pass a folder of documents or a .jsonl/.csv manifest")
    rows, seen = [], set()
    for document, own in entries:
        row_fields = {name: value for name, value in {**fields, **own}.items() if name in template.fields}
        key = row_key(replace(base, document=document, fields=row_fields))
        if key not in seen:
            seen.add(key)
            rows.append(BatchRow(len(rows), document, row_fields, key))
    return rows, len(entries) - len(rows)


def _folder_files(folder: Path, pattern: str, output: Path) -> list[Path]:
    """Files under `folder` matching `pattern`, sorted; hidden ones and the output file skipped."""
    out = output.expanduser().resolve()
    files = [
        p
        for p in folder.glob(pattern)
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts) and p.resolve() != out
    ]
    if not files:
        raise CakeError(f"no file in {folder} matches --pattern '{pattern}'", "use e.g. --pattern '*.pdf' or '**/*'")
    return sorted(files, key=str)


def _manifest_entries(path: Path, template: Template, given: set[str]) -> list[tuple[str, dict[str, str]]]:
    """(document path, fields) per manifest row; relative paths are joined to the manifest's folder."""
    kind = MANIFEST_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise UsageError(
            f"{path} is neither a folder nor a manifest", "pass a folder, or a manifest ending in .jsonl or .csv"
        )
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise CakeError(f"cannot read manifest {path}: {exc}", "pass a UTF-8 .jsonl or .csv file") from None
    records = _jsonl_records(path, text) if kind == "jsonl" else _csv_records(path, text)
    if not records:
        raise CakeError(f"manifest {path} has no rows", "add one row per document")
    columns = set().union(*(r.keys() for r in records))
    column = next((c for c in PATH_COLUMNS if c in columns), None)
    if column is None:
        raise UsageError(f"manifest {path} has no 'document' column{did_you_mean('document', columns)}", _LAYOUT_HINT)
    missing = [f for f in template.fields if f not in columns and f not in given]
    if missing:
        name = missing[0]
        raise UsageError(
            f"manifest {path} has no '{name}' column for task '{template.task}'{did_you_mean(name, columns)}",
            f"add the column, or give every row the same value with --field {name}=…",
        )
    entries = []
    for number, record in enumerate(records, 1):
        document = str(record.get(column) or "").strip()
        if not document:
            raise CakeError(f"manifest {path} row {number} has no {column}", "give every row a document path")
        resolved = Path(document).expanduser()
        document = str(resolved if resolved.is_absolute() else path.parent / resolved)
        entries.append((document, {k: str(v) for k, v in record.items() if k != column and v is not None}))
    return entries


_LAYOUT_HINT = 'give each row a \'document\' path plus the task\'s fields, e.g. {"document": "a.pdf", "question": "…"}'


def _jsonl_records(path: Path, text: str) -> list[dict]:
    """The objects of a JSONL manifest (blank lines skipped)."""
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CakeError(f"manifest {path} line {number} is not JSON ({exc.msg})", _LAYOUT_HINT) from None
        if not isinstance(record, dict):
            raise CakeError(f"manifest {path} line {number} is not a JSON object", _LAYOUT_HINT)
        records.append(record)
    return records


def _csv_records(path: Path, text: str) -> list[dict]:
    """The rows of a CSV manifest with a header row (empty cells dropped)."""
    try:
        rows = list(csv.DictReader(text.splitlines()))
    except csv.Error as exc:
        raise CakeError(f"manifest {path} is not valid CSV ({exc})", _LAYOUT_HINT) from None
    return [{k: v for k, v in row.items() if k is not None and v not in (None, "")} for row in rows]
