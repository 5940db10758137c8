"""Question-agnostic scoring by context reconstruction (KVzip, Kim et al. 2025, arXiv 2505.23416 Sec. 3),
with CAKE's layer preference and budgets computed from the same attention (docs/method.md §Reconstruction scoring).

No question is known when a document is compressed for later questions, and an observation window at
the document's end scores what the end attends to, not what later questions need. KVzip's proxy: ask
the model to repeat the document, teacher-forced, over the cached prefix. A cached pair that the
reconstruction attends to strongly is needed to reproduce the document, hence (empirically) to
answer questions about it.

Here, after the prefix of n tokens is prefilled and kept whole:

1. **Reconstruction forward, in chunks.** The target (the document's tokens) is cut into chunks of
   at most m tokens; chunk k runs as one forward of ``repeat prompt + chunk_k`` at the true positions
   n .. n + p + |chunk_k| - 1 over the whole prefix cache. Its own keys are causal among themselves
   and dropped after the forward (each layer is restored as soon as it has attended), so every chunk
   sees the prefix and the repeat prompt only, and memory stays bounded: the cache, one layer's
   chunk keys, and row blocks of log-probabilities of at most `MAX_BLOCK_ELEMENTS` floats; never n × n.
2. **Rows.** R = the p repeat-prompt rows (counted once, from chunk 0: they are the same in every
   chunk) and every target row. A_l ∈ R^{H × |R| × n} are their float32 softmax probabilities over
   all keys the row attends to (the prefix and the chunk's own keys, the model's own attention,
   `scaling` and soft-capping honoured), restricted to the n prefix columns and **not** renormalised.
   They are computed as log-probabilities (logits minus the row's logsumexp), so the max of step 3
   needs no exponential of the whole block.
3. **Score (KVzip).** For KV head k and cached pair j: S[k, j] = max over the rows i in R and the g
   query heads h of that KV head's group of A_l[h, i, j] (KVzip's max over queries and the GQA group),
   = exp of the max of log A.
4. **Preference (CAKE, paper Eqs. 4-6)** over the statistic rows R_s ⊆ R (every s-th row of R, s =
   ⌈|R| / STAT_ROWS⌉, so at most 512; CAKE's own statistics use the w = 32 window rows, and an even row
   sample scales H_l of every layer by about the same factor, which Eq. 7's shares P_l / Σ P do not see) and the
   evictable columns j < n - w (A_l^ev = A_l[:, R_s, :n - w]): H_l = -Σ_h Σ_{i∈R_s} Σ_j A^ev log A^ev
   (Eq. 4's row entropy), V_l = Σ_h Σ_j Var_{i∈R_s} A^ev[h, i, j] (Eq. 5, unbiased over the |R_s|
   rows), P_l = H_l^(1/τ1) · V_l^(1/τ2) (Eq. 6). CAKE defines them over the w observation-window rows;
   here the rows are the reconstruction's.
5. **Budgets and eviction.** B_total = (B - w) · L_global is shared by the allocation (`cake`: Eq. 7
   one-shot with caps and Prop. 1 rounding, every layer being scored before any is cut; `uniform`,
   `pyramid`: their fixed shares), and each global layer keeps, per KV head, its top-B_l pairs by S
   plus the prefix's last w tokens (the observation window of CAKE's budget semantics, kept so the
   question that follows sees the end of the document block). Local (sliding) layers are not scored
   and keep their native window. Nothing is evicted when n <= B.

Where this follows KVzip and where it does not: the max over reconstruction queries and the GQA group
and the teacher-forced repeat prompt are KVzip's; chunks each repeat the prompt and see only the prefix
(their earlier chunks are not cached), which is our reading of its chunked scoring. KVzip shares one
ranking over all layers and heads (`--allocation global`, here too: `engine.headlengths`, layers and KV
heads get unequal shares) or a uniform split; we add CAKE's allocation over the reconstruction
statistics, keep CAKE's window of w tokens, and do no pooling of S. Its head-level (context-
independent) variant is not implemented.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from cake_cli.engine import allocation
from cake_cli.engine.cache import CakeCache
from cake_cli.engine.cascade import LayerStats
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.continuation import SavedCascade
from cake_cli.engine.families import attention_layout
from cake_cli.engine.generate import Prefilled, forward_step, prefill, sync_device
from cake_cli.engine.headlengths import pack_heads, ranked_selection
from cake_cli.engine.indicators import top_k_sorted
from cake_cli.engine.preference import log_preference

DEFAULT_CHUNK = 2048  # target tokens per reconstruction forward
MAX_BLOCK_ELEMENTS = 1 << 22  # float32 log-probabilities computed at once per layer (16 MiB)
STAT_ROWS = 512  # at most this many rows of R feed H_l and V_l (step 4): CAKE itself uses w = 32


@dataclass
class LayerAccumulator:
    """Running reductions of one global layer over the reconstruction rows seen so far.

    Attributes:
        log_score: [H_kv, n] float32, log S = max over rows and the GQA group of log A (step 3).
        entropy: Σ -A log A over heads, statistic rows and evictable columns (float64 scalar, nats).
        col_sum: [H, n - w] float64 Σ_i A^ev[h, i, j] over the statistic rows.
        sq_sum: Σ_h Σ_i Σ_j A^ev² over the statistic rows (float64 scalar).
        rows: rows of R seen so far; stat_rows: how many of them were statistic rows.
    """

    log_score: torch.Tensor
    entropy: float = 0.0
    col_sum: torch.Tensor | None = None
    sq_sum: float = 0.0
    rows: int = 0
    stat_rows: int = 0

    def stats(self, tau1: float, tau2: float) -> LayerStats | None:
        """H_l, V_l and log P_l over the statistic rows seen (module docstring, step 4); None without rows or
        columns."""
        if self.stat_rows == 0 or self.col_sum is None or self.col_sum.shape[-1] == 0:
            return None
        r, h = self.stat_rows, self.entropy
        v = 0.0 if r < 2 else (self.sq_sum - float((self.col_sum**2).sum()) / r) / (r - 1)
        v = max(v, 0.0)  # Σ x² - (Σ x)² / R >= 0; rounding can leave -1e-17
        return LayerStats(h, v, log_preference(h, v, tau1, tau2))


def stat_stride(rows: int) -> int:
    """s: every s-th row of R (0, s, 2s, ...) is a statistic row, so that at most `STAT_ROWS` are (step 4)."""
    return max(1, -(-rows // STAT_ROWS))


class ReconstructionScorer:
    """The `EvictionPolicy` of one reconstruction forward: after each global layer attends, fold its
    rows' probabilities over the prefix into that layer's `LayerAccumulator`; after every layer
    attends, restore it to the prefix (the chunk's keys are dropped).

    Args:
        prefix_len: n, tokens in the prefix (the cache's state before the chunk).
        window: w, the prefix's last w tokens are not evictable (statistics skip their columns).
        windows: [L] native sliding windows (None: a global layer, scored).
        stride: s, every s-th row of R is a statistic row (`stat_stride`).
    """

    def __init__(self, prefix_len: int, window: int, windows, stride: int = 1):
        self.n, self.w, self.stride = prefix_len, window, stride
        self.windows = list(windows)
        self.layers: dict[int, LayerAccumulator] = {}
        self.skip = 0  # rows of this chunk left out of R (the repeat prompt after chunk 0)
        self.saved: list[tuple] = []

    def begin_chunk(self, cache: CakeCache, skip: int) -> None:
        """Remember every layer's tensors before a chunk's forward (restored after each attends).

        Raises:
            ValueError: the cache is not a prefix of n tokens with no released slot.
        """
        if any(layer.free is not None or layer.seen != self.n for layer in cache.layers):
            raise ValueError(f"reconstruction scoring needs the prefix cache of {self.n} tokens as prefilled")
        self.skip = skip
        self.saved = [(layer.keys, layer.values, layer.positions, layer.seen) for layer in cache.layers]

    def after_attention(self, cache, layer_idx, query, key, scaling, probs=None, softcap=None) -> None:
        """Score layer `layer_idx` (a global one) from its chunk rows, then restore it (`EvictionPolicy`).

        Args:
            query: [1, H, q, d] rotated queries of the chunk's q tokens.
            key: [1, H_kv, n + q, d] the prefix's keys then the chunk's (a global layer).
        """
        if self.windows[layer_idx] is None:
            if key.shape[2] != self.n + query.shape[2]:
                raise ValueError(f"layer {layer_idx}: {key.shape[2]} keys for a {self.n}-token prefix")
            self.fold(layer_idx, query[0, :, self.skip :, :], key[0], scaling, softcap)
        layer = cache.layers[layer_idx]
        layer.keys, layer.values, layer.positions, layer.seen = self.saved[layer_idx]

    def fold(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, scaling: float, softcap) -> None:
        """Fold rows into the layer's accumulator, in row blocks of at most `MAX_BLOCK_ELEMENTS` floats.

        Args:
            query: [H, r, d] the counted rows (the chunk's last r tokens).
            key: [H_kv, n + q, d], the chunk's q >= r tokens last.
        """
        num_heads, r, _ = query.shape
        num_kv, k_len = key.shape[0], key.shape[1]
        acc = self.layers.get(layer_idx)
        if acc is None:
            log_score = key.new_full((num_kv, self.n), float("-inf"), dtype=torch.float32)
            acc = self.layers[layer_idx] = LayerAccumulator(log_score)
            acc.col_sum = torch.zeros(num_heads, max(self.n - self.w, 0), dtype=torch.float64, device=key.device)
        block = max(1, min(r, MAX_BLOCK_ELEMENTS // (num_heads * k_len)))
        first = k_len - r  # key index of the first counted row's own token
        key32 = key.float()
        # two block buffers reused by every block: a fresh 16 MiB tensor per op costs more in page faults
        # than the exp it holds
        buffers = torch.empty(2, num_heads * block * k_len, dtype=torch.float32, device=key.device)
        for start in range(0, r, block):
            rows = query[:, start : start + block]
            logp = chunk_log_probabilities(rows, key32, scaling, softcap, first + start, buffers)
            self._reduce(acc, logp[..., : self.n], acc.rows + start)  # [H_kv, g, b, n]: the prefix columns
        acc.rows += r

    def _reduce(self, acc: LayerAccumulator, logp: torch.Tensor, row0: int) -> None:
        """Fold [H_kv, g, b, n] log-probabilities of rows row0 .. row0 + b - 1 of R over the prefix: the max
        (step 3) over all of them, the sums of step 4 over its statistic rows."""
        num_kv, group, b, n = logp.shape
        torch.maximum(acc.log_score, logp.amax(dim=(1, 2)), out=acc.log_score)  # rows and GQA group
        first = -row0 % self.stride  # the block's first statistic row (rows of R at multiples of s)
        if first >= b:
            return
        ev = logp[:, :, first :: self.stride, : n - self.w]  # [H_kv, g, s, n - w]
        a = ev.exp()
        acc.entropy -= float((a * ev).sum(dtype=torch.float64))  # Σ -A log A; prefix columns are never 0
        acc.col_sum += a.flatten(0, 1).sum(dim=1, dtype=torch.float64)  # [H, n - w]: head h = k·g + i
        acc.sq_sum += float((a * a).sum(dtype=torch.float64))
        acc.stat_rows += a.shape[2]


def chunk_log_probabilities(
    query: torch.Tensor, key: torch.Tensor, scaling: float, softcap: float | None, first: int,
    buffers: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Float32 log attention probabilities of b consecutive new tokens over the prefix and the new keys.

    Args:
        query: [H, b, d] rotated queries; row i is the token whose own key sits at index first + i.
        key: [H_kv, k, d] rotated keys: cached ones (all visible) then the new ones (causal).
        scaling: softmax scale; softcap: logit soft-capping c (c · tanh(x / c)) or None.
        first: key index of row 0's own token (k - q for the first row of a q-token forward).
        buffers: [2, >= H·b·k] float32 scratch (allocated when None); the result is a view of buffers[0].

    Returns:
        [H_kv, g, b, k] float32 log-softmax; query head h = k·g + i reads KV head k (repeat_kv), keys after
        a row's own are -inf.

    Raises:
        ValueError: a row's own key would lie past the k keys (first + b > k).
    """
    num_heads, b, dim = query.shape
    num_kv, k_len, _ = key.shape
    group = num_heads // num_kv
    size = num_heads * b * k_len
    if buffers is None:
        buffers = torch.empty(2, size, dtype=torch.float32, device=key.device)
    q = query.float().reshape(num_kv, group * b, dim)  # [H_kv, g·b, d]
    logits = buffers[0, :size].view(num_kv, group * b, k_len)
    torch.bmm(q, key.float().transpose(1, 2), out=logits)
    logits = logits.mul_(scaling).view(num_kv, group, b, k_len)  # [H_kv, g, b, k]
    if softcap is not None:
        logits = logits.div_(softcap).tanh_().mul_(softcap)
    if first + b > k_len:
        raise ValueError(f"rows up to key {first + b - 1} for {k_len} keys")
    tail = logits[..., first + 1 :]  # only keys after row 0's own can be hidden from a row
    rows = torch.arange(b, device=key.device).unsqueeze(1)  # [b, 1]
    tail.masked_fill_(torch.arange(tail.shape[-1], device=key.device).unsqueeze(0) >= rows, float("-inf"))
    # logsumexp in place: torch.logsumexp allocates the shifted block, which costs more than the exp itself
    logits.sub_(logits.amax(dim=-1, keepdim=True))
    shifted = torch.exp(logits, out=buffers[1, :size].view(logits.shape))
    return logits.sub_(shifted.sum(dim=-1, keepdim=True).log_())


@dataclass(frozen=True)
class Reconstruction:
    """What `reconstruction_scores` measured on a prefix: per layer (None for a local layer)."""

    scores: list[torch.Tensor | None]  # [H_kv, n] S per cached pair (step 3)
    stats: list[LayerStats | None]  # H_l, V_l, log P_l over the rows R (step 4)
    rows: int  # |R| = p + target tokens
    chunks: int
    seconds: float


@torch.inference_mode()
def reconstruction_scores(
    model, cache: CakeCache, repeat_ids: torch.Tensor, target_ids: torch.Tensor, config: CakeConfig, *,
    chunk: int = DEFAULT_CHUNK, on_chunk=None,
) -> Reconstruction:  # fmt: skip
    """Run the teacher-forced reconstruction over a whole prefix cache and score every cached pair (steps 1-4).

    Args:
        model: the model that filled `cache`, switched to a CAKE attention function.
        cache: the prefix's full cache (n tokens, nothing evicted); left as it was.
        repeat_ids: [1, p] the repeat prompt (p >= 0); target_ids: [1, t > 0] the text to repeat.
        config: w (`window`), τ1, τ2 for the statistics.
        chunk: m, target tokens per forward (>= 1), lowered so the last position fits the model.
        on_chunk: progress callback (chunk index, number of chunks).

    Raises:
        ValueError: empty target, a chunk size < 1, or no position left for a chunk after the prefix.
    """
    n, p, t = cache.layers[0].seen, repeat_ids.shape[1], target_ids.shape[1]
    limit = attention_layout(model.config).limit
    room = chunk if limit is None else min(chunk, limit - n - p)
    if t == 0 or chunk < 1 or room < 1:
        raise ValueError(
            f"no room to reconstruct {t} tokens after a {n}-token prefix ({p}-token prompt, chunk {chunk})"
        )
    scorer = ReconstructionScorer(n, min(config.window, n), cache.windows, stat_stride(p + t))
    policy, cache.policy, tracking = cache.policy, scorer, cache.tracking_peak
    starts = list(range(0, t, room))
    sync_device(target_ids.device)
    began = time.perf_counter()
    try:
        for index, start in enumerate(starts):
            scorer.begin_chunk(cache, p if index else 0)
            ids = torch.cat([repeat_ids, target_ids[:, start : start + room]], dim=1)  # [1, p + m]
            forward_step(model, cache, ids, n, None)
            if on_chunk is not None:
                on_chunk(index, len(starts))
    finally:
        cache.policy, cache.tracking_peak = policy, tracking
    sync_device(target_ids.device)
    layers = [scorer.layers.get(i) for i in range(len(cache.layers))]
    stats = [acc.stats(config.tau1, config.tau2) if acc else None for acc in layers]
    scores = [acc.log_score.exp() if acc else None for acc in layers]
    return Reconstruction(scores, stats, p + t, len(starts), time.perf_counter() - began)


def evict_by_scores(cache: CakeCache, rec: Reconstruction, config: CakeConfig) -> list[int | None] | None:
    """Step 5: budgets from the allocation (Eq. 7 one-shot for `cake`) and each global layer cut to its top-B_l
    pairs by S per KV head, plus the prefix's last w tokens.

    Returns:
        [L] B_l (None for a local layer), or None when n <= B (nothing evicted).
    """
    n, w = cache.layers[0].seen, config.window
    global_layers = [i for i, window in enumerate(cache.windows) if window is None]
    if n <= config.budget or not global_layers:
        return None
    total, cap = config.evictable_total(len(global_layers)), n - w
    if config.allocation == allocation.GLOBAL:
        return _evict_globally(cache, rec, global_layers, total, n, w)
    uses_stats = allocation.ALLOCATIONS[config.allocation].uses_stats
    logs = [rec.stats[i].log_preference for i in global_layers] if uses_stats else None
    scored = len(global_layers)
    budgets = allocation.stage_budgets(config.allocation, logs, scored, scored, total, cap, None, window=w)
    for layer_idx, budget in zip(global_layers, budgets):
        chosen = top_k_sorted(rec.scores[layer_idx][:, :cap], budget)  # [H_kv, B_l] ascending
        window = torch.arange(cap, n, device=chosen.device).expand(chosen.shape[0], w)  # [H_kv, w]
        cache.layers[layer_idx].keep(torch.cat([chosen, window], dim=-1))  # [1, H_kv, B_l + w, d]
    out = dict(zip(global_layers, budgets))
    return [out.get(i) for i in range(len(cache.layers))]


def _evict_globally(cache: CakeCache, rec: Reconstruction, global_layers, total: int, n: int, w: int):
    """Step 5 under `--allocation global` (KVzip's one threshold, `headlengths.ranked_selection`): the
    H_kv · B_total highest S over every global layer and KV head, plus each head's last w tokens; the layers
    become ragged (`headlengths.pack_heads`). Returns [L] B_l = the layer's kept evictable pairs averaged over
    its KV heads, rounded (None for a local layer)."""
    num_kv = cache.layers[global_layers[0]].keys.shape[1]
    chosen = ranked_selection([rec.scores[i][:, : n - w] for i in global_layers], num_kv * total)
    budgets: list[int | None] = [None] * len(cache.layers)
    for layer_idx, rows in zip(global_layers, chosen):
        window = torch.arange(n - w, n, device=rows[0].device)  # [w]
        pack_heads(cache.layers[layer_idx], [torch.cat([r, window]) for r in rows])  # [1, H_kv, max_h + w, d]
        budgets[layer_idx] = round(sum(r.numel() for r in rows) / num_kv)
    return budgets


@torch.inference_mode()
def compress_by_reconstruction(
    model, prefix_ids: torch.Tensor, repeat_ids: torch.Tensor, target_ids: torch.Tensor, config: CakeConfig, *,
    chunk: int = DEFAULT_CHUNK, on_layer=None, on_chunk=None,
) -> Prefilled:  # fmt: skip
    """Prefill a prefix whole, score it by reconstruction and evict it to the budget (module docstring).

    Args:
        prefix_ids: [1, n] the prefix; repeat_ids: [1, p] the repeat prompt; target_ids: [1, t] what it
            repeats (the document's tokens).
        config: budget B, window w, allocation, τ1, τ2 (its indicator is not used: S ranks the pairs).
        chunk, on_chunk: see `reconstruction_scores`; on_layer: the prefill's progress (layer_idx, L).

    Returns:
        Prefilled of the n prefix tokens (B_l + w per global layer when n > B), its cascade a
        `SavedCascade` with the reconstruction statistics and budgets (seconds: reconstruction +
        eviction); `seconds` is the prefill's, `peak_bytes` the largest total held meanwhile.

    Raises:
        ValueError: see `prefill` and `reconstruction_scores`.
    """
    state = prefill(model, prefix_ids, None, on_layer=on_layer)
    rec = reconstruction_scores(model, state.cache, repeat_ids, target_ids, config, chunk=chunk, on_chunk=on_chunk)
    began = time.perf_counter()
    budgets = evict_by_scores(state.cache, rec, config)
    seconds = rec.seconds + time.perf_counter() - began
    cascade = SavedCascade(rec.stats, budgets, budgets is not None, seconds)
    cache = state.cache
    return Prefilled(cache, cascade, state.logits, state.seconds, cache.lengths(), cache.kv_bytes(), cache.peak_bytes)
