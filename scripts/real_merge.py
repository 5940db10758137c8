"""Merge real-suite run files into one, so that `cake bench quality --suite real -o MERGED.json`
prints the tables of the whole set from runs made in parts (documents run apart, methods added
later, one model's short and long documents).

Every file must be of the same model, dtype, weights, window and `--long` mode. A file scored with
another `--abstain` mode than `--abstain` (or before the mode was stored: `never`) is rescored as
this code reads it with that mode (`bench.quality.abstention.rescore`: nothing is decoded again;
refused for a middle-cut document's rows, whose reading needs what the model read). Where two files
hold the same cell (task, question, length, method, budget), the later file's row is kept and the
two replies are compared: the count of differing replies is printed (a rerun of the same code
should differ nowhere). The merged meta names the documents of all files and the source files.
`--rescore-answers` scores every answer again with this code's scorer, each row's support and
abstention kept as run (`bench.quality.abstention.rescore_answers`; after a change of the scorer).

    python scripts/real_merge.py A.json B.json [...] -o MERGED.json [--abstain foreign] [--methods full,cake]
        [--rescore-answers]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cake_cli.bench.quality.abstention import real_questions, rescore, rescore_answers, rescore_inputs
from cake_cli.bench.quality.report import META_MUST_MATCH, row_key
from cake_cli.files import write_atomic
from cake_cli.tasks.answers.abstain import ABSTAIN_MODES, DEFAULT_ABSTAIN, NEVER


def merge(
    paths: list[Path], mode: str, methods: list[str] | None = None, answers: bool = False
) -> tuple[dict, list[str]]:
    """(the merged results file as a dict, report lines), with only the rows of `methods` when given, and
    every answer scored again by this code's scorer when `answers`. Raises SystemExit on files that differ in a
    setting of META_MUST_MATCH."""
    loaded = [(p, json.loads(p.read_text())) for p in paths]
    first = loaded[0][1]["meta"]
    rows: dict[tuple, dict] = {}
    lines, documents = [], []
    questions = real_questions() if answers else {}  # the gold answers, read once for every file
    for path, data in loaded:
        meta = data["meta"]
        for key in META_MUST_MATCH:
            if meta.get(key) != first.get(key):
                sys.exit(
                    f"error: {path} has {key} = {meta.get(key)!r}, {paths[0]} {first.get(key)!r} — merge like runs only"
                )
        file_rows = [r for r in data["rows"] if methods is None or r["method"] in methods]
        if meta.get("abstain", NEVER) != mode:
            try:
                file_rows = rescore(file_rows, mode, *rescore_inputs(file_rows))
            except ValueError as exc:
                sys.exit(f"error: {path}: {exc} — rerun it with --abstain {mode}")
            lines.append(f"{path.name}: {len(file_rows)} rows rescored from --abstain {meta.get('abstain', NEVER)}")
        if answers:
            before = [r["exact"] for r in file_rows]
            file_rows = rescore_answers(file_rows, questions)
            moved = sum(b != r["exact"] for b, r in zip(before, file_rows))
            lines.append(f"{path.name}: answers scored again, {moved} exact scores changed")
        differ = same = 0
        for r in file_rows:
            key = row_key(r)
            if key in rows:
                if rows[key]["prediction"] == r["prediction"]:
                    same += 1
                else:
                    differ += 1
            rows[key] = r
        lines.append(
            f"{path.name}: {len(file_rows)} rows; cells also in an earlier file: {same} same reply, {differ} other"
        )
        documents += [d for d in meta.get("documents", []) if d not in documents]
    meta = {**first, "documents": documents, "abstain": mode, "merged_from": [str(p) for p in paths]}
    meta["command"] = f"python scripts/real_merge.py {' '.join(map(str, paths))} --abstain {mode}"
    if methods is not None:
        meta["command"] += f" --methods {','.join(methods)}"
    if answers:
        meta["command"] += " --rescore-answers"
    return {
        "format": loaded[0][1]["format"],
        "version": loaded[0][1]["version"],
        "meta": meta,
        "rows": list(rows.values()),
    }, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="real-suite run files")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the merged results file (written atomically)")
    parser.add_argument(
        "--abstain", default=DEFAULT_ABSTAIN, choices=ABSTAIN_MODES, help="score every row with this mode"
    )
    parser.add_argument("--methods", default="", help="keep only these methods' rows (comma-separated)")
    parser.add_argument(
        "--rescore-answers", action="store_true", help="score every answer again with this code's scorer"
    )
    args = parser.parse_args()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] or None
    merged, lines = merge(args.runs, args.abstain, methods, args.rescore_answers)
    write_atomic(args.output, json.dumps(merged, indent=1) + "\n", "merged results file")
    print(f"$ python scripts/real_merge.py {' '.join(sys.argv[1:])}")
    print("\n".join(lines))
    print(f"{len(merged['rows'])} rows on {len(merged['meta']['documents'])} documents -> {args.output}")


if __name__ == "__main__":
    main()
