"""The model-family contract: what a model must satisfy for the CAKE engine to compute it exactly.

The engine replaces each attention module's attention function (`attention.use_cake_attention`)
and builds every layer's mask itself (after eviction layers hold different numbers of tokens). That
is exact only for models whose attention modules

1. apply rotary position embeddings to q and k *before* the cache update (so a cached key keeps
   its true position when others are evicted, spec §3);
2. carry `layer_idx` (the cache and the cascade are indexed by layer);
3. use dense causal softmax attention on every layer: no sliding window in effect, no logit
   soft-capping, no attention sinks or other extra logits;
4. hand the attention function keys/values at KV-head granularity (GQA, before repeat_kv).

`FAMILIES` lists the `config.model_type`s known to satisfy 1, 2 and 4; `check_model` checks 2 and 3
on the model actually loaded, since a config can switch features on. The loader, the GGUF
conversion and the tiny test models read the same table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """A model family the engine handles (transformers' `config.model_type`)."""

    model_type: str
    name: str  # shown to users, e.g. "Llama"


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", "Llama"),
        Family("mistral", "Mistral"),
        Family("qwen2", "Qwen2"),
    )
}


class UnsupportedModelError(ValueError):
    """The model has a feature the engine does not compute exactly; switching attention is refused."""


def supported_text() -> str:
    """'the llama, mistral and qwen2 families' (for messages)."""
    names = list(FAMILIES)
    listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
    return f"the {listed} families"


def check_model_type(model_type: str | None) -> None:
    """Refuse a `config.model_type` outside FAMILIES.

    Raises:
        UnsupportedModelError: naming the model type and the supported families.
    """
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"unsupported architecture {model_type!r}: the CAKE engine supports {supported_text()} only"
        )


def _sliding_window(config) -> int | None:
    """The sliding window in effect on any layer (tokens), or None when every layer is dense."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return getattr(config, "sliding_window", None) or 0
    if getattr(config, "use_sliding_window", None) is False:
        return None
    return getattr(config, "sliding_window", None)


def check_model(model) -> None:
    """Check the contract (module docstring) on a loaded model before its attention is switched.

    Args:
        model: a transformers causal LM (`model.config`, `model.model.layers[i].self_attn`).

    Raises:
        UnsupportedModelError: an unsupported family, an attention module without `layer_idx`,
            a sliding window in effect, or logit soft-capping.
    """
    config = model.config
    check_model_type(getattr(config, "model_type", None))
    window = _sliding_window(config)
    if window is not None:
        raise UnsupportedModelError(
            f"{config.model_type} model with a {window}-token sliding window: the CAKE engine computes dense "
            "attention only, so it would give wrong numbers past the window"
        )
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, key, None):
            raise UnsupportedModelError(f"{config.model_type} model with {key}: not handled by the CAKE engine")
    for index, layer in enumerate(getattr(getattr(model, "model", None), "layers", None) or ()):
        if getattr(getattr(layer, "self_attn", None), "layer_idx", None) != index:
            raise UnsupportedModelError(f"decoder layer {index} has no attention module with layer_idx = {index}")
