"""Next-token choice: greedy by default, temperature / top-p sampling with a seed (transformers' warpers)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 = greedy; otherwise sample from softmax(logits / temperature) within top-p."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


class Sampler:
    """Picks token ids from logits [1, V].

    Raises:
        ValueError: temperature < 0 or top_p outside (0, 1].
    """

    def __init__(self, config: SamplingConfig):
        if config.temperature < 0 or not 0 < config.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top-p in (0, 1]")
        self.config = config
        self.generator = torch.Generator()
        if config.seed is not None:
            self.generator.manual_seed(config.seed)
        warpers = []
        if config.temperature > 0:
            warpers.append(TemperatureLogitsWarper(config.temperature))
            if config.top_p < 1:
                warpers.append(TopPLogitsWarper(config.top_p))
        self.warpers = LogitsProcessorList(warpers)

    def __call__(self, input_ids: torch.Tensor, logits: torch.Tensor) -> int:
        """input_ids [1, t] so far, logits [1, V] for the next token -> token id."""
        if self.config.temperature == 0:
            return int(logits.argmax(dim=-1)[0])
        scores = self.warpers(input_ids, logits.float())
        probs = torch.softmax(scores, dim=-1).cpu()
        return int(torch.multinomial(probs, 1, generator=self.generator)[0, 0])
