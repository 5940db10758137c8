"""Next-token choice: greedy by default, temperature / top-p sampling with a seed (transformers'
warpers); n-gram blocking and loop detection over the answer's own tokens."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from cake_cli.engine.config import SamplingConfig


class AnswerNGrams:
    """Forbids repeating any n-gram of the answer: the generated tokens only, never the prompt (so an
    answer may quote the document). O(1) per step: a table from each (n-1)-gram of the answer to
    the tokens that followed it.

    Args:
        n: n-gram size in tokens (>= 1).
    """

    def __init__(self, n: int):
        self.n = n
        self.tokens: list[int] = []
        self.followers: dict[tuple[int, ...], set[int]] = {}

    def add(self, token: int) -> None:
        """Record a generated token."""
        self.tokens.append(token)
        if len(self.tokens) >= self.n:
            prefix = tuple(self.tokens[len(self.tokens) - self.n : -1])
            self.followers.setdefault(prefix, set()).add(token)

    def banned(self) -> list[int]:
        """Token ids that would repeat an n-gram of the answer if generated next."""
        if len(self.tokens) < self.n - 1:
            return []
        prefix = tuple(self.tokens[len(self.tokens) - self.n + 1 :]) if self.n > 1 else ()
        return sorted(self.followers.get(prefix, ()))


class Sampler:
    """Picks token ids from logits [1, V] and keeps the answer's n-gram table.

    `config` was validated when it was built (`SamplingConfig`).
    """

    def __init__(self, config: SamplingConfig):
        self.config = config
        self.generator = torch.Generator()
        if config.seed is not None:
            self.generator.manual_seed(config.seed)
        self.ngrams = AnswerNGrams(config.no_repeat_ngram_size) if config.no_repeat_ngram_size else None
        warpers = []
        if config.temperature > 0:
            warpers.append(TemperatureLogitsWarper(config.temperature))
            if config.top_p < 1:
                warpers.append(TopPLogitsWarper(config.top_p))
        self.warpers = LogitsProcessorList(warpers)

    def __call__(self, logits: torch.Tensor) -> int:
        """logits [1, V] for the next token -> token id (recorded for the n-gram blocking)."""
        scores = logits
        banned = self.ngrams.banned() if self.ngrams else []
        if banned:
            scores = logits.float().clone()
            scores[0, banned] = float("-inf")
        if self.config.temperature == 0:
            token = int(scores.argmax(dim=-1)[0])
        else:
            scores = self.warpers(None, scores.float())  # the warpers read the scores only
            probs = torch.softmax(scores, dim=-1).cpu()
            token = int(torch.multinomial(probs, 1, generator=self.generator)[0, 0])
        self.record(token)
        return token

    def record(self, token: int) -> None:
        """Add a token to the answer's history (also for tokens not chosen here, e.g. forced ones)."""
        if self.ngrams:
            self.ngrams.add(token)


REPEAT_UNIT_TOKENS = 8  # longest unit a degenerate loop is looked for in
REPEAT_MIN_TIMES = 4  # a unit of 2+ tokens must repeat this many times in a row
REPEAT_MIN_TOKENS = 8  # and the loop must span this many tokens (one token 8 times: "0 0 0 …", not "1000")


def repeated_tail(tokens: list[int]) -> int:
    """Whether the generated tokens end in a degenerate loop (e.g. "Ian M. M. M. M."): the number of
    tokens in the repeated tail, 0 if none. Looks at the answer only (never the prompt) and at most
    REPEAT_UNIT_TOKENS · REPEAT_MIN_TIMES tokens back, so it costs O(1) per step.

    Args:
        tokens: the token ids generated so far.

    Returns:
        Tokens covered by the shortest unit of 1..REPEAT_UNIT_TOKENS tokens repeated back to back
        at least max(REPEAT_MIN_TIMES, REPEAT_MIN_TOKENS / unit) times at the end; 0 when none.
    """
    for unit in range(1, REPEAT_UNIT_TOKENS + 1):
        span = unit * max(REPEAT_MIN_TIMES, -(-REPEAT_MIN_TOKENS // unit))
        if len(tokens) < span:
            return 0
        tail = tokens[-span:]
        if all(tail[i] == tail[i % unit] for i in range(unit, span)):
            return span
    return 0
