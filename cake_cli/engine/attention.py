"""Attention functions registered with transformers' AttentionInterface (docs/method.md §Transformers integration).

After eviction the layers hold different numbers of tokens, but the model builds one mask from
the first layer. These functions ignore that mask and build each layer's own from its key
length: every cached token is visible, the q new tokens are causal among themselves (batch 1);
a local layer (native sliding window, `families.attention_layout`) narrows that to its window, and a
layer whose KV heads hold different numbers of tokens (`engine.headlengths`) masks each head's padding
(eager and SDPA; flash_attention_2 has no per-head mask and is refused for it).
Logit soft-capping (Gemma 2) runs on the eager path, SDPA having none. Then they hand the layer to
the CakeCache passed as the `cake=` keyword (prefill cascade or decode policy). Backends: eager and
SDPA (CPU and CUDA), flash_attention_2 (CUDA + flash-attn).
"""

from __future__ import annotations

import importlib.util

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward  # Llama's, plus softcap

from cake_cli.engine.families import UnsupportedModelError, check_model
from cake_cli.engine.headlengths import live_slots
from cake_cli.engine.window import window_attention

BACKENDS = ("eager", "sdpa", "flash_attention_2")


def flash_available() -> bool:
    """True when CUDA and the flash-attn package are both present."""
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def default_backend(device: torch.device) -> str:
    """flash_attention_2 on CUDA with flash-attn installed, else SDPA."""
    return "flash_attention_2" if device.type == "cuda" and flash_available() else "sdpa"


def cached_plus_causal(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """Boolean mask [q_len, k_len], True = attend: the first k_len - q_len keys (cache) are
    visible to every query, the last q_len keys are causal among the new queries."""
    rows = torch.arange(q_len, device=device).unsqueeze(1) + (k_len - q_len)  # [q, 1]
    return torch.arange(k_len, device=device).unsqueeze(0) <= rows  # [q, k]


def visible(q_len: int, k_len: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """Boolean mask [q_len, k_len] of `cached_plus_causal`, narrowed to a sliding window: a query
    sees the keys less than `window` positions behind it (transformers' sliding_window_overlay;
    the keys are contiguous positions ending at the newest query, as in a local layer's cache).
    None when every key is visible to every query (one query within its window)."""
    if q_len == 1 and (window is None or k_len <= window):
        return None
    allowed = cached_plus_causal(q_len, k_len, device)  # [q, k]
    if window is not None and k_len > window:
        rows = torch.arange(q_len, device=device).unsqueeze(1) + (k_len - q_len)  # [q, 1] query index
        allowed &= torch.arange(k_len, device=device).unsqueeze(0) > rows - window
    return allowed


def layer_window(layer_idx: int, cache, sliding_window: int | None) -> int | None:
    """The sliding window the attention of layer `layer_idx` applies (None: dense causal), checked
    against the cache: a local layer (`cache.SlidingLayer`) applies its native window; a global
    layer holds evicted tokens, which is exact only while the window has no effect.

    Args:
        cache: the CakeCache of the run (None: a plain cache, contiguous positions).
        sliding_window: what the attention module passed (tokens), or None.

    Raises:
        UnsupportedModelError: the module's window disagrees with the layer's cache, or a global
            layer has seen more tokens than its window (prompt + generation past it).
    """
    layer = cache.layers[layer_idx] if cache is not None else None
    if layer is None:
        return sliding_window
    if layer.window is not None or sliding_window is None:
        if layer.window != sliding_window:
            raise UnsupportedModelError(
                f"layer {layer_idx} attends with sliding window {sliding_window} but its cache was built for "
                f"{layer.window}: build the CakeCache with families.attention_layout(config).windows"
            )
        return layer.window
    if layer.seen > sliding_window:
        raise UnsupportedModelError(
            f"layer {layer_idx} attends over a sliding window of {sliding_window} tokens and has seen {layer.seen}: "
            f"past its window the CAKE engine is not exact; keep prompt + generated tokens within {sliding_window}"
        )
    return None


def per_head_mask(allowed: torch.Tensor | None, live: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[1, H, q, k] bool mask: `allowed` [q, k] (None: all) narrowed by `live` [H_kv, k], the keys each KV
    head holds (`engine.headlengths.live_slots`), repeated to its g = H / H_kv query heads (h reads h // g)."""
    heads = live.repeat_interleave(num_heads // live.shape[0], dim=0)  # [H, k]
    mask = heads[:, None, :]  # [H, 1, k]
    if allowed is not None:
        mask = mask & allowed[None]  # [H, q, k]
    return mask[None]  # [1, H, q or 1, k]


def masked_sdpa(query, key, value, allowed: torch.Tensor, scaling: float, dropout: float) -> torch.Tensor:
    """torch's SDPA with a boolean mask, each KV head read by its g = H / H_kv query heads in the kernel
    (`enable_gqa`) on CPU. transformers repeats the keys and values to H heads whenever a mask is given (on
    CUDA a masked GQA call leaves the fused kernels); on CPU that copy of every key and value took about a
    tenth of a question-time pass over a 16K-token cache, and the kernel is as fast either way.

    Args:
        query: [1, H, q, d]; key, value: [1, H_kv, k, d].
        allowed: [q, k] bool, True = attend.

    Returns:
        [1, q, H, d] attention output, contiguous (transformers' layout).
    """
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=allowed[None, None], dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # [1, H, q, d]
    return out.transpose(1, 2).contiguous()


def _backend_call(backend: str, module, query, key, value, scaling, dropout, window, softcap, kwargs, live=None):
    """The backend's attention with this layer's mask (eager when soft-capping: SDPA has none); `live`
    [H_kv, k] narrows it per KV head (a ragged layer, `engine.headlengths`)."""
    q_len, k_len = query.shape[2], key.shape[2]
    if live is not None:
        if backend == "flash_attention_2":
            raise UnsupportedModelError(
                f"layer {module.layer_idx} holds a different number of tokens per KV head (--allocation global), "
                "which flash_attention_2 cannot mask: use --attention sdpa or eager"
            )
        allowed = per_head_mask(visible(q_len, k_len, window, query.device), live, query.shape[1])  # [1, H, q, k]
        if backend == "sdpa" and softcap is None:
            return sdpa_attention_forward(
                module, query, key, value, allowed, dropout=dropout, scaling=scaling, **kwargs
            )
        mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        mask.masked_fill_(~allowed, torch.finfo(query.dtype).min)
        return eager_attention_forward(
            module, query, key, value, mask, scaling=scaling, dropout=dropout, softcap=softcap, **kwargs
        )
    if backend == "flash_attention_2":
        from transformers.integrations.flash_attention import flash_attention_forward

        # flash-attn aligns the causal mask and the window bottom-right: cached keys visible, new ones causal
        return flash_attention_forward(
            module,
            query,
            key,
            value,
            None,
            dropout=dropout,
            scaling=scaling,
            sliding_window=window,
            softcap=softcap,
            **kwargs,
        )
    if backend == "sdpa" and softcap is None:
        # a prefill's [n, n] mask is never built for SDPA (is_causal does its work without the n² tensor)
        causal = q_len == k_len and (window is None or k_len <= window)  # SDPA's own is_causal is exact
        allowed = None if causal else visible(q_len, k_len, window, query.device)  # [q, k] or None
        if allowed is not None and query.device.type == "cpu":
            return masked_sdpa(query, key, value, allowed, scaling, dropout), None
        mask = None if allowed is None else allowed[None, None]
        return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)
    allowed = visible(q_len, k_len, window, query.device)  # [q, k] or None
    mask = None
    if allowed is not None:
        mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        mask.masked_fill_(~allowed, torch.finfo(query.dtype).min)
        mask = mask[None, None]  # [1, 1, q, k]
    return eager_attention_forward(
        module, query, key, value, mask, scaling=scaling, dropout=dropout, softcap=softcap, **kwargs
    )


def fast_decode(backend: str, device: torch.device, k_len: int, window: int | None) -> bool:
    """Whether one decode query runs `window_attention` + `attend` instead of the backend: on CPU
    (eager and SDPA) whenever every key is visible (no sliding-window mask). There torch's SDPA
    kernel for a single query took 30 ms per layer at 8,192 keys (14 query, 2 KV heads, bf16; with
    transformers' repeat_kv 66 ms), the two products 1.5 ms, and 107 vs 17 ms at 32,768 keys
    (benchmarks/runs/decode-profile-2026-12-02.md); the scores are float32 as in SDPA's kernel."""
    return device.type == "cpu" and backend != "flash_attention_2" and (window is None or k_len <= window)


def attend(probs: torch.Tensor, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Attention output from probabilities: probs [H, r, k] float32 (r query rows), value [1, H_kv, k, d]
    -> [1, r, H, d] in `dtype` (transformers' layout); query head h reads KV head h // g."""
    num_heads, rows, k = probs.shape
    num_kv, dim = value.shape[1], value.shape[-1]
    out = torch.bmm(probs.reshape(num_kv, num_heads // num_kv * rows, k), value[0].float())  # [H_kv, g·r, d]
    return out.view(num_heads, rows, dim).transpose(0, 1).unsqueeze(0).to(dtype)  # [1, r, H, d]


def decode_attention(cake, layer_idx: int, query, key, value, scaling: float, softcap, live) -> torch.Tensor:
    """One decode query by two batched products per KV head with float32 scores (`fast_decode`);
    on a layer about to evict, the same probabilities are the eviction score (the CakeCache hook,
    when `cake` is one, runs with them: no second pass).

    Args:
        cake: the run's CakeCache, or None.
        query: [1, H, 1, d] rotated; key, value: [1, H_kv, k, d] every slot the layer holds.
        live: [H_kv, k] bool, each KV head's live slots (`headlengths.live_slots`), or None.

    Returns:
        [1, 1, H, d] attention output in the query's dtype (transformers' layout).
    """
    probs = window_attention(query[0], key[0], scaling, softcap, live)  # [H, 1, k] float32
    if cake is not None:
        cake.after_attention(layer_idx, query, key, scaling, probs=probs, softcap=softcap)
    return attend(probs, value, query.dtype)


def window_split(cake, layer_idx: int, backend: str, query, key) -> int:
    """How many of this forward's last query rows run as `window_attention` + `attend` (their
    probabilities then score the layer, `split_attention`): on CPU, the policy's observation window w
    when the cache asks for it (`CakeCache.window_rows`: the question-time cascade, on a global layer
    without per-head padding) and the forward has more query rows than w; 0 otherwise (the backend runs
    every row)."""
    if cake is None or query.device.type != "cpu" or backend == "flash_attention_2":
        return 0
    rows = cake.window_rows(layer_idx, key.shape[2])
    return rows if 0 < rows < query.shape[2] else 0


def split_attention(backend, module, query, key, value, scaling, dropout, softcap, kwargs, rows: int, cake):
    """A forward's last `rows` queries (the observation window) by `window_attention` + `attend`, whose float32
    probabilities are then handed to the cache as the layer's window attention (no second pass over the
    keys); the queries before them by the backend over the keys they see (row i of the first q - rows sees
    keys 0..k - q + i, all among the first k - rows).

    Args:
        query: [1, H, q, d] rotated; key, value: [1, H_kv, k, d]; rows: 0 < rows < q.

    Returns:
        [1, q, H, d] attention output in the query's dtype (transformers' layout).
    """
    probs = window_attention(query[0, :, -rows:], key[0], scaling, softcap)  # [H, rows, k] float32
    tail = attend(probs, value, query.dtype)  # [1, rows, H, d]
    head, _ = _backend_call(
        backend, module, query[:, :, :-rows], key[:, :, :-rows], value[:, :, :-rows], scaling, dropout, None,
        softcap, kwargs,
    )  # fmt: skip
    cake.after_attention(module.layer_idx, query, key, scaling, probs=probs, softcap=softcap)
    return torch.cat([head, tail], dim=1)


def _make(backend: str):
    def cake_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """query [1, H, q, d], key/value [1, H_kv, k, d] -> output [1, q, H, d] (transformers layout).

        The model's own `attention_mask` is ignored (it is built from the first layer's length); the
        module's `scaling`, `softcap` and `sliding_window` arguments are honoured.
        """
        cake = kwargs.pop("cake", None)
        if query.shape[0] != 1:
            raise ValueError("cake-cli attention supports batch size 1 only")
        layer_idx = module.layer_idx
        window = layer_window(layer_idx, cake, kwargs.pop("sliding_window", None))
        softcap = kwargs.pop("softcap", None)
        scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
        live = live_slots(cake.layers[layer_idx], key.shape[2]) if cake is not None else None  # [H_kv, k] or None
        if query.shape[2] == 1 and (
            fast_decode(backend, query.device, key.shape[2], window)
            or (cake is not None and cake.needs_probs(layer_idx, key.shape[2]))
        ):
            return decode_attention(cake, layer_idx, query, key, value, scaling, softcap, live), None
        if rows := window_split(cake, layer_idx, backend, query, key):
            out = split_attention(backend, module, query, key, value, scaling, dropout, softcap, kwargs, rows, cake)
            return out, None
        out, _ = _backend_call(backend, module, query, key, value, scaling, dropout, window, softcap, kwargs, live)
        if cake is not None:
            cake.after_attention(layer_idx, query, key, scaling, softcap=softcap)
        return out, None

    cake_attention.__name__ = f"cake_{backend}"
    return cake_attention


def implementation_name(backend: str) -> str:
    """The name under which the CAKE variant of `backend` is registered, e.g. 'cake_sdpa'."""
    return f"cake_{backend}"


for _backend in BACKENDS:
    AttentionInterface.register(implementation_name(_backend), _make(_backend))


def use_cake_attention(model, backend: str) -> str:
    """Switch `model` to the CAKE attention function for `backend` (eager|sdpa|flash_attention_2),
    after checking the model-family contract (`families.check_model`).

    Returns:
        The backend in use: `backend`, or eager for SDPA on a family transformers runs without
        SDPA (Gemma 2: its soft-capping has no SDPA kernel).

    Raises:
        UnsupportedModelError (a ValueError): the model has a feature the engine does not compute
            exactly (another family, attention sinks, bidirectional attention, an unknown layer
            type, ...); its attention is unchanged.
        ValueError: an unknown backend, or flash_attention_2 without CUDA + flash-attn.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "flash_attention_2" and not flash_available():
        raise ValueError("flash_attention_2 needs CUDA and the flash-attn package")
    check_model(model)
    if backend == "sdpa" and not getattr(model, "_supports_sdpa", True):
        backend = "eager"
    model.set_attn_implementation(implementation_name(backend))
    return backend
