"""Quantized weights cached on disk (safetensors, never pickle), keyed by content and scheme.

A model's linear layers are quantized once (`models.quantize.quantize_tensors`) and saved as
``<checkpoint>/cake-weights/<scheme>-g<group>-<fingerprint>.safetensors`` when the checkpoint is one
of cake-cli's own (a converted GGUF under ``models_dir()``), else under
``models_dir()/weights/``. The fingerprint (`models.fingerprint`, sampled weights + tokenizer +
loaded dtype) names the content, so a changed checkpoint or dtype never reuses a stale file; the
file's metadata repeats scheme, group, fingerprint and format version, and a file whose metadata
or tensors disagree is quantized again (and replaced atomically, `files.write_atomic`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save

from cake_cli.errors import CakeError, first_line
from cake_cli.files import write_atomic
from cake_cli.models.calibration import calibration_text, input_importance
from cake_cli.models.fingerprint import fingerprint
from cake_cli.models.quantize import GROUP, STORED, apply_tensors, layer_formats, quantize_tensors, tensor_names
from cake_cli.models.tensor_files import CopiedTensors
from cake_cli.paths import models_dir, owned

FORMAT = "2"  # bump when the saved layout or the quantizer changes (2: int4 fitted, its output head int8)


def cache_file(checkpoint: Path | None, scheme: str, key: str) -> Path:
    """Where the `scheme` weights of the model with fingerprint `key` are cached (see module doc); a
    scheme built from another's tensors (w8a8 from int8's, `quantize.STORED`) shares its file."""
    inside = checkpoint is not None and owned(checkpoint)
    folder = checkpoint / "cake-weights" if inside else models_dir().resolve() / "weights"
    return folder / f"{STORED.get(scheme, scheme)}-g{GROUP}-{key}.safetensors"


def _importance(model, tokenizer, scheme: str) -> dict | None:
    """The int4 fit's input-channel weights (`models.calibration`); None for int8 or without the text."""
    text = calibration_text() if scheme == "int4" else None
    return None if text is None else input_importance(model, tokenizer, text[1])


def _metadata(scheme: str, key: str) -> dict[str, str]:
    return {"scheme": STORED.get(scheme, scheme), "group": str(GROUP), "fingerprint": key, "format": FORMAT}


def read_cached(path: Path, scheme: str, key: str, formats: dict[str, str]) -> Mapping[str, torch.Tensor] | None:
    """The cached tensors, each read when looked up (`tensor_files.CopiedTensors`: the weights an
    int8 layer keeps as stored are mapped, the rest copied), or None when the file is missing,
    unreadable or not this model's.

    Args:
        formats: the model's `quantize.layer_formats` for `scheme` (the tensors the file must hold).
    """
    if not path.is_file():
        return None
    kept = frozenset(f"{name}.qweight" for name, fmt in formats.items() if fmt == "int8")
    try:
        tensors = CopiedTensors(path, kept)
    except (OSError, ValueError):
        return None
    if tensors.metadata != _metadata(scheme, key) or set(tensors) != tensor_names(formats):
        return None
    return tensors


def install(model, scheme: str, tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """`quantize.apply_tensors` from the tensors of cache file `path` (read as each layer is built).

    Raises:
        CakeError: the file cannot be read now (changed or broken since it was checked), naming it
            and the fix.
    """
    try:
        apply_tensors(model, scheme, tensors)
    except OSError as e:
        raise CakeError(
            f"cannot read the quantized weights in {path}: {first_line(e)}", hint=f"delete {path} and run again"
        ) from None


def quantize_cached(model, tokenizer, checkpoint: Path | None, scheme: str, progress=None) -> tuple[Path, bool, float]:
    """Replace `model`'s linear layers by their `scheme` (int8 | int4 | w8a8) versions, from the cache when it
    holds them, else quantized now and saved.

    Args:
        model, tokenizer: the loaded model (its float weights are what is quantized).
        checkpoint: the folder the weights were read from (decides where the cache lives), or None.
        progress: called with one-line status messages.

    Returns:
        (cache file, read from the cache?, seconds spent).

    Raises:
        CakeError: the cache file cannot be written (disk full, permissions) or read back (`install`),
            naming the fix.
    """
    start = time.perf_counter()
    key = fingerprint(model, tokenizer)
    path = cache_file(checkpoint, scheme, key)
    tensors = read_cached(path, scheme, key, layer_formats(model, scheme))
    hit = tensors is not None
    if tensors is None:
        if progress:
            progress(f"quantizing the linear layers to {STORED.get(scheme, scheme)} once, cached in {path.parent}")
        tensors = quantize_tensors(model, scheme, _importance(model, tokenizer, scheme))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, save(tensors, metadata=_metadata(scheme, key)), "quantized weights")
        except (OSError, SafetensorError) as e:
            raise CakeError(
                f"cannot write the quantized weights to {path.parent}: {first_line(e)}",
                hint="free space there or point CAKE_HOME elsewhere, or run with --weights bf16",
            ) from None
    install(model, scheme, tensors, path)
    return path, hit, time.perf_counter() - start
