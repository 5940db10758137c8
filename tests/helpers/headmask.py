"""A slow masking reference for caches whose KV heads keep different tokens (`engine.headlengths`).

The model keeps its full cache (a plain DynamicCache); after the prefix, every (layer, KV head, position)
the engine evicted is hidden from attention by a mask, per KV head, repeated to its query heads. The
continuation tokens and the decoded ones are visible. Under the `fixed` decode policy each KV head of a
scored layer then evicts, after each decoded token, the visible entry with the lowest CAKE score (the new
query's attention, averaged over the g query heads after pooling along that head's visible entries in
position order), never the most recent w, so every head keeps its own count. Everything is float64 and
explicit loops; nothing is shared with the engine.
"""

from __future__ import annotations

import math

import torch
from transformers import AttentionInterface, DynamicCache

from tests.helpers.reference import _pool  # the reference pooling (float lists), shared by both slow references


class HeadMaskReference:
    """Full cache + per-KV-head masks of a given eviction (batch 1).

    Args:
        kept: per layer, per KV head, the set of prefix positions kept; None for a layer that is not
            evicted (a local layer: its native sliding window applies by position).
        prefix_len: n.
        window, policy, pool: the decode policy's w, "fixed" or "grow", (kind, kernel).
    """

    def __init__(self, model, kept, prefix_len: int, window: int, policy: str, pool=("avg", 5)):
        cfg = model.config
        self.model, self.kept, self.n, self.w, self.policy, self.pool = model, kept, prefix_len, window, policy, pool
        self.num_heads, self.num_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.visible = [[[] for _ in range(self.num_kv)] for _ in range(cfg.num_hidden_layers)]
        self.capacity: list[list[int] | None] = [None] * cfg.num_hidden_layers
        self.phase = "prefix"

    def attention(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """Masked attention of one layer (float64), then the reference's decode eviction for it."""
        layer, group = module.layer_idx, self.num_heads // self.num_kv
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
        vis = self.visible[layer]
        k_len, q_len = key.shape[2], query.shape[2]
        for row in vis:
            row.extend([True] * (k_len - len(row)))
        allowed = torch.zeros(self.num_heads, q_len, k_len, dtype=torch.bool)
        for h in range(self.num_heads):
            for i in range(q_len):
                pos = k_len - q_len + i
                for j in range(k_len):
                    allowed[h, i, j] = vis[h // group][j] and j <= pos and (window is None or j > pos - window)
        k_full = key[0].repeat_interleave(group, dim=0).double()  # [H, k, d]
        v_full = value[0].repeat_interleave(group, dim=0).double()
        logits = query[0].double() @ k_full.transpose(1, 2) * scale  # [H, q, k]
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        probs = torch.softmax(logits.masked_fill(~allowed, -math.inf), dim=-1)
        if self.phase == "decode" and self.policy == "fixed" and self.kept[layer] is not None:
            self._evict(layer, probs)
        return (probs @ v_full).to(query.dtype).transpose(0, 1).unsqueeze(0), None  # [1, q, H, d]

    def _evict(self, layer: int, probs: torch.Tensor) -> None:
        group, vis = self.num_heads // self.num_kv, self.visible[layer]
        for kv in range(self.num_kv):
            held = [j for j, v in enumerate(vis[kv]) if v]  # position order
            cap = self.capacity[layer][kv]
            if len(held) <= cap:
                continue
            w = min(self.w, cap)
            candidates = held[: len(held) - w]
            pooled = [_pool([float(probs[kv * group + r, 0, j]) for j in candidates], *self.pool) for r in range(group)]
            scores = [sum(p[c] for p in pooled) / group for c in range(len(candidates))]
            keep = set(sorted(range(len(candidates)), key=lambda c: (-scores[c], c))[: cap - w])
            for c, j in enumerate(candidates):
                vis[kv][j] = c in keep

    @torch.inference_mode()
    def run(self, prefix: torch.Tensor, continuation: torch.Tensor, tokens: list[int]) -> list[torch.Tensor]:
        """Prefix [1, n] (full attention), continuation [1, q] (masked), then `tokens` fed one by one.

        Returns:
            [1, V] float32 logits after the continuation and after each fed token but the last.
        """
        AttentionInterface.register("cake_headmask", self.attention)
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("cake_headmask")
        try:
            cache, n, q = DynamicCache(), self.n, continuation.shape[1]
            self.model(input_ids=prefix, position_ids=torch.arange(n)[None], cache=cache, use_cache=True)
            for layer, heads in enumerate(self.kept):
                if heads is not None:
                    self.visible[layer] = [[j in heads[kv] for j in range(n)] for kv in range(self.num_kv)]
            out = self.model(
                input_ids=continuation, position_ids=torch.arange(n, n + q)[None], cache=cache, use_cache=True
            )
            self.capacity = [None if h is None else [len(s) + q for s in h] for h in self.kept]
            self.phase = "decode"
            logits = [out.logits[:, -1].float()]
            for t, token in enumerate(tokens[:-1]):
                out = self.model(
                    input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[n + q + t]]), cache=cache,
                    use_cache=True,
                )  # fmt: skip
                logits.append(out.logits[:, -1].float())
            return logits
        finally:
            self.model.set_attn_implementation(previous)
