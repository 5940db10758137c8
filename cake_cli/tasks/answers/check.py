"""The check pass: after answering, the model is asked on its own kept cache whether the document states
its answer (`--abstain checked`, issue 45's "a check pass on the kept cache").

The conversation goes on where the answer ended: the answer's tokens, the end of the assistant's turn,
a user turn asking `CHECK_QUESTION` and the assistant header (the tokenizer's own chat template writes
them) run as one forward over a copy of the prompt's kept cache, as it was before the answer was decoded
(`engine.continuation.extend`: every continuation token held, nothing evicted or changed). The next-token
logits of "yes" and "no" give the model's probability that the document states its answer: the softmax
over the first token of each spelling (yes, Yes, no, No), the yes ones summed. No token is generated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cake_cli.engine.continuation import extend
from cake_cli.engine.generate import Prefilled

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
