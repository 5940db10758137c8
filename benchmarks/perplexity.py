"""Perplexity of a real text under each weight format, through the prefill or the decode path.

The fused int8/int4 kernels run only on forwards of at most `quantize.DECODE_ROWS` tokens, so a
perplexity from one labelled forward (prefill: the dequantized weights) says nothing about them.
`--path decode` feeds the text one token per forward with a KV cache, the way answers are
generated, and scores each next token; `--path prefill` runs one forward over the whole text.
Loads the model once per weight format (`load_model(weights=...)`, quantized weights read from
their cache under CAKE_HOME) and prints one Markdown row per format.

    python benchmarks/perplexity.py --weights bf16,int8,int4 --tokens 512 --path decode

The text defaults to CPython's LICENSE.txt (shipped with every Python), first `--tokens` tokens.
"""

from __future__ import annotations

import argparse
import math
import sysconfig
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from cake_cli.models.loader import load_model


def perplexity(model, ids: torch.Tensor, path: str) -> float:
    """exp(mean negative log-likelihood) of ids[0, 1:] given the tokens before each.

    Args:
        model: a causal LM.
        ids: [1, T] token ids, T >= 2.
        path: ``prefill`` (one forward over the T tokens) or ``decode`` (T - 1 forwards of one token).
    """
    with torch.inference_mode():
        if path == "prefill":
            logits = model(ids).logits[0, :-1].float()  # [T-1, V]
            return math.exp(torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item())
        cache, nll = DynamicCache(), 0.0
        for i in range(ids.shape[1] - 1):
            out = model(ids[:, i : i + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            nll -= torch.log_softmax(out.logits[0, -1].float(), -1)[ids[0, i + 1]].item()
        return math.exp(nll / (ids.shape[1] - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or path (default: the embedded default)")
    parser.add_argument("--weights", default="bf16,int8,int4", help="comma-separated weight formats")
    parser.add_argument("--dtype", default="auto", help="the model's dtype (auto: as cake run commands pick it)")
    parser.add_argument("--text", type=Path, default=Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt")
    parser.add_argument("--tokens", type=int, default=512, help="the text's first N tokens")
    parser.add_argument("--path", choices=("decode", "prefill"), default="decode")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    text = args.text.read_text(encoding="utf-8")
    print(f"text {args.text}, first {args.tokens} tokens, {args.path} path, {args.threads} thread(s)\n")
    print("| weights | dtype | perplexity | seconds |\n|---|---|---:|---:|")
    for weights in args.weights.split(","):
        lm = load_model(args.model, dtype=args.dtype, weights=weights)
        ids = lm.tokenizer(text, return_tensors="pt").input_ids[:, : args.tokens]
        t0 = time.perf_counter()
        ppl = perplexity(lm.model, ids, args.path)
        name = str(lm.dtype).removeprefix("torch.")
        print(f"| {weights} | {name} | {ppl:.4f} | {time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
