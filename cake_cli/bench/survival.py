"""Fact survival (`cake bench quality --diagnose survival`): per layer, how many of each planted
fact's tokens a method kept after its prefill eviction, read from the kept indices.

A method that loses a fact loses it in one of two ways: its allocation gave the layers too few
slots (the fact's tokens are gone everywhere budgets are small), or its indicator ranked them
low (gone in layers that had room). The per-layer survival of each fact, next to the layer
budgets, tells the two apart. Positions are prompt token indices; each layer keeps, per KV head,
the positions `CakeLayer.positions` [H_kv, k] holds.
"""

from __future__ import annotations

import torch


def fact_token_spans(tokenizer, prompt_ids: list[int], document: str, offsets, facts) -> list[tuple[int, int] | None]:
    """The prompt token span [start, end) of each fact's inner tokens, or None where not found.

    The document is tokenized alone with character offsets; a fact's tokens there, without the
    first and last (which may merge with their neighbours differently in the prompt), are then
    searched for in `prompt_ids`, the occurrence nearest after the document's start kept.

    Args:
        prompt_ids: the chat-rendered prompt, token ids.
        document: the case's document; offsets: each fact's character offset in it; facts: their text.

    Raises:
        ValueError: `offsets` and `facts` differ in length.
    """
    if len(offsets) != len(facts):
        raise ValueError(f"{len(offsets)} offsets for {len(facts)} facts")
    enc = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)
    doc_ids, spans = enc["input_ids"], enc["offset_mapping"]
    out: list[tuple[int, int] | None] = []
    for offset, fact in zip(offsets, facts):
        end_char = offset + len(fact)
        inside = [i for i, (a, b) in enumerate(spans) if a < end_char and b > offset]
        inner = doc_ids[inside[0] + 1 : inside[-1]] if len(inside) > 2 else [doc_ids[i] for i in inside]
        out.append(_find(prompt_ids, inner, inside[0] if inside else 0))
    return out


def _find(ids: list[int], pattern: list[int], near: int) -> tuple[int, int] | None:
    """[start, end) of the occurrence of `pattern` in `ids` nearest to `near` (None: none)."""
    if not pattern:
        return None
    n = len(pattern)
    hits = [i for i in range(len(ids) - n + 1) if ids[i] == pattern[0] and ids[i : i + n] == pattern]
    if not hits:
        return None
    start = min(hits, key=lambda i: abs(i - near))
    return start, start + n


def fact_survival(layer_positions: list[torch.Tensor | None], spans: list[tuple[int, int] | None]) -> list[list]:
    """Per layer, per fact: the share of the fact's token positions that the layer kept, averaged
    over its KV heads (a fraction in [0, 1]; None for a fact whose span was not found or a layer
    without positions).

    Args:
        layer_positions: per layer, the kept positions [H_kv, k] (int64, any order).
        spans: per fact, its prompt token span [start, end) (`fact_token_spans`).

    Returns:
        [L][F] fractions.
    """
    out = []
    for positions in layer_positions:
        row = []
        for span in spans:
            if span is None or positions is None:
                row.append(None)
                continue
            wanted = torch.arange(span[0], span[1], device=positions.device)  # [s]
            hit = (positions.unsqueeze(-1) == wanted).any(dim=1)  # [H_kv, s]: the head kept that position
            row.append(round(float(hit.float().mean()), 4))
        out.append(row)
    return out


def cache_positions(cache) -> list[torch.Tensor | None]:
    """The kept positions [H_kv, k] of every layer of a `CakeCache` (None for an empty layer)."""
    return [layer.positions for layer in cache.layers]


def survival_summary(rows: list[dict]) -> dict:
    """(method, budget) -> (mean fact-token survival over layers, facts and cases; share of facts
    kept whole (every token, every head) in every layer), from rows carrying `survival` [L][F].
    The full cache keeps everything (1.0, 1.0) and is left out."""
    acc: dict = {}
    for r in rows:
        grid = r.get("survival")
        if not grid or r["budget"] is None:
            continue
        facts = len(grid[0])
        for f in range(facts):
            column = [layer[f] for layer in grid if layer[f] is not None]
            if not column:
                continue
            mean, whole = sum(column) / len(column), float(all(v >= 1.0 for v in column))
            acc.setdefault((r["method"], r["budget"]), []).append((mean, whole))
    return {k: (sum(m for m, _ in v) / len(v), sum(w for _, w in v) / len(v)) for k, v in acc.items()}


def survival_by_layer(rows: list[dict], method: str, budget: int) -> list[float]:
    """Mean survival of the facts' tokens at each layer for one (method, budget), over cases and facts."""
    sums: list[float] = []
    counts: list[int] = []
    for r in rows:
        grid = r.get("survival")
        if not grid or r["method"] != method or r["budget"] != budget:
            continue
        if not sums:
            sums, counts = [0.0] * len(grid), [0] * len(grid)
        for i, layer in enumerate(grid[: len(sums)]):
            for v in layer:
                if v is not None:
                    sums[i] += v
                    counts[i] += 1
    return [s / c if c else float("nan") for s, c in zip(sums, counts)]
