"""A slow, obviously-correct CAKE reference for tests: masking instead of evicting.

It keeps the full cache and hides evicted (layer, KV head, token) entries from attention with a
mask. Every quantity is computed from its definition with explicit loops (per head, per token),
independently of the fast path: window attention, H_l, V_l, the indicator with pooling, GQA
averaging (then, for the `chunk` indicator, the mean over each chunk of `config.chunk` positions),
one-shot top-k with the final budgets, and the `fixed` decode policy. Only the
integer budget rounding is shared with the engine (tested on its own in test_allocation).

What each attention module hands its attention function is honoured as written: `scaling`,
logit soft-capping (`softcap`: c · tanh(x / c)) and a sliding window (`sliding_window`: a query
at position p sees positions p - window + 1 .. p), applied by true position over the full cache.
Layers that slide while others do not are local: never scored, never evicted, no budget; the
budget is allocated over the other layers.
"""

from __future__ import annotations

import math

import torch
from transformers import AttentionInterface, DynamicCache

from cake_cli.engine import allocation
from cake_cli.engine.config import CakeConfig


def _softmax_row(logits: list[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(x - top) if x != float("-inf") else 0.0 for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def _variance(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    return sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)


def _pool(xs: list[float], kind: str, kernel: int) -> list[float]:
    half = kernel // 2
    out = []
    for j in range(len(xs)):
        window = [xs[i] for i in range(j - half, j + half + 1) if 0 <= i < len(xs)]
        out.append(sum(window) / kernel if kind == "avg" else max(window))
    return out


def chunk_means(scores: list[float], positions: list[int], chunk: int) -> list[float]:
    """Each score replaced by the mean of the scores whose position shares its `position // chunk`."""
    out = []
    for p in positions:
        members = [s for s, q in zip(scores, positions) if q // chunk == p // chunk]
        out.append(sum(members) / len(members))
    return out


def _top(scores: list[float], k: int) -> set[int]:
    """Indices of the k highest scores, ties to the lower index."""
    return set(sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:k])


class MaskedReference:
    """Full-cache generation with CAKE decisions applied as attention masks (batch 1, slow)."""

    def __init__(self, model, config: CakeConfig):
        self.model = model
        self.config = config
        cfg = model.config
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv = cfg.num_key_value_heads
        self.visible: list[list[list[bool]]] = []  # [L][H_kv][t]
        self.log_prefs: list[float] = []  # [L]
        self.indicators: list[list[list[float]] | None] = []  # [L][H_kv][n - w]
        self.stats: list[tuple[float, float] | None] = []  # [L] (H_l, V_l), None when n <= w
        self.capacity: list[int | None] = []
        self.windows: dict[int, int | None] = {}  # layer -> the sliding window its module passed
        self.softcaps: dict[int, float | None] = {}
        self.budgets: list[int | None] = []
        self.phase = "prefill"
        self.n = 0

    # -- definitions --------------------------------------------------------------------
    def _logit(self, q, k, softcap):
        x = float(torch.dot(q.double(), k.double())) * self.scale
        return softcap * math.tanh(x / softcap) if softcap is not None else x

    def _allowed(self, layer, pos, j):
        """Whether the query at position `pos` may see the key at position `j` (causal, window)."""
        window = self.windows.get(layer)
        return j <= pos and (window is None or j > pos - window)

    def _probs(self, layer, query, key, layer_visible, head):
        """Probabilities of each query row of one query head over the visible keys (float64)."""
        group = self.num_heads // self.num_kv
        kv = head // group
        q_len, k_len = query.shape[2], key.shape[2]
        rows = []
        for i in range(q_len):
            pos = k_len - q_len + i
            logits = []
            for j in range(k_len):
                ok = self._allowed(layer, pos, j) and layer_visible[kv][j]
                logits.append(self._logit(query[0, head, i], key[0, kv, j], self.softcaps[layer]) if ok else -math.inf)
            rows.append(_softmax_row(logits))
        return rows

    def local_layers(self) -> set[int]:
        """Layers that slide while some other layer does not (their window is native, no budget)."""
        sliding = {layer for layer, w in self.windows.items() if w is not None}
        return sliding if len(sliding) < self.num_layers else set()

    def _prefill_layer(self, layer, query, key):
        cfg, w, n = self.config, self.config.window, key.shape[2]
        if n <= w:
            return
        group = self.num_heads // self.num_kv
        h_l = v_l = 0.0
        per_head = []
        r = min(cfg.score_rows, w) if cfg.score_rows > 0 else w  # the window's last r rows score (score_rows)
        for head in range(self.num_heads):
            rows = self._probs(layer, query[:, :, -r:], key, self.visible[layer], head)  # [r][n]
            cols = [[rows[i][j] for i in range(r)] for j in range(n - w)]
            h_l -= sum(a * math.log(a) for col in cols for a in col if a > 0)
            v_l += sum(_variance(col) for col in cols)
            score = [sum(col) / r + cfg.gamma * _variance(col) for col in cols]
            per_head.append(_pool(score, cfg.pool_kind, cfg.pool_kernel))
        self.stats[layer] = (h_l, v_l)
        self.log_prefs[layer] = (
            math.log(h_l) / cfg.tau1 + math.log(v_l) / cfg.tau2 if h_l > 0 and v_l > 0 else float("-inf")
        )
        self.indicators[layer] = [
            self._chunked([sum(per_head[kv * group + r][j] for r in range(group)) / group for j in range(n - w)],
                          list(range(n - w)))
            for kv in range(self.num_kv)
        ]  # fmt: skip

    def _finish_prefill(self, n):
        cfg, w = self.config, self.config.window
        local = self.local_layers()
        scored = [layer for layer in range(self.num_layers) if layer not in local]
        if n <= cfg.budget:
            self.capacity = [None if layer in local else cfg.budget for layer in range(self.num_layers)]
            return
        final = allocation.cascade([self.log_prefs[i] for i in scored], cfg.evictable_total(len(scored)), n - w)[-1]
        self.budgets = [None] * self.num_layers
        shared = None
        if cfg.rank_layer is not None:  # the layers below R rank by R's heads' normalised scores, averaged
            rows = [[x / sum(row) for x in row] for row in self.indicators[cfg.rank_layer]]
            shared = [sum(col) / len(rows) for col in zip(*rows)]
        for layer, budget in zip(scored, final):
            self.budgets[layer] = budget
            for kv in range(self.num_kv):
                below = shared is not None and layer < cfg.rank_layer
                keep = _top(shared if below else self.indicators[layer][kv], budget)
                for j in range(n - w):
                    self.visible[layer][kv][j] = j in keep
        self.capacity = [None if b is None else b + w for b in self.budgets]

    def _decode_layer(self, layer, query, key):
        cfg = self.config
        vis = self.visible[layer]
        count = sum(vis[0])
        cap = self.capacity[layer]
        if cfg.decode_policy != "fixed" or cap is None or count <= cap:
            return
        w = min(cfg.window, cap)
        group = self.num_heads // self.num_kv
        for kv in range(self.num_kv):
            held = [j for j, v in enumerate(vis[kv]) if v]  # visible entries in position order
            candidates = held[: len(held) - w]
            pooled = []
            for r in range(group):
                rows = self._probs(layer, query, key, vis, kv * group + r)
                mean = [sum(rows[i][j] for i in range(len(rows))) / len(rows) for j in candidates]
                pooled.append(_pool(mean, cfg.pool_kind, cfg.pool_kernel))
            scores = self._chunked([sum(p[c] for p in pooled) / group for c in range(len(candidates))], candidates)
            keep = _top(scores, cap - w)
            for c, j in enumerate(candidates):
                vis[kv][j] = c in keep

    def _chunked(self, scores: list[float], positions: list[int]) -> list[float]:
        """The `chunk` indicator's chunk means over the scores of one KV head; other indicators unchanged."""
        return chunk_means(scores, positions, self.config.chunk) if self.config.indicator == "chunk" else scores

    # -- attention function --------------------------------------------------------------
    def attention(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """Masked attention for one layer, then the reference's eviction decision for it."""
        layer = module.layer_idx
        self.scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        self.windows[layer] = kwargs.get("sliding_window")
        softcap = self.softcaps[layer] = kwargs.get("softcap")
        vis = self.visible[layer]
        k_len, q_len = key.shape[2], query.shape[2]
        for kv in range(self.num_kv):
            vis[kv].extend([True] * (k_len - len(vis[kv])))
        group = self.num_heads // self.num_kv
        mask = torch.tensor([[vis[h // group][j] for j in range(k_len)] for h in range(self.num_heads)])
        rule = torch.tensor([[self._allowed(layer, k_len - q_len + i, j) for j in range(k_len)] for i in range(q_len)])
        allowed = mask[:, None, :] & rule[None]  # [H, q, k]
        k_full = key[0].repeat_interleave(group, dim=0).double()  # [H, k, d]
        v_full = value[0].repeat_interleave(group, dim=0).double()
        logits = query[0].double() @ k_full.transpose(1, 2) * self.scale
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
        out = (probs @ v_full).to(query.dtype).transpose(0, 1).unsqueeze(0)  # [1, q, H, d]
        if self.phase == "prefill":
            self._prefill_layer(layer, query, key)  # a local layer is scored too, then ignored
        else:
            self._decode_layer(layer, query, key)
        return out, None

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, tokens: list[int]) -> list[torch.Tensor]:
        """Prefill `input_ids` [1, n], then feed `tokens` one by one.

        Returns:
            The [1, V] float32 next-token logits after prefill and after each fed token but the last.
        """
        AttentionInterface.register("cake_reference", self.attention)
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("cake_reference")
        try:
            n = input_ids.shape[1]
            self.visible = [[[] for _ in range(self.num_kv)] for _ in range(self.num_layers)]
            self.stats = [None] * self.num_layers
            self.log_prefs = [float("-inf")] * self.num_layers
            self.indicators = [None] * self.num_layers
            cache = DynamicCache()  # full layers (no config: a sliding layer would drop old tokens)
            out = self.model(input_ids=input_ids, position_ids=torch.arange(n)[None], cache=cache, use_cache=True)
            self._finish_prefill(n)
            self.phase = "decode"
            logits = [out.logits[:, -1].float()]
            for t, token in enumerate(tokens[:-1]):
                out = self.model(
                    input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[n + t]]), cache=cache, use_cache=True
                )
                logits.append(out.logits[:, -1].float())
            return logits
        finally:
            self.model.set_attn_implementation(previous)
