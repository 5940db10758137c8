"""The check pass and the abstention probability (`tasks.answers.check`): the check's tokens come from the
chat template, and on a full cache its P(yes) is that of one plain forward over prompt + answer + check
question, the abstention probability that of one over prompt + "Answer:" (the oracles); the state they
run on is left unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import prefill
from cake_cli.tasks.answers.check import (
    ABSTAIN_OPENINGS,
    ANSWER_LEAD,
    CHECK_QUESTION,
    CheckTokens,
    DoubtTokens,
    abstain_probability,
    check_answer,
    check_tokens,
    doubt_answer,
    doubt_tokens,
    yes_probability,
)
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


def read_on_a_prefill(tokenizer, config, seed, read):
    """(model, prompt [1, 60], read(model, state)) on a tiny model's prefill of a random prompt, checking
    that the state read is left unchanged."""
    model = tiny_llama(vocab=len(tokenizer))
    use_cake_attention(model, "sdpa")
    prompt = torch.randint(3, len(tokenizer), (1, 60), generator=torch.Generator().manual_seed(seed))
    state = prefill(model, prompt, config)
    kept = [(layer.keys.clone(), layer.positions.clone()) for layer in state.cache.layers]
    value = read(model, state)
    for layer, (keys, positions) in zip(state.cache.layers, kept):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.positions, positions)
    return model, prompt, value


@pytest.mark.parametrize("config", [None, CakeConfig(budget=24, window=6)], ids=["full", "cake"])
def test_check_answer_is_one_forward_over_the_kept_cache_and_leaves_it(tokenizer, config):
    tokens = check_tokens(tokenizer)
    answer = [7, 11, 13]
    model, prompt, p = read_on_a_prefill(tokenizer, config, 0, lambda m, state: check_answer(m, state, answer, tokens))
    assert 0.0 <= p <= 1.0
    if config is None:  # the oracle: a plain causal forward of the whole conversation
        whole = torch.cat([prompt, torch.tensor([[*answer, *tokens.suffix]])], dim=1)
        with torch.inference_mode():
            logits = model(whole).logits[:, -1]
        assert p == pytest.approx(yes_probability(logits, tokens), abs=1e-5)


def test_the_doubt_tokens_are_the_lead_and_the_abstentions_first_tokens(tokenizer):
    tokens = doubt_tokens(tokenizer)
    assert tokenizer.decode(list(tokens.lead)) == ANSWER_LEAD
    firsts = {tokenizer.encode(word, add_special_tokens=False)[0] for word in ABSTAIN_OPENINGS}
    assert set(tokens.abstain) == firsts and len(tokens.abstain) == len(firsts)


def test_abstain_probability_is_the_whole_vocabularys_softmax_summed_over_the_abstentions():
    tokens = DoubtTokens(lead=(1,), abstain=(3, 4))
    logits = torch.zeros(1, 10)
    logits[0, [3, 4]] = math.log(2)  # e.g. 2 / (2 + 2 + 8): the other 8 tokens count in the denominator
    assert abstain_probability(logits, tokens) == pytest.approx(4 / 12)


@pytest.mark.parametrize("config", [None, CakeConfig(budget=24, window=6)], ids=["full", "cake"])
def test_doubt_answer_is_one_forward_of_the_lead_over_the_kept_cache_and_leaves_it(tokenizer, config):
    tokens = doubt_tokens(tokenizer)

    def read(model, state):
        p = doubt_answer(model, state, [7, 11], tokens)
        assert p == doubt_answer(model, state, [5], tokens)  # the answer is not read
        return p

    model, prompt, p = read_on_a_prefill(tokenizer, config, 1, read)
    assert 0.0 < p < 1.0
    if config is None:  # the oracle: a plain causal forward of prompt + lead, the full softmax
        whole = torch.cat([prompt, torch.tensor([list(tokens.lead)])], dim=1)
        with torch.inference_mode():
            probs = torch.softmax(model(whole).logits[0, -1].double(), dim=0)
        assert p == pytest.approx(float(probs[list(tokens.abstain)].sum()), abs=1e-5)
