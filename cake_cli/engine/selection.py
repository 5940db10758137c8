"""Question-aware token selection before prefill (`cake qa --prefill select`), after GemFilter
(Shi et al. 2024, "Discovering the Gems in Early Layers: Accelerating Long-Context LLMs with 1000x
Input Token Reduction", arXiv:2409.17422).

When the question is known, an early layer's attention from the prompt's last tokens (which hold the
question and the chat template's closing) already points at the passages the answer needs. So:

1. run layers 0..`layer` over the whole prompt and stop there (`selection_scores`: the forward is cut
   off right after that layer attends; nothing after it runs);
2. score every prompt token by the attention the last `queries` tokens pay it at that layer:
   softmax probabilities in float32 (`window.window_attention`, each query head over its own KV
   head's keys), summed over every query head and every one of those queries;
3. keep the `tokens` best-scored document tokens, plus always the first `sinks` tokens (attention
   sinks) and every token from `protect_from` on (the instruction, the question, the chat template's
   closing), in their original order (`select_tokens`);
4. the caller runs the whole model over only the kept tokens, with CAKE's budgets as usual.

Positions are re-indexed, as GemFilter does: the kept tokens are a new, shorter prompt at positions
0..m-1 and the answer continues at m (the model has never seen a prompt with gaps in its positions;
the engine's caches and decode policies then need nothing new). Where we depart from GemFilter: it
ranks by the raw query-key products of the last token alone, summed over heads; we sum softmax
probabilities over the last `queries` tokens (CAKE's observation window), so each head and each
query contributes a distribution of the same total mass, and a question longer than one token is read whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from cake_cli.engine.cache import CakeCache
from cake_cli.engine.continuation import rewound
from cake_cli.engine.families import UnsupportedModelError, attention_layout
from cake_cli.engine.window import window_attention

GEMFILTER_LAYER = (13, 32)  # GemFilter's layer for Llama 3.1 8B: index 13 of 32 layers, scaled to other depths
DEFAULT_QUERIES = 32  # last prompt tokens whose attention scores the rest (CAKE's default window)
DEFAULT_SINKS = 4  # first prompt tokens always kept


def default_layer(num_layers: int) -> int:
    """GemFilter's depth (`GEMFILTER_LAYER`) for a model of `num_layers` layers: 0-based index, >= 0."""
    return max(0, GEMFILTER_LAYER[0] * num_layers // GEMFILTER_LAYER[1])


@dataclass(frozen=True)
class Selection:
    """Which prompt tokens the full model reads. `kept`: original indices, ascending; seconds: the
    cut-off forward and the ranking."""

    layer: int  # 0-based index of the layer whose attention chose them (layers 0..layer ran)
    kept: tuple[int, ...]
    prompt_tokens: int  # n, before selection
    seconds: float

    def ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[1, m] the kept tokens of `input_ids` [1, n], in order (positions re-indexed 0..m-1 by whoever runs them)."""
        return input_ids[:, list(self.kept)]


class _Reached(Exception):
    """Raised by `_ScoreAt` once its layer has attended: ends the forward there."""


class _ScoreAt:
    """The cache's eviction hook for one cut-off forward: at layer `layer` it takes the rotated
    queries [1, H, n, d] and keys [1, H_kv, n, d], keeps the attention scores and stops the forward."""

    def __init__(self, layer: int, queries: int):
        self.layer, self.queries = layer, queries
        self.scores: torch.Tensor | None = None

    def after_attention(self, cache, layer_idx, query, key, scaling, probs=None, softcap=None) -> None:
        if layer_idx != self.layer:
            return
        w = min(self.queries, query.shape[2])
        attention = window_attention(query[0, :, -w:], key[0], scaling, softcap)  # [H, w, n] float32
        self.scores = attention.sum(dim=(0, 1))  # [n]
        raise _Reached


def check_selectable(model) -> None:
    """Refuse a model the selection cannot run on exactly.

    Raises:
        UnsupportedModelError: a family with local (sliding-window) layers: their caches keep only
            a window, which a cut-off forward and a re-indexed prompt would not respect.
    """
    layout = attention_layout(model.config)
    if any(w is not None for w in layout.windows):
        raise UnsupportedModelError(
            "--prefill select runs on models whose every layer attends globally; this one has sliding-window layers"
        )


@torch.inference_mode()
def selection_scores(
    model, input_ids: torch.Tensor, layer: int, queries: int = DEFAULT_QUERIES, prefix: CakeCache | None = None
) -> torch.Tensor:
    """Run layers 0..`layer` over `input_ids` and score each token by the attention of the last `queries`.

    Args:
        model: a causal LM switched to a CAKE attention function (`attention.use_cake_attention`).
        input_ids: [1, n] prompt ids on the model's input device, n >= 2.
        layer: 0-based layer index whose attention ranks the tokens.
        queries: last tokens whose attention counts (at most n).
        prefix: optional full cache of the prompt's first p < n tokens (`engine.replay.prefix_cache`, left
            unchanged): only the rest runs, from the first of the last `queries` positions when the rest
            is shorter (`continuation.rewound`), so several questions on one document pay the
            document's cut-off forward once. The prefix's keys do not depend on what follows them, so the
            scores equal those of the whole prompt (`tests/engine/test_selection.py`).

    Returns:
        [n] float32: sum over query heads h and the last min(queries, n) query rows i of A_h[i, j],
        the softmax attention of layer `layer` (causal; query head h reads KV head h // g).

    Raises:
        ValueError: a layer outside 0..L-1, queries < 1, a prompt not of shape [1, n >= 2], or a prefix
            not shorter than the prompt.
        UnsupportedModelError: see `check_selectable`.
    """
    num_layers = model.config.num_hidden_layers
    if not 0 <= layer < num_layers:
        raise ValueError(f"the selection layer must be within 0..{num_layers - 1}, got {layer}")
    if queries < 1:
        raise ValueError(f"queries must be >= 1, got {queries}")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 2:
        raise ValueError(f"expected input_ids of shape [1, n >= 2], got {tuple(input_ids.shape)}")
    check_selectable(model)
    hook = _ScoreAt(layer, queries)
    n, start = input_ids.shape[1], 0
    if prefix is None:
        cache = CakeCache(num_layers, policy=hook)
    else:
        p = prefix.layers[0].seen
        if p >= n:
            raise ValueError(f"a prefix of {p} tokens is not shorter than the {n}-token prompt")
        cache, start = rewound(prefix, n, queries)
        cache.policy = hook
    positions = torch.arange(start, n, device=input_ids.device).unsqueeze(0)  # [1, n - start]
    ids = input_ids[:, start:]
    try:
        model(input_ids=ids, position_ids=positions, cache=cache, cake=cache, use_cache=True, logits_to_keep=1)
    except _Reached:
        pass
    if hook.scores is None:  # a model whose forward never reached the hook
        raise UnsupportedModelError(f"layer {layer} never reported its attention: the selection cannot run")
    return hook.scores


def top_tokens(scores: torch.Tensor, protect_from: int, tokens: int, sinks: int = DEFAULT_SINKS) -> tuple[int, ...]:
    """Indices kept, ascending: 0..sinks-1, the `tokens` highest `scores` among sinks..protect_from-1
    (ties to the earlier index), and protect_from..n-1.

    Args:
        scores: [n] token scores (`selection_scores`).
        protect_from: first index always kept (the prompt after the document), 0..n.
        tokens: document tokens to keep (>= 0; all of them when at least their number).
        sinks: first tokens always kept (>= 0).

    Raises:
        ValueError: protect_from outside 0..n, or a negative tokens / sinks.
    """
    n = scores.shape[0]
    if not 0 <= protect_from <= n or tokens < 0 or sinks < 0:
        raise ValueError(f"bad selection: protect_from {protect_from} of {n}, tokens {tokens}, sinks {sinks}")
    start = min(sinks, protect_from)
    candidates = scores[start:protect_from]  # [c] the document tokens that may be dropped
    if tokens >= candidates.shape[0]:
        return tuple(range(n))
    # stable descending sort: equal scores keep the earlier token
    order = torch.sort(candidates.float(), descending=True, stable=True).indices[:tokens] + start
    chosen = sorted(order.tolist())
    return (*range(start), *chosen, *range(protect_from, n))


def select_tokens(
    model,
    input_ids: torch.Tensor,
    *,
    protect_from: int,
    tokens: int,
    layer: int | None = None,
    queries: int = DEFAULT_QUERIES,
    sinks: int = DEFAULT_SINKS,
    prefix: CakeCache | None = None,
) -> Selection:
    """GemFilter's selection (module docstring): `selection_scores` at `layer` (default
    `default_layer`; `prefix` as there), then `top_tokens` (every token when the document has at most
    `tokens`; the cut-off forward still runs, so such a run pays for it and tests see the whole path).

    Raises:
        ValueError, UnsupportedModelError: see `selection_scores` and `top_tokens`.
    """
    n = input_ids.shape[1]
    layer = default_layer(model.config.num_hidden_layers) if layer is None else layer
    start = time.perf_counter()
    scores = selection_scores(model, input_ids, layer, queries, prefix)
    kept = top_tokens(scores, protect_from, tokens, sinks)
    return Selection(layer, kept, n, time.perf_counter() - start)
