"""The check pass (`tasks.answers.check`): its tokens come from the chat template, and on a full cache its
P(yes) is that of one plain forward over prompt + answer + check question (the oracle); the state it
runs on is left unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import prefill
from cake_cli.tasks.answers.check import CHECK_QUESTION, CheckTokens, check_answer, check_tokens, yes_probability
from tests.helpers.models import tiny_llama
from tests.helpers.tiny import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_the_check_tokens_close_the_answer_and_ask(tokenizer):
    tokens = check_tokens(tokenizer)
    want = f"<|im_end|>\n<|im_start|>user\n{CHECK_QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(list(tokens.suffix)) == want
    assert {tokenizer.decode([t]) for t in tokens.yes} <= {"y", "Y", "yes", "Yes"} and tokens.yes
    assert not set(tokens.yes) & set(tokens.no)
    tokenizer_without = build_tiny_tokenizer()
    tokenizer_without.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        check_tokens(tokenizer_without)


def test_yes_probability_is_the_softmax_over_the_yes_and_no_tokens_only():
    tokens = CheckTokens(suffix=(1,), yes=(3, 4), no=(5, 6))
    logits = torch.full((1, 10), 50.0)  # other tokens, however likely, do not count
    logits[0, [3, 4, 5, 6]] = torch.tensor([math.log(3), math.log(3), 0.0, 0.0])
    assert yes_probability(logits, tokens) == pytest.approx(6 / 8)


@pytest.mark.parametrize("config", [None, CakeConfig(budget=24, window=6)], ids=["full", "cake"])
def test_check_answer_is_one_forward_over_the_kept_cache_and_leaves_it(tokenizer, config):
    model = tiny_llama(vocab=len(tokenizer))
    use_cake_attention(model, "sdpa")
    tokens = check_tokens(tokenizer)
    prompt = torch.randint(3, len(tokenizer), (1, 60), generator=torch.Generator().manual_seed(0))
    answer = [7, 11, 13]
    state = prefill(model, prompt, config)
    kept = [(layer.keys.clone(), layer.positions.clone()) for layer in state.cache.layers]
    p = check_answer(model, state, answer, tokens)
    assert 0.0 <= p <= 1.0
    for layer, (keys, positions) in zip(state.cache.layers, kept):  # the state asked about is unchanged
        assert torch.equal(layer.keys, keys) and torch.equal(layer.positions, positions)
    if config is None:  # the oracle: a plain causal forward of the whole conversation
        whole = torch.cat([prompt, torch.tensor([[*answer, *tokens.suffix]])], dim=1)
        with torch.inference_mode():
            logits = model(whole).logits[:, -1]
        assert p == pytest.approx(yes_probability(logits, tokens), abs=1e-5)
