"""Turn a draft of real-set documents into entries of `cake_cli/bench/data/real_qa.yaml`.

A draft lists documents as the set does (id, title, source, package, path, licence, split) with
questions written as `q`, `type`, `answers` and a `quote` of the passage that holds the answer
(unanswerable ones: `absent`, the key terms that must not be in the text). This script reads each
document with the project's reader (`bench.real_docs.read_document`), finds each quote in the
extracted text (whitespace may differ; the first match, an error if there is none), and prints the
document entries with their sha256, length, pages, token count (the set's
tokenizer) and each evidence's offset and page, numbering the questions id-01, id-02, ...

    python scripts/real_qa_evidence.py draft.yaml [--tokenizer DIR] > entries.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from cake_cli.bench.real_docs import RealDocument, present_terms, read_document, spaced_pattern, text_sha256
from cake_cli.paths import models_dir
from cake_cli.tasks.inputs.documents import page_of_offset

TOKENIZER = models_dir() / "qwen2.5-coder-0.5b-instruct"  # the set's tokenizer, converted by scripts/setup.sh


def entry(draft: dict, tokenizer) -> dict:
    """The set's entry of one drafted document (raises SystemExit naming a quote not found once)."""
    spec = RealDocument(
        draft["id"], draft["title"], draft["source"], draft.get("package"), draft["path"], draft["licence"],
        "0" * 64, 1, 1, None, (),
    )  # fmt: skip
    doc = read_document(spec)
    text = doc.text
    pages = len(doc.page_offsets) if doc.kind == "pdf" else None
    out = {k: draft[k] for k in ("id", "title", "source", "package", "path", "licence") if draft.get(k) is not None}
    out |= {"sha256": text_sha256(text), "chars": len(text), "tokens": len(tokenizer(text).input_ids)}
    if pages is not None:
        out["pages"] = pages
    out["split"] = draft["split"]
    questions = []
    for i, q in enumerate(draft["questions"], 1):
        item = {"id": f"{draft['id']}-{i:02d}", "question": q["q"], "type": q["type"]}
        if q["type"] == "unanswerable":
            present = present_terms(text, q["absent"])
            if present:
                sys.exit(f"{item['id']}: the key terms {present} are in the text")
            item["absent"] = list(q["absent"])
        else:
            hits = list(spaced_pattern(q["quote"]).finditer(text))
            if not hits:
                sys.exit(f"{item['id']}: quote not found: {q['quote']!r}")
            if len(hits) > 1:
                print(f"note: {item['id']}: quote found {len(hits)} times, the first kept", file=sys.stderr)
            evidence = {"offset": hits[0].start()}
            if pages is not None:
                evidence["page"] = page_of_offset(doc, hits[0].start())
            evidence["quote"] = " ".join(q["quote"].split())
            item |= {"answers": list(q["answers"]), "evidence": evidence}
        questions.append(item)
    out["questions"] = questions
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draft", type=Path)
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER, help="the set's tokenizer (a model folder)")
    args = parser.parse_args()
    from transformers import AutoTokenizer  # noqa: PLC0415 - a script: load transformers only when run

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    drafts = yaml.safe_load(args.draft.read_text(encoding="utf-8"))
    entries = [entry(d, tokenizer) for d in drafts]
    sys.stdout.write(yaml.safe_dump(entries, sort_keys=False, allow_unicode=True, width=1000))


if __name__ == "__main__":
    main()
