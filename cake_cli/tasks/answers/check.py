"""Two readings of the model's own doubt on its kept cache, for the benchmark's abstention rules.

The check pass (`--abstain checked`): after answering, the model is asked on its own kept cache whether
the document states its answer (issue 45's "a check pass on the kept cache").

The conversation goes on where the answer ended: the answer's tokens, the end of the assistant's turn,
a user turn asking `CHECK_QUESTION` and the assistant header (the tokenizer's own chat template writes
them) run as one forward over a copy of the prompt's kept cache, as it was before the answer was decoded
(`engine.continuation.extend`: every continuation token held, nothing evicted or changed). The next-token
logits of "yes" and "no" give the model's probability that the document states its answer: the softmax
over the first token of each spelling (yes, Yes, no, No), the yes ones summed. No token is generated.

The abstention probability (`--abstain doubt`): the qa template's reply opens with "Answer:" and an
abstention goes on with "not in the document". After the prompt and "Answer:" (forced, one forward
over a copy of the kept cache), the softmax over the whole vocabulary gives the probability that the
next token opens the abstention (the first token of " not", " Not" or "not"): how much of the model's
mass sits on abstaining even when its greedy reply answers. No token is generated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cake_cli.engine.continuation import extend
from cake_cli.engine.generate import Prefilled

ANSWER_LEAD = "Answer:"  # how the qa template's reply opens (tasks/data/templates/qa.yaml)
ABSTAIN_OPENINGS = (" not", " Not", "not")  # how "not in the document" may go on after it
CHECK_QUESTION = "Does the document above state your answer? Reply with yes or no."
YES, NO = ("yes", "Yes"), ("no", "No")
_MARK = "\x1eANSWER\x1e"  # stands for the answer in the template; never in a real answer


@dataclass(frozen=True)
class CheckTokens:
    """The token ids of the check pass for one tokenizer."""

    suffix: tuple[int, ...]  # closes the answer's turn, asks CHECK_QUESTION, opens the assistant's
    yes: tuple[int, ...]  # first token of each spelling of "yes"
    no: tuple[int, ...]


def check_tokens(tokenizer) -> CheckTokens:
    """The check pass's tokens for a chat tokenizer (`apply_chat_template`).

    Raises:
        ValueError: the tokenizer has no chat template, or "yes" and "no" share a first token.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the check pass needs a chat model: this tokenizer has no chat template")
    turns = [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": _MARK},
        {"role": "user", "content": CHECK_QUESTION},
    ]
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    suffix = text[text.index(_MARK) + len(_MARK) :]
    first = [tokenizer.encode(word, add_special_tokens=False)[0] for word in (*YES, *NO)]
    yes, no = tuple(dict.fromkeys(first[: len(YES)])), tuple(dict.fromkeys(first[len(YES) :]))
    if set(yes) & set(no):
        raise ValueError("'yes' and 'no' begin with the same token in this tokenizer")
    return CheckTokens(tuple(tokenizer.encode(suffix, add_special_tokens=False)), yes, no)


def yes_probability(logits: torch.Tensor, tokens: CheckTokens) -> float:
    """P(yes) from next-token logits [1, V] (or [V]): softmax over the yes and no tokens only, yes summed."""
    row = logits.reshape(-1).float()
    picked = torch.softmax(row[list(tokens.yes + tokens.no)], dim=0)
    return float(picked[: len(tokens.yes)].sum())


@torch.inference_mode()
def check_answer(model, state: Prefilled, answer: list[int], tokens: CheckTokens) -> float:
    """The model's probability that the document states the answer it gave.

    Args:
        model: the model that answered, switched to a CAKE attention function.
        state: the prompt's state before decoding (its kept cache; a copy runs, `state` is unchanged).
        answer: the answer's generated token ids (without the end-of-turn token).
        tokens: `check_tokens` of the model's tokenizer.

    Returns:
        P(yes) in [0, 1].
    """
    device = state.logits.device
    ids = torch.tensor([[*answer, *tokens.suffix]], device=device)  # [1, q]
    return yes_probability(extend(model, state, ids).logits, tokens)


@dataclass(frozen=True)
class DoubtTokens:
    """The token ids of the abstention probability for one tokenizer."""

    lead: tuple[int, ...]  # ANSWER_LEAD, forced after the prompt
    abstain: tuple[int, ...]  # first token of each of ABSTAIN_OPENINGS, deduplicated


def doubt_tokens(tokenizer) -> DoubtTokens:
    """The abstention probability's tokens for a tokenizer.

    Raises:
        ValueError: ANSWER_LEAD encodes to no token.
    """
    lead = tuple(tokenizer.encode(ANSWER_LEAD, add_special_tokens=False))
    if not lead:
        raise ValueError(f"{ANSWER_LEAD!r} encodes to no token in this tokenizer")
    first = [tokenizer.encode(word, add_special_tokens=False)[0] for word in ABSTAIN_OPENINGS]
    return DoubtTokens(lead, tuple(dict.fromkeys(first)))


def abstain_probability(logits: torch.Tensor, tokens: DoubtTokens) -> float:
    """P(the next token opens an abstention) from next-token logits [1, V] (or [V]): the softmax over
    the whole vocabulary (float32), the abstention tokens summed."""
    probs = torch.softmax(logits.reshape(-1).float(), dim=0)
    return float(probs[list(tokens.abstain)].sum())


@torch.inference_mode()
def doubt_answer(model, state: Prefilled, answer: list[int], tokens: DoubtTokens) -> float:
    """The model's probability of abstaining at the start of its reply, on the kept cache.

    Args:
        model: the model that answered, switched to a CAKE attention function.
        state: the prompt's state before decoding (its kept cache; a copy runs, `state` is unchanged).
        answer: the answer's generated token ids; not read (the same hook as `check_answer`: the reading
            depends on the prompt and the kept cache only).
        tokens: `doubt_tokens` of the model's tokenizer.

    Returns:
        P(abstention opening | prompt, ANSWER_LEAD) in [0, 1].
    """
    del answer
    ids = torch.tensor([list(tokens.lead)], device=state.logits.device)  # [1, len(lead)]
    return abstain_probability(extend(model, state, ids).logits, tokens)
