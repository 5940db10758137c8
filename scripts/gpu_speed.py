"""GPU speed check (issue 5): a randomly initialised model with Llama-3.1-8B's shape, bf16,
FlashAttention-2 where flash-attn imports (SDPA otherwise; the output says which), prompts of
32K, 64K and 128K tokens: full cache vs CAKE at budget 1024 — prefill seconds, decode ms/token,
peak GPU memory. Random weights are fine for timing. One call, under 10 minutes on an H200:

    python scripts/gpu_speed.py --lengths 32768,65536,131072 --new-tokens 64 | tee $OUT/gpu_speed.json

Prints one JSON object per case on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cake_cli.engine.attention import default_backend, use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import generate


def llama31_8b_shape(max_positions: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=max_positions,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32768,65536,131072")
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=32, help="fewer layers for a quick dry run")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this script is for a lent GPU")
    device = torch.device("cuda")
    config = llama31_8b_shape(max(lengths) + args.new_tokens + 8)
    config.num_hidden_layers = args.layers
    t0 = time.perf_counter()
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    backend = default_backend(device)
    use_cake_attention(model, backend)
    print(
        f"model ready in {time.perf_counter() - t0:.1f} s, backend {backend}, {torch.cuda.get_device_name()}",
        file=sys.stderr,
    )
    gen = torch.Generator(device="cpu").manual_seed(0)
    for n in lengths:
        ids = torch.randint(0, config.vocab_size, (1, n), generator=gen).to(device)
        for name, cake in (("full", None), ("cake", CakeConfig(budget=args.budget, window=32, tau1=1.6, tau2=0.4))):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            r = generate(model, ids, cake, max_new_tokens=args.new_tokens)
            row = {
                "length": n,
                "method": name,
                "budget": args.budget if cake else None,
                "backend": backend,
                "prefill_seconds": round(r.prefill_seconds, 3),
                "decode_ms_per_token": round(1000 / r.decode_tokens_per_second, 3),
                "kv_bytes_kept": r.kv_bytes_kept,
                "kv_peak_prefill": r.kv_peak_prefill,
                "peak_gpu_bytes_over_weights": torch.cuda.max_memory_allocated() - base,
                "eviction_seconds": round(r.eviction_seconds, 3),
            }
            print(json.dumps(row), flush=True)
            print(
                f"{name} @ {n}: prefill {row['prefill_seconds']} s, decode {row['decode_ms_per_token']} ms/token",
                file=sys.stderr,
            )
            del r


if __name__ == "__main__":
    main()
