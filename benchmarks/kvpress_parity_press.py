"""kvpress's side of benchmarks/kvpress_parity.py: run inside .venv-kvpress (benchmarks/kvpress_env.sh).

Reads a request JSON (--request): the model folder, the prompt file (safetensors, tensor "input_ids"
[1, n]) and a list of runs {key, dtype, press ("snapkv" | "pyramidkv"), window_size, kernel_size,
compression_ratio}. For each run it prefills the prompt once under the press, exactly as kvpress
applies it (`with press(model): model(...)`, SDPA attention, so the press computes its own window
attention), and records which prompt positions each layer and KV head kept. Writes one JSON object
{key: {"kept": [L][H_kv][k] ascending positions, "dtype": ...}} to --out.

The kept positions are read without changing what the press does: its `compress` is called as
kvpress calls it, with the real keys (all that its score reads besides the hidden states) and, in
place of the values, a tensor holding each slot's position; the press gathers that tensor with the
indices it chose, which gives those indices back, and the real values are then gathered with them.
"""

from __future__ import annotations

import argparse
import json

import torch
from kvpress import PyramidKVPress, SnapKVPress
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.utils import logging as hf_logging

PRESSES = {"snapkv": SnapKVPress, "pyramidkv": PyramidKVPress}


def recorded(press, kept: dict[int, list[list[int]]]):
    """Wrap `press.compress` so that each layer's chosen positions land in `kept[layer]`."""
    original = press.compress

    def compress(module, hidden_states, keys, values, attentions, kwargs):
        b, h, n, d = values.shape
        slots = torch.arange(n, dtype=torch.float64).view(1, 1, n, 1).expand(b, h, n, d)  # each slot's position
        new_keys, chosen = original(module, hidden_states, keys, slots, attentions, kwargs)
        index = chosen[..., 0].round().long()  # [b, h, k] in the press's order
        kept[module.layer_idx] = index[0].sort(dim=-1).values.tolist()
        return new_keys, values.gather(2, index.unsqueeze(-1).expand(-1, -1, -1, d)).contiguous()

    press.compress = compress
    return press


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--request", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    request = json.load(open(args.request))
    ids = load_file(request["prompt"])["input_ids"]
    results, models = {}, {}
    for run in request["runs"]:
        dtype = run["dtype"]
        if dtype not in models:
            models.clear()  # one model in memory at a time
            models[dtype] = AutoModelForCausalLM.from_pretrained(
                request["model"], dtype=getattr(torch, dtype), attn_implementation="sdpa"
            ).eval()
        model = models[dtype]
        kept: dict[int, list[list[int]]] = {}
        press = PRESSES[run["press"]](
            compression_ratio=run["compression_ratio"], window_size=run["window_size"], kernel_size=run["kernel_size"]
        )
        with torch.inference_mode(), recorded(press, kept)(model):
            model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
        results[run["key"]] = {"kept": [kept[i] for i in sorted(kept)]}
    json.dump(results, open(args.out, "w"))


if __name__ == "__main__":
    main()
