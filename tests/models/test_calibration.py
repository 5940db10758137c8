"""The int4 fit's input-channel importance against the activations read off the model directly."""

from __future__ import annotations

import pytest
import torch

from cake_cli.models.calibration import calibration_text, input_importance
from tests.helpers.models import tiny_llama
from tests.helpers.tiny import build_tiny_tokenizer


def test_importance_is_the_mean_squared_input_of_each_linear_layer():
    """Oracle: the output head's input is the final hidden state (after the last norm), and the
    first q projection's input is the first layer's input norm applied to the embeddings."""
    tokenizer = build_tiny_tokenizer()
    model = tiny_llama(vocab=len(tokenizer))
    text = "the cache keeps what the layers prefer, " * 8
    importance = input_importance(model, tokenizer, text, tokens=40)
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :40]
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
        first = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
    assert len(importance) == 4 * 7 + 1
    torch.testing.assert_close(importance["lm_head"], hidden[-1][0].float().pow(2).mean(0), rtol=1e-5, atol=1e-7)
    q_in = first[0].float().pow(2).mean(0)
    torch.testing.assert_close(importance["model.layers.0.self_attn.q_proj"], q_in, rtol=1e-5, atol=1e-7)
    assert importance["model.layers.0.self_attn.k_proj"].equal(importance["model.layers.0.self_attn.q_proj"])


def test_an_empty_text_or_a_foreign_tokenizer_is_refused():
    with pytest.raises(ValueError, match="no tokens"):
        input_importance(tiny_llama(), build_tiny_tokenizer(), "")
    with pytest.raises(ValueError, match="beyond the model's 97-token vocabulary"):
        input_importance(tiny_llama(), build_tiny_tokenizer(), "ünïcödé " * 20)


def test_the_calibration_text_ships_with_python():
    name, text = calibration_text()
    assert name == "cpython-pydoc-topics" and len(text) > 100_000
