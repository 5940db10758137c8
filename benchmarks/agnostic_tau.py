"""CAKE's temperatures searched on reconstruction statistics: the question-agnostic `.cake` (`cake compress
--scoring reconstruct --method cake`) at one keep ratio, every (tau1, tau2) of a grid, on one reconstruction per
document (issue 47, item 3).

The protocol is `cake bench cache --parts agnostic`'s (`bench.agnostic.run`: a QA case with three planted needles,
compressed once with no question, then its 4 questions asked from that one cache, 16 bits), with other rows:

- ``full``: the prefix's whole cache (the target's reference), at 16 bits and at each of `--full-bits` (held
  as a .cake of those bits holds it: the same bytes as a question-agnostic file of a smaller keep ratio);
- ``reconstruct+global`` / ``reconstruct+uniform``: KVzip's one ranking / equal budgets (the same reconstruction);
- ``reconstruct+cake@T1,T2``: CAKE's one-shot budgets (Eq. 7-9) from the reconstruction's statistics H_l and V_l
  with temperatures T1, T2 (only the log preferences change: `preference.log_preference`), the pairs of each layer
  ranked by the reconstruction scores as `engine.reconstruct.evict_by_scores` ranks them.

Each row also records the largest share of the evictable budget one layer took (the allocation's skew). The
reconstruction scores and statistics do not depend on the temperatures, so one reconstruction serves the grid.
Choose on `--split tune` (other QA items and needles than `eval`), check on `--split eval`:

    python benchmarks/agnostic_tau.py --split tune --indices 0,1,2,3 --length 4096 --ratio 0.25 \
        --tau1 0.5,1,2,4,8 --tau2 0.4,1.5,4,8 -o tune.json
    python benchmarks/agnostic_tau.py --report tune.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

from cake_cli.bench.agnostic.run import DocumentRun, agnostic_document, evicted_by_scores, file_bytes, held_as_file
from cake_cli.bench.bootstrap import paired_interval
from cake_cli.bench.quality.run import Model
from cake_cli.cli.bench_options import configs_for
from cake_cli.engine.cascade import LayerStats
from cake_cli.engine.generate import Prefilled
from cake_cli.engine.preference import log_preference
from cake_cli.engine.reconstruct import reconstruction_scores
from cake_cli.engine.replay import record, replay
from cake_cli.files import write_atomic
from cake_cli.tasks.runner import load_ready, prompt_limit, stop_token_ids

BASE_ROWS = ("full", "reconstruct+global", "reconstruct+uniform")
NUMBER = re.compile(r"\d{4,}")  # the needles' values (passcodes, lucky numbers) have 4 or more digits


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def with_taus(rec, tau1: float, tau2: float):
    """The reconstruction with every layer's log preference recomputed at (tau1, tau2) (Eq. 7)."""
    stats = [
        None if s is None else LayerStats(s.dispersion, s.shift, log_preference(s.dispersion, s.shift, tau1, tau2))
        for s in rec.stats
    ]
    return replace(rec, stats=stats)


def largest_share(state: Prefilled) -> float:
    """The largest share of the evictable budget one layer holds (0 when nothing was evicted)."""
    kept = [b for b in state.cascade.final_budgets or [] if b is not None]
    return max(kept) / sum(kept) if kept and sum(kept) else 0.0


def run_document(
    run: DocumentRun, ratio: float, grid: list[tuple[float, float]], full_bits: list[int], status
) -> list[dict]:
    """Every row of one document at one keep ratio (module docstring); each row's .cake tensor bytes."""
    budget = run.budget(ratio)
    config = run.configs(budget)
    window = config.window
    prefix = torch.tensor([run.prefix], device=run.device)
    status(f"{run.doc['doc_id']}: prefill of the {run.n}-token prefix")
    rec = record(run.model.model, prefix, window, accumulate=False)
    whole = replay(rec, None)
    for bits in [16, *full_bits]:
        held = whole if bits == 16 else held_as_file(whole, bits, window)
        run.answer("full" if bits == 16 else f"full@{bits}bit", None, bits, held, None, file_bytes(whole, bits, window))
    status(f"{run.doc['doc_id']}: reconstruction")
    repeat, target = run.reconstruction_ids()
    scores = reconstruction_scores(run.model.model, rec.cache, repeat, target, config)
    shares: dict[str, float] = {}
    rows = [("reconstruct+global", replace(config, allocation="global"), scores)]
    rows.append(("reconstruct+uniform", replace(config, allocation="uniform"), scores))
    for t1, t2 in grid:
        rows.append((f"reconstruct+cake@{t1:g},{t2:g}", replace(config, tau1=t1, tau2=t2), with_taus(scores, t1, t2)))
    for name, cfg, rec_scores in rows:
        status(f"{run.doc['doc_id']}: {name} at keep {ratio:.0%} (B = {budget})")
        state = evicted_by_scores(rec, rec_scores, cfg)
        shares[name] = largest_share(state)
        run.answer(name, ratio, 16, state, cfg, file_bytes(state, 16, window))
    for row in run.rows:
        row["max_layer_share"] = shares.get(row["row"])
        row["reconstruction_seconds"] = scores.seconds
    return run.rows


def needle_mixups(cells: dict, numbers: dict) -> str:
    """ "right / another needle's / other" over a row's needle answers: a wrong answer that holds a number the
    full cache gave for one of the document's needles took another planted fact's value."""
    right = mixed = other = 0
    for key, row in cells.items():
        if not row["kind"].startswith("needle"):
            continue
        if row["exact"]:
            right += 1
        elif set(NUMBER.findall(row["prediction"])) & numbers[key[:2]]:
            mixed += 1
        else:
            other += 1
    return f"{right} / {mixed} / {other}"


def report(paths: list[Path]) -> None:
    """Mean score and exact per row (× 100), each row's paired interval against the default taus' row and
    against the full cache, the mean largest-layer share, the file's bytes against the 16-bit whole prefix's, its
    needle answers (`needle_mixups`); the best CAKE row by mean score."""
    rows = [r for p in paths for r in json.loads(p.read_text(encoding="utf-8"))["rows"]]
    meta = [json.loads(p.read_text(encoding="utf-8"))["meta"] for p in paths]
    by = defaultdict(dict)
    for r in rows:
        by[r["row"]][(r["doc_id"], r["length"], r["question"])] = r
    full = {k: r["score"] for k, r in by["full"].items()}
    default = f"reconstruct+cake@{meta[0]['profile_taus'][0]:g},{meta[0]['profile_taus'][1]:g}"
    base = {k: r["score"] for k, r in by.get(default, {}).items()}
    docs = len({k[:2] for k in full})
    print(
        f"{len(full)} questions on {docs} documents ({', '.join(p.name for p in paths)}); split "
        f"{', '.join(sorted({m['split'] for m in meta}))}; keep {meta[0]['ratio']:.0%}; default taus: {default}"
    )
    print(
        "| row | score | exact | % of full | − full [95% CI] | − default taus [95% CI] | largest layer's share "
        "| file / 16-bit full | needles: right / another's number / other |"
    )
    print("|---|---:|---:|---:|---|---|---:|---:|---|")
    numbers = defaultdict(set)  # (doc, length) -> the needle values the full cache answered
    for key, row in by["full"].items():
        if row["kind"].startswith("needle") and row["exact"]:
            numbers[key[:2]] |= set(NUMBER.findall(row["prediction"]))
    full_bytes = {k[:2]: r["file_bytes"] for k, r in by["full"].items() if r.get("file_bytes")}
    full_mean = 100 * statistics.mean(full.values())
    cake_rows = []
    for name in sorted(by, key=lambda n: (n not in BASE_ROWS, n)):
        cells = by[name]
        keys = sorted(k for k in cells if k in full)
        score = 100 * statistics.mean(cells[k]["score"] for k in keys)
        exact = 100 * statistics.mean(cells[k]["exact"] for k in keys)
        row = [f"| {name}", f"{score:.1f}", f"{exact:.1f}", f"{100 * score / full_mean:.0f}%"]
        for ref in (full, base):
            shared = [k for k in keys if k in ref]
            if name == "full" or not shared or (ref is base and name == default):
                row.append("–")
                continue
            diff = paired_interval([100 * cells[k]["score"] for k in shared], [100 * ref[k] for k in shared])
            row.append(f"{diff.mean:+.1f} [{diff.low:+.1f}, {diff.high:+.1f}]")
        shares = [cells[k]["max_layer_share"] for k in keys if cells[k].get("max_layer_share") is not None]
        row.append(f"{100 * statistics.mean(shares):.0f}%" if shares else "–")
        sizes = [cells[k]["file_bytes"] / full_bytes[k[:2]] for k in keys if cells[k].get("file_bytes")]
        row.append(f"{statistics.mean(sizes):.3f}" if sizes else "–")
        row.append(needle_mixups({k: cells[k] for k in keys}, numbers))
        print(" | ".join(row) + " |")
        if name.startswith("reconstruct+cake@"):
            cake_rows.append((score, name))
    if cake_rows:
        best = max(cake_rows, key=lambda x: (round(x[0], 6), x[1] == default))
        print(f"best CAKE taus by mean score: {best[1]} ({best[0]:.1f}; full cache {full_mean:.1f})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--split", default="tune", choices=("tune", "eval"))
    parser.add_argument("--indices", default="0,1,2,3", help="QA item / needle indices of the documents")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--depth", type=float, default=0.5)
    parser.add_argument("--ratio", type=float, default=0.25)
    parser.add_argument("--tau1", default="0.5,1,2,4,8")
    parser.add_argument("--tau2", default="0.4,1.5,4,8")
    parser.add_argument("--pairs", help="tau1:tau2 pairs to run instead of the --tau1 x --tau2 grid, e.g. 1:1.5,2:1.5")
    parser.add_argument("--full-bits", default="", help="also hold the whole prefix at these bits, e.g. 4")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("-o", "--output", type=Path)
    parser.add_argument("--report", help="comma-separated run files: print their table and stop")
    args = parser.parse_args(argv)
    if args.report:
        report([Path(p) for p in args.report.split(",")])
        return
    if args.output is None:
        parser.error("give -o FILE.json (or --report)")
    torch.set_num_threads(args.threads)
    lm = load_ready(args.model, "auto", "sdpa").loaded
    model = Model(lm.model, lm.tokenizer, prompt_limit(lm, 64), stop_token_ids(lm))

    def configs(budget: int):
        return configs_for(args.model, None, [budget], "cake")[budget]

    taus = configs(512)
    grid = [(t1, t2) for t1 in floats(args.tau1) for t2 in floats(args.tau2)]
    if args.pairs:
        grid = [tuple(float(x) for x in pair.split(":")) for pair in args.pairs.split(",")]
    full_bits = [int(b) for b in args.full_bits.split(",") if b.strip()]
    if (taus.tau1, taus.tau2) not in grid:
        grid.append((taus.tau1, taus.tau2))
    meta = dict(model=args.model, split=args.split, length=args.length, depth=args.depth, ratio=args.ratio,
                profile_taus=[taus.tau1, taus.tau2], grid=grid, full_bits=full_bits, threads=args.threads,
                command=" ".join(sys.argv), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))  # fmt: skip
    data = {"meta": meta, "rows": []}
    if args.output.exists():
        old = json.loads(args.output.read_text(encoding="utf-8"))
        same = ("grid", "split", "length", "ratio", "full_bits")
        if all(old["meta"].get(k) == json.loads(json.dumps(meta[k])) for k in same):
            data["rows"] = old["rows"]
    done = {r["doc_id"] for r in data["rows"]}

    def status(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    for index in (int(i) for i in args.indices.split(",")):
        doc = agnostic_document(model, args.split, index, args.depth, args.length)
        if doc["doc_id"] in done:  # ids repeat across lengths; a run file holds one length
            continue
        data["rows"] += run_document(DocumentRun(model, doc, configs), args.ratio, grid, full_bits, status)
        write_atomic(args.output, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    report([args.output])


if __name__ == "__main__":
    main()
