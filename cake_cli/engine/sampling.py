"""Next-token choice: greedy by default, temperature / top-p sampling with a seed (transformers' warpers)."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from cake_cli.engine.config import SamplingConfig


class Sampler:
    """Picks token ids from logits [1, V].

    `config` was validated when it was built (`SamplingConfig`).
    """

    def __init__(self, config: SamplingConfig):
        self.config = config
        self.generator = torch.Generator()
        if config.seed is not None:
            self.generator.manual_seed(config.seed)
        self.processors = LogitsProcessorList(
            [NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size)] if config.no_repeat_ngram_size else []
        )
        warpers = []
        if config.temperature > 0:
            warpers.append(TemperatureLogitsWarper(config.temperature))
            if config.top_p < 1:
                warpers.append(TopPLogitsWarper(config.top_p))
        self.warpers = LogitsProcessorList(warpers)

    def __call__(self, input_ids: torch.Tensor, logits: torch.Tensor) -> int:
        """input_ids [1, t] so far, logits [1, V] for the next token -> token id."""
        scores = self.processors(input_ids, logits.float()) if self.processors else logits
        if self.config.temperature == 0:
            return int(scores.argmax(dim=-1)[0])
        scores = self.warpers(input_ids, scores.float())
        probs = torch.softmax(scores, dim=-1).cpu()
        return int(torch.multinomial(probs, 1, generator=self.generator)[0, 0])


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
