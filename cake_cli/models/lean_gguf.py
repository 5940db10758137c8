"""A GGUF converted once straight into the weights the CPU runs, and loaded by mapping them.

The float path converts a GGUF into a float32 checkpoint (2.5 GB for the default model's 491 MB
GGUF) and quantizes that again for decoding. For `--weights int8|w8a8|int4` on a CPU this module
writes only what runs, into a *lean folder* beside where the float checkpoint would be
(``<checkpoint>-lean``, `checkpoints.lean_dir`):

- config.json, generation_config.json and the tokenizer (read from the GGUF's metadata), and the
  marker (`checkpoints.MARKER`, with ``"layout": "lean"``) written last;
- ``int8.safetensors`` (int8 and w8a8 runs) or ``int4.safetensors``: every linear layer quantized
  from its GGUF tensor dequantized to float32 one tensor at a time (`gguf_tensors`), the output head
  a block of rows at a time; norms and biases in float32; the input embedding in the GGUF's own
  blocks (`block_embedding`). Written tensor by tensor (`tensor_writer`), so the conversion holds
  one float32 tensor (or block of rows) at a time, never the model.

The int8 values are those `quantize.quantize_int8` gives the float32 checkpoint's weights: a model
loaded in float32 computes exactly what the float path's int8 computes. A bf16 model differs by
one rounding: the float path quantized the bf16-rounded weights, this path the float32 ones.

A load (`load`) builds the model on the meta device, maps the int8 codes and the embedding's blocks
from the file (only pages a run touches become resident) and copies the small tensors. int4's fit
weighs input channels by their importance on a calibration text (`models.calibration`), measured
through the int8 model, so int4 converts int8 first.

Families whose input embedding is not a plain ``nn.Embedding`` (Gemma scales it) and tensors this
path cannot map are refused by `supports`: those load the float way.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from cake_cli.cores import usable_cores
from cake_cli.models import lean_load
from cake_cli.models.block_embedding import BlockEmbedding
from cake_cli.models.calibration import calibration_text, input_importance
from cake_cli.models.gguf_tensors import GgufTensors, one_parse
from cake_cli.models.heap import release_freed_memory
from cake_cli.models.quantize import GROUP, STORED, apply_tensors, layer_formats, quantize_int4, quantize_int8
from cake_cli.models.tensor_files import CopiedTensors, entries
from cake_cli.models.tensor_writer import TensorWriter

Progress = Callable[[str], None] | None
LAYOUT = "lean"
FORMAT = "1"  # bump when the lean file's layout or the quantizer changes
BLOCKS = ".blocks"  # suffix of the embedding's stored blocks, after the embedding module's name
ROW_BLOCK = 8192  # rows of a large tensor dequantized and quantized at a time (~30 MB of float32 at 896)


def weights_file(folder: Path, scheme: str) -> Path:
    """The file holding `scheme`'s weights in lean folder `folder` (w8a8 reads int8's)."""
    return folder / f"{STORED[scheme]}.safetensors"


def write_base(gguf: Path, out: Path, eos: tuple[int, ...] = ()) -> None:
    """Write config.json, generation_config.json and the tokenizer of `gguf` into folder `out`.

    Raises:
        OSError, ValueError, KeyError, TypeError: transformers cannot read the GGUF's metadata.
    """
    kw = dict(gguf_file=gguf.name, local_files_only=True)
    with one_parse():
        config = AutoConfig.from_pretrained(gguf.parent, **kw)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    config.dtype = torch.float32  # what the stored float tensors are
    generation = GenerationConfig.from_model_config(config)
    if eos:
        generation.eos_token_id = list(eos)
    config.save_pretrained(out)
    generation.save_pretrained(out)
    tokenizer.save_pretrained(out)


def supports(shell) -> str | None:
    """Why model `shell` (`lean_load.skeleton`) cannot use the lean layout, or None when it can."""
    embedding = shell.get_input_embeddings()
    if type(embedding) is not nn.Embedding:
        return f"its input embedding is a {type(embedding).__name__}, not a plain lookup"
    if getattr(shell, "_keep_in_fp32_modules", None):
        return "it keeps modules in float32"
    return None


def _names(shell) -> tuple[str, dict[str, nn.Parameter]]:
    """(the input embedding's parameter name, {name: parameter} of `shell`, tied ones once)."""
    params = dict(shell.named_parameters())
    table = shell.get_input_embeddings().weight
    return next(name for name, p in params.items() if p is table), params


def convert_weights(
    gguf: Path, folder: Path, scheme: str, sha256: str, progress: Progress = None, importance: dict | None = None
) -> Path:
    """Write `scheme`'s weights file into lean folder `folder` (its config already written) from `gguf`.

    Args:
        gguf: the GGUF file (checked by the caller).
        folder: the lean folder (config.json read from it).
        scheme: ``int8`` / ``w8a8`` (both write int8's file) or ``int4``.
        sha256: the GGUF's hex digest, recorded in the file's metadata.
        importance: {linear layer name: [K] input-channel importance} for int4's fit, or None.

    Returns:
        The file written.

    Raises:
        ValueError: a tensor of the model has no tensor in the GGUF, or one that does not fit.
        OSError: the file cannot be written (disk full).
    """
    stored = STORED[scheme]
    start = time.perf_counter()
    shell = lean_load.skeleton(folder, torch.float32, None)
    with one_parse():
        source = GgufTensors(gguf, shell, json.loads((folder / "config.json").read_text(encoding="utf-8")))
    release_freed_memory()
    table, params = _names(shell)
    formats = layer_formats(shell, stored)
    tied = getattr(shell.config, "tie_word_embeddings", False)
    origin = {}
    for name in formats:
        weight = f"{name}.weight"
        head = shell.get_output_embeddings() is shell.get_submodule(name)
        origin[name] = weight if weight in source else table if head and tied else None
        if origin[name] is None:
            raise ValueError(f"the GGUF has no tensor for {weight}")
    plain = {name: p for name, p in params.items() if name != table and name.rpartition(".")[0] not in formats}
    plain.update({n: p for n, p in params.items() if n.endswith(".bias") and n.rpartition(".")[0] in formats})
    for name, p in plain.items():
        if name not in source or source.shape(name) != tuple(p.shape):
            raise ValueError(f"the GGUF has no tensor of shape {tuple(p.shape)} for {name}")
    blocks = source.blocks(table)
    plan: dict = {n: (torch.float32, tuple(p.shape)) for n, p in plain.items()}
    plan[table.rpartition(".")[0] + BLOCKS] = (torch.uint8, tuple(blocks.data.shape))
    for name, fmt in formats.items():
        n, k = shell.get_submodule(name).weight.shape
        if fmt == "int8":
            plan[f"{name}.qweight"], plan[f"{name}.scales"] = (torch.int8, (n, k)), (torch.float32, (n,))
        else:
            plan[f"{name}.nibbles"] = (torch.uint8, (n, k // 2))
            plan[f"{name}.scale_zero"] = (torch.float32, (k // GROUP, n, 2))
    metadata = {"scheme": stored, "group": str(GROUP), "format": FORMAT, "gguf_sha256": sha256}
    metadata["embedding"] = blocks.kind  # the GGML type `BlockEmbedding` decodes
    if progress:
        progress(f"writing the {stored} weights the CPU runs, one tensor at a time ({len(formats)} linear layers)…")
    path = weights_file(folder, scheme)
    jobs = _jobs(source, plain, formats, origin, importance or {})
    with TensorWriter(path, plan, metadata) as writer, ThreadPoolExecutor(_workers()) as pool:
        writer.write(table.rpartition(".")[0] + BLOCKS, torch.from_numpy(blocks.data.copy()))
        for writes in _ahead(pool, jobs, depth=_workers()):
            for name, tensor, row in writes:
                writer.write(name, tensor, row=row)
            source.release()
        writer.finish()
    if progress:
        seconds, size = time.perf_counter() - start, path.stat().st_size
        progress(f"{stored} weights written in {seconds:.0f} s ({size / 1e6:.0f} MB)")
    return path


Writes = list[tuple[str, torch.Tensor, int]]  # (planned tensor name, value, first row) for `TensorWriter.write`


def _jobs(source: GgufTensors, plain: dict, formats: dict[str, str], origin: dict, importance: dict) -> list:
    """The conversion as independent steps, each a callable returning the `Writes` of one tensor (or
    of one block of rows of a large one): dequantize from the GGUF, quantize, nothing shared."""

    def copied(name: str) -> Writes:
        return [(name, source.full(name), 0)]

    def int8_rows(name: str, src: str, first: int, stop: int) -> Writes:
        q, s = quantize_int8(source.rows(src, first, stop))
        return [(f"{name}.qweight", q, first), (f"{name}.scales", s, first)]

    def int8_full(name: str, src: str) -> Writes:
        q, s = quantize_int8(source.full(src))
        return [(f"{name}.qweight", q, 0), (f"{name}.scales", s, 0)]

    def int4_full(name: str, src: str) -> Writes:
        nibbles, scale_zero = quantize_int4(source.full(src), importance=importance.get(name))
        return [(f"{name}.nibbles", nibbles, 0), (f"{name}.scale_zero", scale_zero, 0)]

    jobs = [partial(copied, name) for name in plain]
    for name, fmt in formats.items():
        src = origin[name]
        if fmt == "int8" and source.row_safe(src):
            rows = source.shape(src)[0]
            jobs += [partial(int8_rows, name, src, i, min(rows, i + ROW_BLOCK)) for i in range(0, rows, ROW_BLOCK)]
        else:
            jobs.append(partial(int8_full if fmt == "int8" else int4_full, name, src))
    return jobs


def _workers() -> int:
    """Conversion steps run at once: one per usable core, at most 4 (each holds one float32 tensor)."""
    return min(4, usable_cores())


def _ahead(pool: ThreadPoolExecutor, jobs: list, depth: int) -> Iterator:
    """The results of `jobs` in order, at most `depth` of them computed ahead of the one handed out.

    gguf-py's dequantization is numpy and the quantization torch; both release the GIL in their
    kernels, so steps overlap on the cores while the writes stay in order on the caller's thread.
    Bounding the steps in flight bounds the memory: `depth` float32 tensors at most.
    """
    pending: deque = deque()
    try:
        for job in jobs:
            pending.append(pool.submit(job))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


def importance_through(model, tokenizer) -> dict | None:
    """int4's input-channel importance (`models.calibration`) measured through a loaded model (the
    int8 one), or None without the calibration text."""
    text = calibration_text()
    return None if text is None else input_importance(model, tokenizer, text[1])


def weights_ready(folder: Path, scheme: str, sha256: str) -> bool:
    """Whether lean folder `folder` holds `scheme`'s weights file of this format for the GGUF of
    digest `sha256` (its header read, no tensor): a missing or stale file is converted again."""
    try:
        fd = os.open(weights_file(folder, scheme), os.O_RDONLY)
    except OSError:
        return False
    try:
        meta = entries(fd)[1]
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)
    return (meta.get("scheme"), meta.get("format"), meta.get("gguf_sha256")) == (STORED[scheme], FORMAT, sha256)


def read_weights(folder: Path, scheme: str, sha256: str, formats: dict[str, str]) -> CopiedTensors | None:
    """The lean file's tensors (int8 codes and embedding blocks mapped, the rest copied on lookup),
    or None when the file is missing or is not this GGUF's `scheme` file of this format.

    Raises:
        OSError: the file exists but cannot be opened.
    """
    path = weights_file(folder, scheme)
    if not path.is_file():
        return None
    kept = frozenset(f"{name}.qweight" for name, fmt in formats.items() if fmt == "int8")
    try:
        tensors = CopiedTensors(path, kept | {name for name in _block_names(path)})
    except ValueError:
        return None
    meta = tensors.metadata
    if (meta.get("scheme"), meta.get("format"), meta.get("gguf_sha256")) != (STORED[scheme], FORMAT, sha256):
        return None
    return tensors


def _block_names(path: Path) -> list[str]:
    """Names of the embedding-block tensors in lean file `path` (mapped, not copied)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return [name for name in header if name.endswith(BLOCKS)]


def load(folder: Path, scheme: str, sha256: str, dtype: torch.dtype, attn_implementation: str | None):
    """(model, tokenizer) from lean folder `folder` with `scheme`'s linear layers, or (None, tokenizer)
    when its weights file is missing or stale (the caller converts it, then loads again).

    Args:
        scheme: ``int8``, ``w8a8`` or ``int4``.
        sha256: the GGUF's digest the file must record.
        dtype: the compute dtype (norms, biases and looked-up embedding rows are cast to it).

    Raises:
        OSError: the weights file cannot be read. KeyError: it lacks a tensor the model needs.
    """
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    shell = lean_load.skeleton(folder, dtype, attn_implementation)
    formats = layer_formats(shell, scheme)
    tensors = read_weights(folder, scheme, sha256, formats)
    if tensors is None:
        return None, tokenizer
    table, params = _names(shell)
    for name in params:
        module_name, _, attr = name.rpartition(".")
        if name == table or (module_name in formats and attr == "weight"):
            continue
        value = tensors[name].to(dtype)
        shell.get_submodule(module_name)._parameters[attr] = nn.Parameter(value, requires_grad=False)
    embedding = shell.get_input_embeddings()
    blocks = tensors[table.rpartition(".")[0] + BLOCKS]
    shell.set_input_embeddings(BlockEmbedding(blocks, tensors.metadata["embedding"], embedding.embedding_dim, dtype))
    apply_tensors(shell, scheme, tensors)
    left = [n for n, t in [*shell.named_parameters(), *shell.named_buffers()] if t.is_meta]
    if left:
        raise KeyError(f"{weights_file(folder, scheme)} leaves {left[0]} unset")
    if (folder / "generation_config.json").is_file():
        shell.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    shell.config.name_or_path = str(folder)
    return shell.eval(), tokenizer
