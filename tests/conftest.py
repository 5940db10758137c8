"""Shared fixtures: tiny random models built in-process (no downloads)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def tiny_llama(layers: int = 4, heads: int = 8, kv_heads: int = 2, head_dim: int = 8, vocab: int = 97,
               seed: int = 0):
    """A random Llama-architecture model (fp32, eval) with GQA group heads // kv_heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=heads * head_dim, intermediate_size=4 * heads * head_dim,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=4096, rope_theta=10000.0)
    model = LlamaForCausalLM(config).eval()
    # larger weights make the attention less uniform, so eviction decisions are well separated
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
    return model


@pytest.fixture(scope="module")
def tiny_model():
    return tiny_llama()
