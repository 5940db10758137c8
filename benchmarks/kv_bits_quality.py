"""Compress once, ask many, at several KV bit widths: real-set questions answered from one whole-prefix cache.

The protocol of `cake compress` (default `--scoring question`) then `cake qa FILE.cake Q`: each document's
prompt prefix (the `qa` template up to the question) is prefilled once with no question and kept whole; at each
bit width it is held as a .cake file of those bits holds it in memory (`tasks.saved.store.held_quantized`'s
layout: keys in groups of `DEFAULT_KV_GROUP` tokens, values coded as `cachefile.value_coding_of` the cache says
(format 6: Hadamard-rotated in groups of 64 channels on the Qwen models), the window's w tokens and the first
`DEFAULT_KV_SINK` tokens exact, global layers quantized, `engine.kvmemory`; a layout's fourth field `vG` holds
values unrotated in groups of G channels, format 5's `v32`, and `rG` rotated in groups of G); every question is
then asked from that one cache, its CAKE eviction run with the question in the window at budget B
(`continuation.continue_and_decode(evict=True)`), and scored as
`cake bench quality --suite real` scores it (`bench.quality.real`). File bytes are those of the .cake's tensors.

`--genres` adds the multi-genre suite's cases (`bench.genre_cases`: invented facts planted in real text) to the
same protocol: each haystack is prefilled once without its question (the `m-each` cases that share a haystack
share that prefix) and each question asked from it, scored as `cake bench quality --suite genres` scores it
(`scoring.exact_answer`). Their rows join the real questions' in every table and target line.

Every (document, question, layout, budget) answer is written to the JSON as it comes; a rerun with the same
settings resumes (cells already answered are kept). `--report A.json[,B.json]` prints the tables of finished
runs (merged: e.g. one run per budget) without loading a model: per budget and layout the score, exact accuracy,
answerable and abstention accuracy, and the paired bootstrap interval (by question, `bench.bootstrap`) of exact
accuracy minus the first layout's, with issue 47's target lines (a file at most 0.32x of the first within -2
points at the interval's lower bound; a 2-bit file at most 0.2x within -3). `--override C.json` puts the replies
of another run (e.g. one layout asked again after a change to the code) in place of the same cells' replies.

    python benchmarks/kv_bits_quality.py --documents python-shlex --questions 3 \
        -o benchmarks/runs/kv-bits-quality-smoke.json
    python benchmarks/kv_bits_quality.py --report benchmarks/runs/kv-bits-quality-smoke.json
    python benchmarks/kv_bits_quality.py --documents '' --genres code --genre-tasks s-rt --genre-depths 0.5 \
        --genre-repeats 1 --genre-length 2048 -o /tmp/kv-bits-genre-smoke.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import torch
from safetensors.torch import save as save_tensors

from cake_cli.bench.bootstrap import paired_interval
from cake_cli.bench.genre_cases import GenreSuite
from cake_cli.bench.quality.abstention import rescore, rescore_inputs
from cake_cli.bench.quality.real import _row, build_case, common_prefix
from cake_cli.bench.quality.run import Model, build_genre_case, prompt_ids
from cake_cli.bench.real_docs import load_set, open_documents
from cake_cli.bench.scoring import ABSTAIN_TASKS, exact_answer, score_answer
from cake_cli.bench.suites import REAL_TASKS, REAL_TEMPLATE, TEMPLATES, CaseResult
from cake_cli.cli.bench_options import configs_for
from cake_cli.engine.cachefile import cache_tensors, quantized_in_memory, value_coding_of
from cake_cli.engine.config import DEFAULT_KV_GROUP, DEFAULT_KV_SINK
from cake_cli.engine.continuation import continue_and_decode
from cake_cli.engine.replay import record, replay
from cake_cli.tasks.answers.abstain import DEFAULT_ABSTAIN
from cake_cli.tasks.runner import load_ready, prompt_limit, stop_token_ids
from cake_cli.tasks.templates import load_template

TARGETS = ((0.32, -2.0), (0.2, -3.0))  # issue 47: (file size at most this x the first layout's, lower bound, points)
DEFAULT_SEED = 7  # the genre cases' seed of the first runs; their ids carry no seed


class Asked(NamedTuple):
    """One prompt of a document compressed once: a question asked from its cache, or (scored None) a prompt that
    only bounds the shared prefix."""

    id: str
    ids: Sequence[int]  # the whole prompt's token ids
    scored: Callable | None  # (reply, budget, config, seconds, abstain) -> CaseResult
    limit: int  # most new tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or path (default: the embedded default)")
    parser.add_argument("--documents", default="python-shlex", help="real-set document ids, comma-separated")
    parser.add_argument("--questions", type=int, default=6, help="each document's first N questions (0: all)")
    parser.add_argument("--genres", default="", help="also the genre suite's cases in these genres (comma-separated)")
    parser.add_argument("--genre-tasks", default="s-rt,m-each", help="--genres: tasks, comma-separated")
    parser.add_argument("--genre-length", type=int, default=8192, help="--genres: prompt length, tokens")
    parser.add_argument("--genre-depths", default="0.25,0.75", help="--genres: fact depths, comma-separated")
    parser.add_argument("--genre-repeats", type=int, default=3, help="--genres: cases per (task, genre, depth)")
    parser.add_argument("--genre-one-haystack", action="store_true",
                        help="--genres: m-each's three cases of a document share one haystack (one prefill for three "
                        "questions, sized for the longest; the suite's own cases differ by a few tokens)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help="--genres: seed of the facts and haystack offsets (others: other cases)")  # fmt: skip
    parser.add_argument(
        "--layouts",
        default="16,4,2",
        help="comma-separated BITS[/SINK[/RECENT[/VALUES]]] (defaults: the file's sink, the window and values "
        "coding; VALUES rG: rotated in groups of G channels, vG: unrotated, v32 is format 5's); the first is the "
        "reference of the paired comparison",
    )
    parser.add_argument("--budgets", default="256", help="B, tokens per layer at question time, comma-separated")
    parser.add_argument("--method", default=None, help="question-time eviction method (default: the profile's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("-o", "--output", type=Path, help="JSON: settings and every answer (resumed if it exists)")
    parser.add_argument("--report", default=None, help="print the tables of these finished runs (comma-separated)")
    parser.add_argument("--override", default="", help="--report: these runs' replies replace the same cells'")
    parser.add_argument(
        "--abstain",
        default=DEFAULT_ABSTAIN,
        help=f"the tables' abstention rule (`cake qa`'s; default {DEFAULT_ABSTAIN})",
    )
    args = parser.parse_args()
    if args.report:
        read = [[json.loads(Path(f).read_text()) for f in x.split(",") if f] for x in (args.report, args.override)]
        runs, newer = read
        return print_report(runs, args.abstain, newer)
    if args.output is None:
        raise SystemExit("error: give -o FILE.json (or --report FILES to print finished runs)")
    run(args)


def run(args) -> None:
    torch.set_num_threads(args.threads)
    budgets = [int(b) for b in args.budgets.split(",")]
    layouts = [layout.split("/") for layout in args.layouts.split(",")]
    lm = load_ready(args.model, "auto", "sdpa").loaded  # switched to CAKE attention, as `cake qa` runs
    model = Model(lm.model, lm.tokenizer, prompt_limit(lm, 64), stop_token_ids(lm))
    configs = configs_for(args.model, None, budgets, args.method)  # None: the profile's method, as `cake qa`
    window, new_tokens = configs[budgets[0]].window, load_template(REAL_TEMPLATE).max_new_tokens
    wanted = [d for d in args.documents.split(",") if d]
    documents, missing = open_documents(load_set(), wanted) if wanted else ([], [])  # none named: none, not all
    if missing:
        raise SystemExit(f"error: documents not installed: {', '.join(missing)}")
    layouts = [
        (int(x[0]), int(x[1]) if len(x) > 1 else DEFAULT_KV_SINK, int(x[2]) if len(x) > 2 else window,
         x[3] if len(x) > 3 else None) for x in layouts
    ]  # (bits, sink, recent, values)  # fmt: skip
    names = [
        f"{b}" + ("" if (s, r, v) == (DEFAULT_KV_SINK, window, None) else f"/{s}/{r}/{v or 'file'}")
        for b, s, r, v in layouts
    ]
    method = configs[budgets[0]].indicator
    meta = dict(model=lm.name, dtype=str(lm.dtype), budgets=budgets, window=window, group=DEFAULT_KV_GROUP,
                values="file", layouts=names, threads=args.threads, method=args.method, indicator=method)  # fmt: skip
    genres = GenreSuite(tuple(args.genre_tasks.split(",")), tuple(g for g in args.genres.split(",") if g),
                        (args.genre_length,), tuple(float(d) for d in args.genre_depths.split(",")),
                        args.genre_repeats, args.seed)  # fmt: skip
    if genres.genres:
        meta["genres"] = dict(tasks=list(genres.tasks), genres=list(genres.genres), length=args.genre_length,
                              depths=list(genres.depths), repeats=genres.repeats, seed=genres.seed)  # fmt: skip
        if args.genre_one_haystack:
            meta["genres"]["one_haystack"] = True
    rows, files = [], {}
    if args.output.exists():
        old = json.loads(args.output.read_text())
        same = {k: v for k, v in old["meta"].items() if k not in ("budgets", "layouts", "threads")}
        if same != {k: v for k, v in meta.items() if k not in ("budgets", "layouts", "threads")}:
            raise SystemExit(f"error: {args.output} holds a run with other settings; give another -o")
        rows, files = old["rows"], old["files"]
        print(f"resuming {args.output}: {len(rows)} answers kept", flush=True)
    done = {_cell(r) for r in rows}
    groups = _real_groups(model, documents, args.questions, new_tokens)
    for source, asked in groups + _genre_groups(model, genres, args.genre_one_haystack):
        todo = [(a, n, b) for a in asked if a.scored for n in names for b in budgets
                if (source, a.id, n, b) not in done]  # fmt: skip
        if not todo:
            continue
        n = common_prefix([tuple(a.ids) for a in asked])
        began = time.perf_counter()
        whole = replay(record(model.model, torch.tensor([list(asked[0].ids[:n])]), window, accumulate=False), None)
        print(f"{source}: {n}-token prefix prefilled in {time.perf_counter() - began:.1f} s", flush=True)
        for name, (bits, sink, recent, values) in zip(names, layouts):
            if not any(t[1] == name for t in todo):
                continue
            coding = value_coding_of(whole.cache) if values is None else dict(value_group=int(values[1:]),
                                                                               rotated=values[0] == "r")  # fmt: skip
            values = f"{'r' if coding['rotated'] else 'v'}{coding['value_group']}"
            held = (bits, DEFAULT_KV_GROUP, recent, sink)
            state = whole if bits == 16 else quantized_in_memory(whole, *held, **coding)
            size = len(save_tensors(cache_tensors(whole.cache, *held, **coding)))
            files[f"{source}/{name}"] = size
            for a, _, budget in [t for t in todo if t[1] == name]:
                config = configs[budget]
                began = time.perf_counter()
                result = continue_and_decode(model.model, state, torch.tensor([list(a.ids)]), config, evict=True,
                                             max_new_tokens=a.limit, stop_ids=model.stop_ids)  # fmt: skip
                text = lm.tokenizer.decode(list(result.token_ids), skip_special_tokens=True).strip()
                row = a.scored(text, budget, config, time.perf_counter() - began, args.abstain)
                rows.append(dict(asdict(row), source=source, layout=name, bits=bits, sink=sink, recent=recent,
                                 values=values, file_bytes=size))  # fmt: skip
                print(f"  {name:>8} B={budget} {a.id}: score {row.score:.2f} ({row.support})", flush=True)
                args.output.write_text(json.dumps(dict(meta=meta, files=files, rows=rows), indent=1) + "\n")
    print_report([dict(meta=meta, files=files, rows=rows)], args.abstain)


def _real_groups(model: Model, documents, questions: int, new_tokens: int) -> list[tuple[str, list[Asked]]]:
    """[(document id, [Asked of each question])] of the real set's documents: every
    question of a document shares its prefix (the `qa` template up to the question), as `cake compress` keeps it."""
    groups = []
    for doc in documents:
        asked = []
        for question in list(doc.questions)[: questions or None]:
            case = build_case(model, doc, question, 32768)
            scored = lambda text, budget, config, seconds, abstain, case=case: _row(  # noqa: E731
                case, SimpleNamespace(name="file"), budget, config, text, seconds, 0.0, abstain
            )
            asked.append(Asked(question.id, case.input_ids, scored, new_tokens))
        groups.append((doc.spec.id, asked))
    return groups


def _genre_groups(model: Model, suite: GenreSuite, one_haystack: bool = False) -> list[tuple[str, list[Asked]]]:
    """[(haystack key, [Asked of each case])] of the genre suite's cases, those with one
    haystack (m-each's three facts; `one_haystack`: sized so that all three share it) in one group; each group
    also holds its document's prompt under another question (no scorer: never asked), so the shared prefix never
    reaches into a question."""
    by_document: dict[str, list] = {}
    for task, index, depth, length, genre in suite.specs():
        case = build_genre_case(model, task, genre, index, depth, length, suite.seed, one_haystack=one_haystack)
        by_document.setdefault(case.document, []).append(case)
    groups = []
    for cases in by_document.values():
        asked = []
        for case in cases:
            ids = prompt_ids(model, case)
            case_id = _genre_id(case, suite.seed)
            scored = lambda *a, case=case, case_id=case_id, n=len(ids): _genre_row(case, case_id, n, *a)  # noqa: E731
            asked.append(Asked(case_id, ids, scored, load_template(TEMPLATES[case.task]).max_new_tokens))
        other = replace(cases[0], question=cases[0].question + " Answer briefly.")
        asked.append(Asked("(prefix)", prompt_ids(model, other), None, 0))
        groups.append((f"genre:{asked[0].id}", asked))
    return groups


def _genre_id(case, seed: int) -> str:
    """A genre case's id with its task ("m-each/code/d50-n1"): the suite's ids repeat across tasks; under another
    seed than the default they also repeat across runs, so the seed is part of the id ("m-each/code/d50-n1@s11")
    and runs of several seeds pool in one report."""
    return f"{case.task}/{case.case_id}" + ("" if seed == DEFAULT_SEED else f"@s{seed}")


def _genre_row(
    case, case_id: str, tokens: int, text: str, budget: int, config, seconds: float, abstain: str
) -> CaseResult:
    """The scored row of a genre case's reply, under `case_id` (`_genre_id`; the suite's own scoring, no
    abstention rule applies)."""
    score = score_answer(case.task, text, case.references, case.keywords)
    return CaseResult(
        task=case.task, case_id=case_id, split=case.split, length=case.length, method="file", budget=budget,
        prompt_tokens=tokens, depth=case.depth, score=round(score, 6),
        exact=exact_answer(case.task, text, case.references, case.keywords), prediction=text,
        tau1=config.tau1, tau2=config.tau2, seconds=round(seconds, 3), record_seconds=0.0, source=case.source,
        genre=case.case_id.split("/")[0], support="n/a",
    )  # fmt: skip


def print_report(runs: list[dict], abstain: str = DEFAULT_ABSTAIN, overrides: Sequence[dict] = ()) -> None:
    """Markdown tables of finished runs (merged by cell; the same layouts first to last) and the target lines,
    every stored reply scored again as `cake qa --abstain abstain` shows it (`abstention.rescore`). The layouts are
    those every run has (the first run's order); a question is counted where it has all of them. `overrides`:
    runs whose replies take the place of the same (question, layout, budget) cells' (the count is printed)."""
    names = [n for n in runs[0]["meta"]["layouts"] if all(n in run["meta"]["layouts"] for run in runs)]
    stored = [r for run in runs for r in run["rows"]]
    newer = {_cell(r): r for run in overrides for r in run["rows"]}
    if newer:
        print(f"{sum(_cell(r) in newer for r in stored)} stored replies replaced by the override runs'")
        stored = [newer.get(_cell(r), r) for r in stored]
    # Genre-suite rows have no abstention rule, and a middle-cut document's rows cannot be rescored: both as stored.
    again = [r["task"] in REAL_TASKS and r["task"] != "real-cut" for r in stored]
    rows_again = [r for r, a in zip(stored, again) if a]
    rescored = rescore(rows_again, abstain, *rescore_inputs(rows_again)) + [r for r, a in zip(stored, again) if not a]
    rows = {_cell(r): r for r in rescored}
    files = {k: v for run in runs for k, v in run["files"].items()}
    budgets = sorted({k[3] for k in rows})
    meta = runs[0]["meta"]
    print(f"model {meta['model']} ({meta['dtype']}), question-time indicator {meta.get('indicator', 'cake')}, "
          f"group {meta['group']}, window {meta['window']}, replies scored with --abstain {abstain}")  # fmt: skip
    lines = []
    for budget in budgets:
        questions = sorted({k[:2] for k in rows if k[3] == budget and all((*k[:2], n, budget) in rows for n in names)})
        if not questions:
            continue
        docs = sorted({q[0] for q in questions})
        ref = [rows[(*q, names[0], budget)] for q in questions]
        answerable = [i for i, r in enumerate(ref) if r["task"] not in ABSTAIN_TASKS]
        genre, haystacks = sum(r["task"] not in REAL_TASKS for r in ref), sum(d.startswith("genre:") for d in docs)
        print(
            f"\nB = {budget}: {len(questions)} questions ({len(answerable)} answerable) on {len(docs)} documents"
            + (f"; {genre} of them genre-suite cases on {haystacks}" if genre else "")
        )
        print("| layout | score | exact | answerable exact | abstentions right | better / same / worse "
              "(exact) | exact − first [95% CI] | file / first |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---|---|---:|")
        for name in names:
            mine = [rows[(*q, name, budget)] for q in questions]
            exact = [float(r["exact"]) for r in mine]
            base = [float(r["exact"]) for r in ref]
            ratio = sum(files[f"{d}/{name}"] for d in docs) / sum(files[f"{d}/{names[0]}"] for d in docs)
            others = [i for i in range(len(mine)) if i not in set(answerable)]
            diffs = [a - b for a, b in zip(exact, base)]
            wtl = _moves(diffs)
            ci = paired_interval(exact, base)
            shown = "–" if name == names[0] else f"{100 * ci.mean:+.1f} [{100 * ci.low:+.1f}, {100 * ci.high:+.1f}]"
            score = 100 * sum(r["score"] for r in mine) / len(mine)
            print(f"| {name} | {score:.1f} | {100 * sum(exact) / len(exact):.1f} "
                  f"| {_pct(exact, answerable)} | {_pct(exact, others)} | {wtl} | {shown} | {ratio:.3f} |")  # fmt: skip
            for size, bound in TARGETS if name != names[0] else ():
                if ratio <= size:
                    verdict = "PASS" if 100 * ci.low >= bound else "FAIL"
                    lines.append(f"{verdict} B={budget}: the {name}-bit file is {ratio:.3f}x the {names[0]}-bit one "
                                 f"(target <= {size}x) and its exact answers differ by {100 * ci.mean:+.1f} "
                                 f"[{100 * ci.low:+.1f}, {100 * ci.high:+.1f}] on {len(questions)} questions "
                                 f"(target: lower bound >= {bound:+.0f})")  # fmt: skip
        for name in names[1:]:  # where the answers that moved come from
            kinds = {"real questions": [], "genre-suite facts": []}
            for q, r in zip(questions, ref):
                moved = float(rows[(*q, name, budget)]["exact"]) - float(r["exact"])
                kinds["real questions" if r["task"] in REAL_TASKS else "genre-suite facts"].append(moved)
            print(f"{name} against {names[0]}, better / same / worse: "
                  + "; ".join(f"{k} {_moves(v)}" for k, v in kinds.items() if v))  # fmt: skip
    print()
    for line in lines:
        print(line)


def _cell(row: dict) -> tuple:
    """(document, question, layout, budget): the cell a reply answers."""
    return row["source"], row["case_id"], row["layout"], row["budget"]


def _moves(diffs: list[float]) -> str:
    """The better / same / worse counts of paired differences."""
    return f"{sum(d > 0 for d in diffs)} / {sum(d == 0 for d in diffs)} / {sum(d < 0 for d in diffs)}"


def _pct(values: list[float], idx: list[int]) -> str:
    return f"{100 * sum(values[i] for i in idx) / len(idx):.1f}" if idx else "–"


if __name__ == "__main__":
    main()
