"""Where `cake qa --prefill select` loses answers: how much of each question's gold passage the selection keeps.

For every answerable question of the given real-set documents (prompts as `cake bench quality --suite real`
builds them, the document's shared prefix prefilled once), the selection's scores at each `--layers` layer
(`engine.selection.selection_scores`, the last 32 tokens' attention) and its kept tokens at each budget
(`top_tokens`, 4 x B document tokens, as `cake qa --prefill select` keeps them) are compared with the
question's gold passage and gold answer spans (`bench.quality.real.evidence_spans`): the share of their tokens
kept. A lost answer whose passage was dropped is the selection's fault; one whose passage was kept is the
re-indexed, gappy prompt's (or the budget's). Optionally compared with a run file's `NAME@select` rows.

    python benchmarks/select_coverage.py --documents copyright-format,python-statistics --layers 4,9,14,19 \
        --budgets 256,512,1024 [--run RUN.json --method cake-chunk@select]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from cake_cli.bench.quality.real import build_case, common_prefix, evidence_spans, longest_question
from cake_cli.bench.quality.run import Model
from cake_cli.bench.real_docs import load_set, open_documents
from cake_cli.engine.replay import prefix_cache
from cake_cli.engine.selection import DEFAULT_QUERIES, default_layer, selection_scores, top_tokens
from cake_cli.tasks.request import SELECT_FACTOR
from cake_cli.tasks.runner import load_ready, prompt_limit, stop_token_ids


def covered(kept: set[int], span: tuple[int, int] | None) -> float | None:
    """Share of the token span [start, end) among `kept` (None: no span)."""
    if span is None:
        return None
    a, b = span
    return sum(1 for j in range(a, b) if j in kept) / max(b - a, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or path (default: the embedded default)")
    parser.add_argument("--documents", required=True, help="real-set document ids, comma-separated")
    parser.add_argument("--layers", default=None, help="selection layers, comma-separated (default: GemFilter's)")
    parser.add_argument("--budgets", default="256,512,1024", help="B; 4 x B document tokens are kept")
    parser.add_argument("--run", type=Path, default=None, help="a real-suite run file with NAME@select rows")
    parser.add_argument("--method", default="cake-chunk@select", help="the @select method of --run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("-o", "--output", type=Path, required=True, help="JSON: every question's coverage")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_ready(args.model, "auto", "sdpa").loaded
    model = Model(lm.model, lm.tokenizer, prompt_limit(lm, 64), stop_token_ids(lm))
    num_layers = lm.model.config.num_hidden_layers
    layers = [int(x) for x in args.layers.split(",")] if args.layers else [default_layer(num_layers)]
    budgets = [int(b) for b in args.budgets.split(",")]
    exact = {}
    if args.run:
        for r in json.loads(args.run.read_text())["rows"]:
            if r["method"] == args.method:
                exact[(r["case_id"], r["budget"])] = r["exact"]
    documents, missing = open_documents(load_set(), args.documents.split(","))
    if missing:
        raise SystemExit(f"error: documents not installed: {', '.join(missing)}")
    rows = []
    for doc in documents:
        longest = longest_question(model, doc)
        cases = [build_case(model, doc, q, 32768, sized_for=longest) for q in doc.questions]
        n = common_prefix([c.input_ids for c in cases])
        prefix = prefix_cache(lm.model, torch.tensor([list(cases[0].input_ids[:n])]))
        for case in cases:
            if case.task != "real":
                continue
            ids = torch.tensor([list(case.input_ids)])
            passage, answer = evidence_spans(model, case)
            for layer in layers:
                scores = selection_scores(lm.model, ids, layer, DEFAULT_QUERIES, prefix)
                for budget in budgets:
                    kept = set(top_tokens(scores, case.prefix_tokens, SELECT_FACTOR * budget))
                    right = exact.get((case.question.id, budget))
                    rows.append(dict(document=doc.spec.id, question=case.question.id, layer=layer, budget=budget,
                                     prompt_tokens=ids.shape[1], kept=len(kept), passage=covered(kept, passage),
                                     answer=covered(kept, answer), exact=right))  # fmt: skip
            print(f"{case.question.id}: done", flush=True)
    args.output.write_text(json.dumps(dict(model=lm.name, layers=layers, budgets=budgets, rows=rows), indent=1) + "\n")
    print("\n| layer | B | questions | passage kept, mean | answer kept, mean | answer span wholly kept |")
    print("|---:|---:|---:|---:|---:|---:|")
    for layer in layers:
        for budget in budgets:
            cell = [r for r in rows if r["layer"] == layer and r["budget"] == budget]
            p = [r["passage"] for r in cell if r["passage"] is not None]
            a = [r["answer"] for r in cell if r["answer"] is not None]
            whole = sum(1 for x in a if x == 1.0)
            print(f"| {layer} | {budget} | {len(cell)} | {statistics.mean(p):.2f} | {statistics.mean(a):.2f} | "
                  f"{whole} of {len(a)} |")  # fmt: skip
    if exact:
        layer = default_layer(num_layers)
        print(f"\nAt layer {layer}, {args.method}'s exact answers by whether the answer span was wholly kept:")
        for budget in budgets:
            cell = [r for r in rows if r["layer"] == layer and r["budget"] == budget and r["answer"] is not None
                    and r["exact"] is not None]  # fmt: skip
            kept = [r["exact"] for r in cell if r["answer"] == 1.0]
            lost = [r["exact"] for r in cell if r["answer"] < 1.0]
            print(f"B={budget}: answer kept: {sum(kept):.0f} of {len(kept)} right; answer dropped (in part or whole): "
                  f"{sum(lost):.0f} of {len(lost)} right")  # fmt: skip


if __name__ == "__main__":
    main()
