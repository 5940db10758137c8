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
