"""A lean decode step: one token through a Llama-style decoder without transformers' generic forward.

On CPU a decode step of the default model spends about a quarter of its time outside the linear
layers' kernels, much of it in the generic forward around them (mask preparation, output objects,
keyword plumbing through every module). For the families whose decoder layer is exactly
norm → attention → residual → norm → gated MLP → residual (Llama, Mistral, Qwen2), `LeanDecoder`
runs the same operations in the same order on the model's own modules and weights (embedding,
rotary embedding, projections, norms, MLP, head: whatever linear layers the model holds, quantized
ones included), with the engine's decode attention (`attention.decode_attention`, the path the
registered attention function takes for one query on CPU). Its logits equal the model's forward bit
for bit (tests/engine/test_lean_step.py); anything it does not handle (another family, a local
sliding-window layer, a GPU, flash attention, hooks on a module, a prompt of several tokens) goes
through `model(...)` as before (`lean_decoder` returns None).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.modules.module as module_hooks

from cake_cli.engine.attention import decode_attention, fast_decode, implementation_name, layer_window
from cake_cli.engine.families import attention_layout
from cake_cli.engine.headlengths import live_slots

ENABLED = True  # tests and A/B benchmarks switch it off to compare with the model's own forward

# decoder-layer class -> the sliding window its attention module passes to the attention function
LAYERS = {
    "LlamaDecoderLayer": lambda attn: None,
    "MistralDecoderLayer": lambda attn: getattr(attn.config, "sliding_window", None),
    "Qwen2DecoderLayer": lambda attn: attn.sliding_window,
}
NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm"})  # weight * (x·rsqrt(mean x² + eps))
MLPS = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP"})  # down(act(gate(x)) * up(x))
BACKENDS = ("eager", "sdpa")  # the cake attention functions whose one-query path is `decode_attention` on CPU


def unsupported(model) -> str | None:
    """Why `LeanDecoder` cannot run `model` (one line), or None when it can."""
    config, inner = model.config, getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(model, "lm_head"):
        return "not a decoder with model.layers and lm_head"
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in {implementation_name(b) for b in BACKENDS}:
        return f"attention {implementation!r} is not a CPU CAKE attention function"
    if inner.embed_tokens.weight.device.type != "cpu":
        return "not on the CPU"
    if len(layers) != config.num_hidden_layers:
        return "the model runs a different number of layers than it holds"
    if any(w is not None for w in attention_layout(config).windows):
        return "local sliding-window layers"
    if getattr(config, "final_logit_softcapping", None):
        return "final logit soft-capping"
    for layer in layers:
        if type(layer).__name__ not in LAYERS or type(layer.mlp).__name__ not in MLPS:
            return f"decoder layer {type(layer).__name__}"
        if {type(layer.input_layernorm).__name__, type(layer.post_attention_layernorm).__name__} - NORMS:
            return "another norm"
    if type(inner.norm).__name__ not in NORMS:
        return "another final norm"
    if hooked(model):
        return "hooks on its modules"
    return None


def hooked(model) -> bool:
    """Whether a forward hook would run on `model` or one of its modules (the lean step calls no hooks
    of the modules it bypasses, so it steps aside while one is registered)."""
    if module_hooks._global_forward_hooks or module_hooks._global_forward_pre_hooks:
        return True
    # accelerate's hooks (device maps, offloading) wrap a module's forward instead of registering one
    return any(m._forward_hooks or m._forward_pre_hooks or hasattr(m, "_hf_hook") for m in model.modules())


class LeanDecoder:
    """One decode token through `model`'s layers (module docstring); build with `lean_decoder`.

    Args:
        model: a causal LM of a family in `LAYERS`, its attention switched to a CAKE function.
    """

    def __init__(self, model):
        self.model, self.inner = model, model.model
        self.layers = list(model.model.layers)
        self.windows = [LAYERS[type(layer).__name__](layer.self_attn) for layer in self.layers]
        modeling = sys.modules[type(self.layers[0].self_attn).__module__]
        self.rotate = modeling.apply_rotary_pos_emb  # the family's own RoPE function, as its attention calls it
        self.backend = model.config._attn_implementation.removeprefix("cake_")

    @torch.inference_mode()
    def __call__(self, cache, ids: torch.Tensor, start: int) -> torch.Tensor:
        """The next-token logits [1, V] after token ids [1, 1] at true position `start`.

        Raises:
            UnsupportedModelError: as the attention function does (`attention.layer_window`), e.g. a
                global layer past its family's sliding window.
            NonFiniteError: non-finite keys or values (`cache.CakeCache.update`).
        """
        inner = self.inner
        hidden = inner.embed_tokens(ids)  # [1, 1, D]
        positions = torch.arange(start, start + 1, device=ids.device).unsqueeze(0)  # [1, 1]
        cos, sin = inner.rotary_emb(hidden, positions)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            residual = hidden
            x = layer.input_layernorm(hidden)
            shape = (1, 1, -1, attn.head_dim)
            query = attn.q_proj(x).view(shape).transpose(1, 2)  # [1, H, 1, d]
            key = attn.k_proj(x).view(shape).transpose(1, 2)  # [1, H_kv, 1, d]
            value = attn.v_proj(x).view(shape).transpose(1, 2)
            query, key = self.rotate(query, key, cos, sin)
            key, value = cache.update(key, value, i)  # [1, H_kv, k, d]: every slot the layer holds
            window = layer_window(i, cache, self.windows[i])
            if not fast_decode(self.backend, query.device, key.shape[2], window):
                raise RuntimeError(f"layer {i}: the lean step runs only where one query takes the decode path")
            live = live_slots(cache.layers[i], key.shape[2])  # [H_kv, k] or None
            out = decode_attention(cache, i, query, key, value, attn.scaling, None, live)  # [1, 1, H, d]
            hidden = residual + attn.o_proj(out.reshape(1, 1, -1).contiguous())
            residual = hidden
            x = layer.post_attention_layernorm(hidden)
            mlp = layer.mlp
            hidden = residual + mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        hidden = inner.norm(hidden)
        return self.model.lm_head(hidden)[:, -1, :]  # [1, V]


def lean_decoder(model) -> LeanDecoder | None:
    """The model's `LeanDecoder`, or None where it does not apply (`unsupported`, or `ENABLED` off).
    Decided once per model, attention implementation and device, then remembered on the model; hooks
    are looked for at every call (a hook registered later sends the step back to the model's forward)."""
    if not ENABLED or hooked(model):
        return None
    key = (getattr(model.config, "_attn_implementation", None), model.get_input_embeddings().weight.device)
    remembered = getattr(model, "_cake_lean", None)
    layers = getattr(getattr(model, "model", None), "layers", ())
    stale = remembered is not None and remembered[1] is not None and remembered[1].layers != list(layers)
    if remembered is None or remembered[0] != key or stale:  # another attention, device or set of layers
        remembered = (key, None if unsupported(model) else LeanDecoder(model))
        model._cake_lean = remembered
    return remembered[1]
