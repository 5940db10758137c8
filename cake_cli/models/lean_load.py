"""Load a model with quantized linear layers without ever holding its float linear weights.

`--weights int8|int4` used to load the whole float checkpoint (the default model's is float32,
2.5 GB, memory-mapped while transformers converts it to bfloat16) and only then replace the
linear layers by their quantized versions: the process's peak resident memory was that load,
1.7x llama.cpp's at 32K tokens. When the quantized weights are already cached
(`models.weight_cache`), this module builds the model with its parameters on the meta device
(accelerate's ``init_empty_weights``; buffers such as RoPE's inverse frequencies are real), reads
only the non-linear parameters (norms, biases) from the checkpoint, a slice of rows at a time
through short-lived ``safe_open`` mappings, maps the input embedding from the file when it is stored
in the load dtype and the checkpoint is cake-cli's own (`paths.owned`; a lookup table once the head
is quantized: only the rows a prompt reads become resident, `models.tensor_files`), and installs
the cached linear layers. The cache key is the same fingerprint (`models.fingerprint`) the full load
computes, its sampled values read from the file and cast to the load dtype (identical to the loaded
parameter's: one rounding).

Anything it cannot match exactly (checkpoint names or shapes other than the model's, modules kept
in float32, a missing cache) returns None and the caller loads the ordinary way.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel
from transformers.initialization import no_init_weights

from cake_cli.models.fingerprint import SAMPLES, fingerprint
from cake_cli.models.quantize import layer_formats
from cake_cli.models.tensor_files import mapped, read_rows
from cake_cli.models.weight_cache import cache_file, install, read_cached
from cake_cli.paths import owned


def skeleton(d: Path, dtype: torch.dtype, attn_implementation: str | None) -> PreTrainedModel:
    """The model of checkpoint folder `d` with every parameter on the meta device (no weights read).

    Buffers are materialized (computed at construction, e.g. RoPE's ``inv_freq``); parameters carry
    names, shapes and `dtype` only. Raises what ``AutoConfig`` / ``from_config`` raise.
    """
    config = AutoConfig.from_pretrained(d, local_files_only=True)
    # no_init_weights: transformers would draw random values into every meta parameter (a third of a
    # second for the default model) only for them to be replaced; buffers are still computed
    with init_empty_weights(include_buffers=False), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    model.tie_weights()
    return model


def checkpoint_tensors(d: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """{tensor name: (safetensors file holding it, its shape)} for folder `d` (a single file or an
    indexed set); empty when `d` has no safetensors weights or its index is unreadable.

    Raises:
        SafetensorError, OSError: a listed file cannot be read.
    """
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            paths = {d / file for file in json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}
    elif (d / "model.safetensors").is_file():
        paths = {d / "model.safetensors"}
    else:
        return {}
    tensors = {}
    for path in paths:
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                tensors[name] = (path, tuple(f.get_slice(name).get_shape()))
    return tensors


def read_ends(path: Path, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The first and last `SAMPLES` values of tensor `name` flattened, cast to `dtype`: [2 · SAMPLES]
    (what `fingerprint` samples from a loaded parameter), reading only the rows that hold them."""
    with safe_open(str(path), "pt") as f:
        if not shape or math.prod(shape) <= 2 * SAMPLES:
            flat = f.get_tensor(name).reshape(-1)
            return torch.cat([flat[:SAMPLES], flat[-SAMPLES:]]).to(dtype)
        part = f.get_slice(name)
        rows = math.ceil(SAMPLES / max(1, math.prod(shape[1:])))
        first = part[:rows].reshape(-1)[:SAMPLES]
        last = part[shape[0] - rows :].reshape(-1)[-SAMPLES:]
    return torch.cat([first, last]).to(dtype)


def load_cached(d: Path, tokenizer, dtype: torch.dtype, scheme: str, model: PreTrainedModel) -> Path | None:
    """Fill skeleton `model` (`skeleton`) from folder `d` and the cached `scheme` weights.

    Args:
        d: the checkpoint folder (its safetensors hold the float weights).
        tokenizer: the model's tokenizer (part of the cache key).
        dtype: the load dtype of the non-quantized parameters.
        scheme: ``int8``, ``int4`` or ``w8a8``.
        model: the skeleton, filled in place.

    Returns:
        The cache file the linear layers came from, or None when this path does not apply (no
        cache for this model yet, checkpoint names or shapes not the model's, float32-kept modules,
        a tensor left unread): the caller then discards `model` and loads the ordinary way.
    """
    if getattr(model, "_keep_in_fp32_modules", None):
        return None
    try:
        stored = checkpoint_tensors(d)
    except (SafetensorError, OSError):
        return None
    params = dict(model.named_parameters())
    if any(name not in stored or stored[name][1] != tuple(p.shape) for name, p in params.items()):
        return None

    def ends(name: str, _param) -> torch.Tensor:
        file, shape = stored[name]
        return read_ends(file, name, shape, dtype)

    key = fingerprint(model, tokenizer, ends=ends)
    path = cache_file(d, scheme, key)
    linears = layer_formats(model, scheme)
    tensors = read_cached(path, scheme, key, linears)
    if tensors is None:
        return None
    skipped = {f"{name}.weight" for name in linears}
    table = model.get_input_embeddings().weight if owned(d) else None  # mapped only where never rewritten
    for name, param in params.items():
        if name in skipped:
            continue
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        file, shape = stored[name]
        # the embedding is a lookup once every linear layer (a tied head included) is quantized:
        # mapped, only the rows a prompt reads become resident (`models.tensor_files`)
        value = mapped(file, name, param.dtype) if param is table else None
        if value is None:
            value = read_rows(file, name, shape, param.dtype)
        module._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)
    model.tie_weights()  # a tied output head shares the embedding just read
    install(model, scheme, tensors, path)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        return None
    if (d / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(d, local_files_only=True)
    model.config.name_or_path = str(d)
    return path
