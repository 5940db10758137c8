"""Converted checkpoints under ``models_dir()``: where each lives and what it was converted from.

A GGUF is converted once into a lean folder of the weights the CPU runs (`models.lean_gguf`,
``<folder>-lean``) and, only where a run asks for float weights, into a plain float32 checkpoint; a
marker file written last into each folder records the GGUF's name, size and sha256 (and the
embedded model, if it is one) and, for a lean folder, its layout. A folder
counts as converted only when its marker matches the content expected, so a changed GGUF or an
interrupted conversion is never mistaken for a finished one.

- an embedded model: ``models_dir()/<checkpoint_name>`` (e.g. ``smollm2-135m-instruct``);
- any other GGUF: ``models_dir()/gguf/<first 16 hex digits of its sha256>-<bytes>``, so the same
  file under any name or path is converted once.

Light module (no torch): resolving a profile from a path reads only the marker.
"""

from __future__ import annotations

import json
from pathlib import Path

from cake_cli.models.embedded import EMBEDDED_MODELS, EmbeddedModel, match_gguf
from cake_cli.paths import models_dir

MARKER = "cake-conversion.json"


def embedded_dir(em: EmbeddedModel) -> Path:
    """The checkpoint folder of an embedded model."""
    return models_dir() / em.checkpoint_name


def gguf_dir(size: int, sha256: str) -> Path:
    """The checkpoint folder of any other GGUF of ``size`` bytes and hex digest ``sha256``."""
    return models_dir() / "gguf" / f"{sha256[:16]}-{size}"


def lean_dir(float_dir: Path) -> Path:
    """The lean folder (`models.lean_gguf`) of a GGUF whose float checkpoint folder is `float_dir`."""
    return float_dir.with_name(float_dir.name + "-lean")


def folder_files(d: Path) -> dict | None:
    """``{"path", "bytes", "files": [{"name", "bytes"}, …]}`` of folder `d`, largest file first (for
    ``cake env``), or None when it does not exist."""
    if not d.is_dir():
        return None
    sizes = [(str(f.relative_to(d)), f.stat().st_size) for f in d.rglob("*") if f.is_file()]
    sizes.sort(key=lambda item: (-item[1], item[0]))
    files = [{"name": name, "bytes": size} for name, size in sizes]
    return {"path": str(d), "bytes": sum(size for _, size in sizes), "files": files}


def marker(gguf_file: str, size: int, sha256: str, em: EmbeddedModel | None = None) -> dict:
    """The marker's content for a conversion of ``gguf_file`` (a name), ``size`` bytes, ``sha256``."""
    return {
        "gguf_file": gguf_file,
        "gguf_bytes": size,
        "gguf_sha256": sha256,
        "embedded": em.source if em else None,
        "dtype": "float32",
        "on_demand": True,  # converted for a run that asked for float weights (older ones lack it)
    }


def lean_marker(gguf_file: str, size: int, sha256: str, em: EmbeddedModel | None = None) -> dict:
    """The marker of a lean folder (`models.lean_gguf`): `marker`'s fields, its layout, no float dtype."""
    fields = {**marker(gguf_file, size, sha256, em), "dtype": None, "layout": "lean"}
    del fields["on_demand"]
    return fields


def read_marker(d: Path) -> dict | None:
    """The marker of folder ``d``, or None (no marker, unreadable, not a JSON object)."""
    try:
        data = json.loads((d / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_converted(d: Path, size: int, sha256: str, layout: str | None = None) -> bool:
    """Whether ``d`` holds a finished conversion of the GGUF of ``size`` bytes and ``sha256``: a float
    checkpoint (`layout` None) or a lean folder (`layout` ``"lean"``)."""
    m = read_marker(d)
    same = m is not None and m.get("gguf_bytes") == size and m.get("gguf_sha256") == sha256
    return same and m.get("layout") == layout


def embedded_of_dir(d: Path) -> EmbeddedModel | None:
    """The embedded model a converted folder ``d`` holds, by its marker (the same content), or None."""
    m = read_marker(d) or {}
    em = EMBEDDED_MODELS.get(m.get("embedded") or "")
    return em if em is not None and is_converted(d, em.gguf_size, em.gguf_sha256, m.get("layout")) else None


def embedded_of_path(path: Path) -> EmbeddedModel | None:
    """The embedded model behind a local path given as ``--model``: a folder converted from it, or a
    GGUF file with its exact content (hashed only when its size matches). None otherwise."""
    if path.is_dir():
        return embedded_of_dir(path)
    if path.suffix.lower() == ".gguf" and path.is_file():
        return match_gguf(path)
    return None
