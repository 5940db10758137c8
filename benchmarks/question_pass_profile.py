"""Where a question-time pass on a whole-prefix cache goes (`cake qa FILE.cake Q`'s work before decoding).

One real-set document's prompt prefix (the `qa` template up to the question) is prefilled once and kept
whole; at each bit width it is held as a .cake of those bits holds it in memory (`quantized_in_memory`,
group 32, 32 recent and 4 sink tokens exact), and each of the document's first questions runs the
question-aware eviction (`continuation.continue_prefix(evict=True)`: the question in one forward, with
the prefix's last tokens again when the question is shorter than the window w, every layer scored and
evicted) under cProfile. Prints each pass's
seconds and, for the last question of each width, the functions by their own time.

    python benchmarks/question_pass_profile.py --document python-statistics --bits 16,4,2
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from cake_cli.bench.quality.real import build_case, common_prefix
from cake_cli.bench.quality.run import Model
from cake_cli.bench.real_docs import load_set, open_documents
from cake_cli.cli.bench_options import configs_for
from cake_cli.engine.cachefile import quantized_in_memory, value_coding_of
from cake_cli.engine.config import DEFAULT_KV_GROUP, DEFAULT_KV_SINK
from cake_cli.engine.continuation import continue_prefix, window_start
from cake_cli.engine.replay import record, replay
from cake_cli.tasks.runner import load_ready, prompt_limit, stop_token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or path (default: the embedded default)")
    parser.add_argument("--document", default="python-statistics", help="a real-set document id")
    parser.add_argument("--questions", type=int, default=3, help="the document's first N questions")
    parser.add_argument("--bits", default="16,4,2", help="KV bits of the held prefix, comma-separated")
    parser.add_argument("--budget", type=int, default=256, help="B at question time")
    parser.add_argument("--method", default="cake", help="question-time eviction method")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_ready(args.model, "auto", "sdpa").loaded
    model = Model(lm.model, lm.tokenizer, prompt_limit(lm, 64), stop_token_ids(lm))
    config = configs_for(args.model, None, [args.budget], args.method)[args.budget]
    documents, missing = open_documents(load_set(), [args.document])
    if missing:
        raise SystemExit(f"error: document not installed: {args.document}")
    doc = documents[0]
    cases = [build_case(model, doc, q, 32768) for q in list(doc.questions)[: args.questions]]
    n = common_prefix([c.input_ids for c in cases])
    began = time.perf_counter()
    whole = replay(record(model.model, torch.tensor([cases[0].input_ids[:n]]), config.window, accumulate=False), None)
    print(f"{lm.name} ({lm.dtype}), {args.threads} thread(s): {doc.spec.id}, a {n}-token prefix prefilled in "
          f"{time.perf_counter() - began:.1f} s; B = {args.budget}, {args.method}", flush=True)  # fmt: skip
    for bits in (int(b) for b in args.bits.split(",")):
        window = config.window
        layout = (bits, DEFAULT_KV_GROUP, window, DEFAULT_KV_SINK)
        held = whole if bits == 16 else quantized_in_memory(whole, *layout, **value_coding_of(whole.cache))
        for i, case in enumerate(cases):
            ids = torch.tensor([case.input_ids])
            profile = cProfile.Profile()
            began = time.perf_counter()
            profile.enable()
            cont, _ = continue_prefix(model.model, held, ids, config, evict=True)
            profile.disable()
            wall = time.perf_counter() - began
            again = n - window_start(n, ids.shape[1], window)
            print(f"{bits}-bit, question {i + 1}: {ids.shape[1] - n} new tokens (+ {again} prefix tokens run "
                  f"again), pass {wall:.2f} s, its forward {cont.seconds:.2f} s", flush=True)  # fmt: skip
            if i == len(cases) - 1:
                out = io.StringIO()
                pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(16)
                print(out.getvalue(), flush=True)


if __name__ == "__main__":
    main()
