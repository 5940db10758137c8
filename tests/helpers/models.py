"""Tiny random models built in-process (no downloads), with sharpened q/k projections."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from cake_cli.models.quantize import SCHEMES, w8a8_available

needs_fbgemm = pytest.mark.skipif(not w8a8_available(), reason="torch built without the fbgemm engine (w8a8)")
TESTED_SCHEMES = tuple(s for s in SCHEMES if s != "w8a8" or w8a8_available())  # bf16 first, then the quantized


def tiny_llama(layers: int = 4, heads: int = 8, kv_heads: int = 2, head_dim: int = 8, vocab: int = 97, seed: int = 0):
    """A random Llama-architecture model (fp32, eval) with GQA group heads // kv_heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=heads * head_dim,
        intermediate_size=4 * heads * head_dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_theta=10000.0,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # plain generate runs the full length, like the engine in tests
    # larger weights make the attention less uniform, so eviction decisions are well separated
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
    return model


def tiny_family(
    arch: str, layers: int = 4, heads: int = 8, kv_heads: int = 2, head_dim: int = 8, seed: int = 0, **config
):
    """A random model of family `arch` (fp32, eval; `tests.helpers.tiny.family_config` defaults, vocab 97),
    with the same sharpened q/k projections as `tiny_llama` and random q/k norm weights where the
    family has them (so the norms change the queries the window attention must see)."""
    from transformers import AutoModelForCausalLM

    from tests.helpers.tiny import family_config

    torch.manual_seed(seed)
    cfg = family_config(arch, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=97, **config)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None  # plain generate runs the full length, like the engine here
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            for name in ("q_proj", "k_proj", "qkv_proj"):
                if hasattr(attn, name):
                    getattr(attn, name).weight.mul_(4.0)
            for name in ("q_norm", "k_norm"):
                if hasattr(attn, name):
                    getattr(attn, name).weight.copy_(torch.randn_like(getattr(attn, name).weight) * 0.5 + 0.5)
    return model


def ids_of(n: int, seed: int) -> torch.Tensor:
    """[1, n] random token ids below the tiny models' vocabulary (97), seeded."""
    return torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def kept_per_layer(state) -> list[list[list[int]]]:
    """[L][H_kv][kept] the positions each layer of a prefilled state's cache holds, per KV head."""
    return [layer.positions.tolist() for layer in state.cache.layers]


def cached_models(cases: dict) -> Callable[[str], object]:
    """`model(case)`: the tiny model of `cases[case]` = (arch, config overrides), built once per case
    ("llama" is `tiny_llama`, any other arch `tiny_family`)."""
    built: dict = {}

    def model(case: str):
        if case not in built:
            arch, overrides = cases[case]
            built[case] = tiny_llama() if arch == "llama" else tiny_family(arch, **overrides)
        return built[case]

    return model
