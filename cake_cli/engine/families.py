"""The model-family contract: what a model must satisfy for the CAKE engine to compute it exactly.

The engine replaces each attention module's attention function (`attention.use_cake_attention`)
and builds every layer's mask itself (after eviction layers hold different numbers of tokens).
That is exact for models whose attention modules

1. apply rotary position embeddings (and any q/k norm, as Qwen3 and Gemma do) to q and k *before*
   the cache update, so the attention function receives the queries the model attends with and a
   cached key keeps its true position when others are evicted (docs/method.md §Positions);
2. carry `layer_idx` (the cache and the cascade are indexed by layer);
3. use causal softmax attention whose only extras are the ones the engine honours, read from the
   arguments each module hands its attention function: `scaling` (Gemma's query_pre_attn_scalar),
   `softcap` (Gemma 2's attn_logit_softcapping, also inside the window attention used for
   scoring) and `sliding_window`. No attention sinks, no bidirectional attention, no layer type
   other than full and sliding attention;
4. hand the attention function keys/values at KV-head granularity (GQA, before repeat_kv).

Sliding windows (`attention_layout`): where some layers slide and others do not (Gemma 2/3, Qwen
with max_window_layers), the sliding layers are *local*: they keep their native window (their
cache holds the last window - 1 tokens, their attention uses the sliding mask) and get no CAKE
budget; CAKE allocates the budget over the global layers. Where every layer slides (Mistral v0.1,
Phi-3 mini), the window is a limit instead: up to `window` tokens (prompt + generation) the
sliding mask equals the causal one and the engine is exact; past it the run is refused.

`FAMILIES` lists the `config.model_type`s known to satisfy 1, 2 and 4; `check_model` checks 2 and 3
on the model actually loaded, since a config can switch features on. The loader, the GGUF
conversion, `cake env` and the tiny test models read the same table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """A model family the engine handles (transformers' `config.model_type`)."""

    model_type: str
    name: str  # shown to users, e.g. "Llama"
    gguf_arch: str  # llama.cpp's general.architecture for this family's GGUF files
    notes: str  # what the engine does for it beyond dense attention ("" for none)
    sliding: str  # where its modules' sliding window comes from: "layer_types" (config.layer_types,
    # per layer), "every_layer" (config.sliding_window on all layers) or "none" (no window)


_EVERY_LAYER = "sliding_window on every layer: prompt + answer limited to it"
FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", "Llama", "llama", "", "none"),
        Family("mistral", "Mistral", "llama", _EVERY_LAYER, "every_layer"),
        Family("qwen2", "Qwen2", "qwen2", "use_sliding_window: the sliding layers are local", "layer_types"),
        Family("qwen3", "Qwen3", "qwen3", "q/k norms; use_sliding_window: the sliding layers are local", "layer_types"),
        Family(
            "gemma2",
            "Gemma 2",
            "gemma2",
            "local sliding layers, query_pre_attn_scalar, attention soft-capping",
            "layer_types",
        ),
        Family(
            "gemma3_text",
            "Gemma 3",
            "gemma3",
            "local sliding layers, q/k norms, query_pre_attn_scalar; text-only checkpoints",
            "layer_types",
        ),
        Family("phi3", "Phi-3", "phi3", f"fused qkv, partial rotary; {_EVERY_LAYER}", "every_layer"),
    )
}
GGUF_ARCHS: dict[str, str] = {}  # llama.cpp architecture -> model_type (the first family wins: llama, not mistral)
for _family in FAMILIES.values():
    GGUF_ARCHS.setdefault(_family.gguf_arch, _family.model_type)
LAYER_TYPES = ("full_attention", "sliding_attention")
_NOT_SUPPORTED = {  # model types people try, with what to use instead
    "gemma3": "multimodal Gemma 3 checkpoints are not supported; text-only ones (model_type gemma3_text, "
    "e.g. gemma-3-270m, gemma-3-1b) are",
}


class UnsupportedModelError(ValueError):
    """The model has a feature the engine does not compute exactly; switching attention is refused."""


def supported_text() -> str:
    """'the llama, mistral, ... and phi3 families' (for messages)."""
    names = list(FAMILIES)
    listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
    return f"the {listed} families"


def check_model_type(model_type: str | None) -> None:
    """Refuse a `config.model_type` outside FAMILIES.

    Raises:
        UnsupportedModelError: naming the model type and the supported families.
    """
    if model_type not in FAMILIES:
        extra = f" ({_NOT_SUPPORTED[model_type]})" if model_type in _NOT_SUPPORTED else ""
        raise UnsupportedModelError(
            f"unsupported architecture {model_type!r}{extra}: the CAKE engine supports {supported_text()} only"
        )


def model_type_of_gguf(arch: str | None) -> str | None:
    """The `model_type` transformers gives a GGUF of llama.cpp architecture `arch` (gemma3 ->
    gemma3_text), or `arch` itself when no family has it."""
    return GGUF_ARCHS.get(arch, arch)


@dataclass(frozen=True)
class AttentionLayout:
    """How the engine treats each layer of a model (module docstring).

    Attributes:
        windows: [L] the native sliding window (tokens) of each *local* layer, None for a global
            layer (CAKE-budgeted).
        limit: most tokens (prompt + generated) the engine computes exactly, or None.
        limit_reason: what sets the limit ("positions" or "sliding window").
    """

    windows: tuple[int | None, ...]
    limit: int | None
    limit_reason: str

    @property
    def global_layers(self) -> list[int]:
        """Indices of the layers CAKE allocates its budget over."""
        return [i for i, w in enumerate(self.windows) if w is None]

    def limit_text(self) -> str:
        """'the model's 4096-position limit' / 'the 4096-token sliding window every layer uses'."""
        if self.limit_reason == "sliding window":
            return f"the {self.limit}-token sliding window every layer uses"
        return f"the model's {self.limit}-position limit"


def _declared_windows(config) -> list[int | None]:
    """Each layer's sliding window as the family's attention modules apply it (None = full attention)."""
    layers = config.num_hidden_layers
    window = getattr(config, "sliding_window", None) or None
    family = FAMILIES.get(getattr(config, "model_type", None))
    source = family.sliding if family else "layer_types"
    if source == "none":  # Llama: its modules pass no window
        return [None] * layers
    layer_types = getattr(config, "layer_types", None) if source == "layer_types" else None
    if layer_types is None:  # Mistral, Phi-3: the config's window applies to every layer
        return [window] * layers
    unknown = sorted({t for t in layer_types if t not in LAYER_TYPES})
    if unknown:
        raise UnsupportedModelError(
            f"{config.model_type} model with {', '.join(unknown)} layers: the CAKE engine handles "
            f"{' and '.join(LAYER_TYPES)} layers only"
        )
    return [window if t == "sliding_attention" else None for t in layer_types]


def attention_layout(config) -> AttentionLayout:
    """Which layers are local (native sliding window, no budget) and how many tokens the engine
    computes exactly; a window at least as long as the model's positions is no window.

    Raises:
        UnsupportedModelError: a layer type other than full or sliding attention.
    """
    positions = getattr(config, "max_position_embeddings", None)
    windows = [w if w is not None and (positions is None or w < positions) else None for w in _declared_windows(config)]
    if windows and all(w is not None for w in windows):  # every layer slides: exact up to the window
        return AttentionLayout((None,) * len(windows), min(windows), "sliding window")
    return AttentionLayout(tuple(windows), positions, "positions")


def check_model(model) -> AttentionLayout:
    """Check the contract (module docstring) on a loaded model before its attention is switched.

    Args:
        model: a transformers causal LM (`model.config`, `model.model.layers[i].self_attn`).

    Returns:
        The model's AttentionLayout.

    Raises:
        UnsupportedModelError: an unsupported family, an attention module without `layer_idx`,
            bidirectional attention, attention sinks, or a layer type the engine does not handle.
    """
    config = model.config
    check_model_type(getattr(config, "model_type", None))
    layout = attention_layout(config)
    if getattr(config, "use_bidirectional_attention", None):
        raise UnsupportedModelError(
            f"{config.model_type} model with bidirectional attention: the CAKE engine is causal"
        )
    for index, layer in enumerate(getattr(getattr(model, "model", None), "layers", None) or ()):
        attn = getattr(layer, "self_attn", None)
        if getattr(attn, "layer_idx", None) != index:
            raise UnsupportedModelError(f"decoder layer {index} has no attention module with layer_idx = {index}")
        if getattr(attn, "sinks", None) is not None or getattr(attn, "is_causal", True) is False:
            raise UnsupportedModelError(
                f"decoder layer {index}: attention sinks or non-causal attention, not handled by the CAKE engine"
            )
    return layout
