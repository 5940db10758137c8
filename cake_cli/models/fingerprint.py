"""A cheap fingerprint of a loaded model's weights and tokenizer, stored in saved caches (.cake).

A saved KV cache is only valid for the exact weights that computed it. Hashing every weight (2.5 GB
for the default model) on every load would cost more than the prefill it saves, so the fingerprint
hashes what differs between checkpoints at almost no cost (milliseconds):

- the architecture numbers of the config (layers, heads, KV heads, head dim, vocabulary, RoPE);
- every parameter's name and shape, and its first and last `SAMPLES` values as float32;
- the tokenizer: its size, special-token ids, chat template, and the ids of a probe text;
- quantized linear layers (`models.quantize`, `--weights int8|int4|w8a8`): their weight buffers, sampled
  the same way, so a cache made with one weight format is never taken for another's (a model
  without them hashes exactly as before).

Two fine-tunes of one base model differ in those sampled values with near certainty; the dtype the
model was loaded in is part of the values (a cache is only valid in the dtype it was made in).
"""

from __future__ import annotations

import hashlib

import torch

from cake_cli.models.quantize import ENDS, FINGERPRINTED

SAMPLES = ENDS  # values read from each end of every parameter: W8A8Linear keeps exactly these codes of its weight
CONFIG_KEYS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rope_theta",
    "rope_parameters",
    "rms_norm_eps",
)
PROBE = "Fingerprint probe: The quick brown fox, 1234.5 — naïve café, 日本語\n\n<document>\n</document>"


def fingerprint(model, tokenizer, ends=None) -> str:
    """32 hex digits identifying `model`'s weights (sampled) and `tokenizer` (see the module docstring).

    Parameters on the meta device contribute their name and shape only (offloaded by a device map),
    unless `ends(name, param)` gives their sampled values: [2 · SAMPLES] in the parameter's dtype,
    the first and last `SAMPLES` of the flattened tensor (`models.lean_load` reads them from the
    checkpoint, so a model not yet loaded gets the fingerprint it will have).
    """
    digest = hashlib.sha256()
    config = model.config
    for key in CONFIG_KEYS:
        digest.update(f"{key}={getattr(config, key, None)!r};".encode())
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            digest.update(f"{name}:{tuple(param.shape)};".encode())
            if not param.numel():
                continue
            if param.device.type != "meta":
                flat = param.detach().reshape(-1)
                sample = torch.cat([flat[:SAMPLES], flat[-SAMPLES:]]).float().cpu()  # [2 · SAMPLES]
                digest.update(sample.numpy().tobytes())
            elif ends is not None:
                digest.update(ends(name, param).float().numpy().tobytes())
        for name, buf in sorted(model.named_buffers(), key=lambda item: item[0]):
            if name.endswith(FINGERPRINTED) and buf.numel():
                flat = buf.detach().reshape(-1)
                sample = torch.cat([flat[:SAMPLES], flat[-SAMPLES:]]).float().cpu()  # [2 · SAMPLES]
                digest.update(f"{name}:{tuple(buf.shape)};".encode() + sample.numpy().tobytes())
    special = sorted((str(k), str(v)) for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items())
    digest.update(f"tokens={len(tokenizer)};special={special};".encode())
    digest.update(str(getattr(tokenizer, "chat_template", None)).encode())
    digest.update(repr(tokenizer(PROBE, add_special_tokens=True)["input_ids"]).encode())
    return digest.hexdigest()[:32]
