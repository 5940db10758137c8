"""The .cake file: a compressed document prefix saved by `cake compress`, read without torch.

Format (version `FORMAT_VERSION` = 6): one safetensors file. Tensors, per layer i: ``positions.i``
[H_kv, len_i] int16 (int32 past 32767 positions): each kept token's true position; and its keys and
values, at the file's ``kv_bits``:

- 16: ``keys.i`` and ``values.i`` [H_kv, len_i, d] (rotated keys and values in the model's dtype);
- 8, 4 or 2 (`engine.kvquant`, KIVI's grouped affine layout): ``keys.i.codes`` / ``values.i.codes`` uint8
  (two 4-bit or four 2-bit codes a byte), ``.scale`` and ``.zero`` float16 per group of ``kv_group``
  entries (keys: per channel, groups along the tokens; values: per token, groups along the channels),
  ``.recent`` the newest ``kv_recent`` tokens in the model's dtype (the observation window: never
  quantized), and from version 5 ``.sink`` the first ``kv_sink`` tokens in the model's dtype (the
  attention sinks; absent when ``kv_sink`` is 0). From version 6 the values' groups span ``kv_value_group``
  channels (before: ``kv_group``), and with ``kv_rotation`` "hadamard" the value codes are of the values
  multiplied by the block-diagonal Hadamard matrix whose blocks are the value groups (a power of 2 dividing
  the head dimension; `engine.kvquant.rotate`), undone when they are dequantized.
  A loaded file keeps these parts in memory for its global, non-ragged layers (`engine.kvmemory`); local
  and ragged layers are dequantized to the model's dtype.

For H2O also ``scores.i`` [H_kv, len_i] float32, each token's accumulated attention (`engine.cache`).
From version 4, a layer whose KV heads keep different numbers of tokens (``--allocation global``,
`engine.headlengths`) also has ``starts.i`` [H_kv] int32, each head's first live slot: its tensors are
padded at the front to its longest head (zeros at position -1), and its metadata layer lists ``heads``,
the tokens each KV head keeps. Versions 1-3 have neither and load as before. Version 5 adds 2-bit codes and
the sink tokens (``kv_sink``); versions 1-4 read as ``kv_sink`` 0, and a 2-bit file claiming an older
version is refused as corrupt. Version 6 adds ``kv_value_group`` and ``kv_rotation``; versions 1-5 read as
value groups of ``kv_group`` and no rotation, and an older file that names a rotation is refused as corrupt.

The safetensors header's ``__metadata__`` holds one key, ``cake_cli``: a JSON object with every
`CacheMeta` field (format and cake-cli versions, model and its fingerprint, dtype, method, the
scoring, the budget, window, taus, per-layer budgets and statistics, the KV bits, group and recent
tokens, the prefix token ids, the document and where it came from, prefill seconds and KV bytes) and
``sha256``, the checksum of everything else in the file (`file_sha256`: that metadata, the tensor
table and the tensor data), so an edited budget or kept count is refused like a flipped tensor byte.
safetensors holds raw numbers only: reading a .cake runs no code (no pickle). Files are written
atomically (`cake_cli.files`).

Versions 1 and 2 (their ``data_sha256`` covers the tensor data only; version 1 has no ``kv_*``
fields: 16-bit tensors, as version 2 at 16 bits) still load; a version this build does not know is
refused in one line with the command that remakes the file (`check_version`).

Everything here is light (json, hashlib): the command line checks a .cake (truncated, corrupt,
another format version, options that contradict it) before torch loads.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from cake_cli.engine.config import KV_BITS
from cake_cli.errors import CakeError

FORMAT = "cake-cli-cache"
FORMAT_VERSION = 6  # 6: value groups and rotation; 5: 2-bit codes, sink tokens; 4: per-KV-head lengths; 3: checksum
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)  # 1: no kv_* fields (16-bit keys and values, the same tensors)
CHECKSUM = "sha256"  # the metadata field holding `file_sha256` (version 3)
SUFFIX = ".cake"
ROTATION = "hadamard"  # format 6: `kv_rotation` of rotated values (`engine.kvquant.rotate`)
META_KEY = "cake_cli"
SCORINGS = ("question", "end", "instruction", "reconstruct")  # how the document is scored (`tasks.saved.compress`)
DEFAULT_SCORING = "question"  # the only one that keeps question-aware quality (benchmarks/cache.md)


@dataclass(frozen=True)
class LayerMeta:
    """One layer after compression (Eqs. 3-7): statistics (None when n <= w), budget B_l, tokens kept."""

    budget: int | None
    kept: int
    dispersion: float | None
    shift: float | None
    log_preference: float | None  # None stands for -inf (P_l = 0) as well as "not computed"
    heads: list[int] | None = None  # format 4: tokens kept per KV head when they differ (--allocation global)


@dataclass(frozen=True)
class CacheMeta:
    """Everything a .cake says about itself besides the tensors (JSON in the safetensors header)."""

    format: str
    format_version: int
    cake_cli_version: str
    created: str  # ISO 8601, UTC
    model: str  # the --model it was made with: a profile name, or an absolute path
    model_name: str  # display name
    profile: str | None
    fingerprint: str  # `models.fingerprint` of the weights and tokenizer
    dtype: str  # torch dtype name of the keys and values, e.g. "float32"
    device: str
    method: str
    allocation: str | None  # None: --method full
    indicator: str | None
    budget: int | None  # B, tokens per layer (None: --method full)
    window: int | None
    tau1: float | None
    tau2: float | None
    tau_rule: str
    gamma: float | None
    pool_kind: str | None
    pool_kernel: int | None
    scoring: str  # "question" (kept whole, scored when asked), "end", "instruction", "reconstruct"; "none": full
    probe_ids: list[int]  # the instruction's (or the reconstruction's repeat prompt's) tokens, scored then dropped
    evicted: bool
    layers: list[LayerMeta]
    prefix_ids: list[int]  # the shared prompt prefix (chat opening + document block)
    source: str  # the document as given ("<stdin>" for stdin)
    kind: str  # "pdf" or "text"
    page_offsets: list[int]
    text: str  # the document text (for needle locations)
    prompt_text: str | None  # the document as used in the prefix when middle-truncated, else None
    document_tokens: int
    original_document_tokens: int
    prefill_seconds: float  # what the prefill of the prefix cost when it was compressed
    eviction_seconds: float
    kv_bytes: int  # KV bytes of the compressed prefix, measured from the tensors
    kv_bytes_full: int  # the prefix's full cache
    kv_peak: int  # largest total during that prefill
    data_sha256: str = ""  # versions 1-2: of the safetensors data section only ("" from version 3)
    # format 2 (`V2_DEFAULTS`: what a version 1 file means):
    kv_bits: int = 16  # bits per saved key/value: 16 = the model's dtype, 8 / 4 / 2 = grouped affine (`engine.kvquant`)
    kv_group: int | None = None  # entries per quantization group (None at 16 bits)
    kv_recent: int = 0  # newest tokens of each layer kept in the model's dtype when quantized
    kv_sink: int = 0  # format 5: first tokens of each layer kept in the model's dtype when quantized (`.sink` parts)
    kv_value_group: int | None = None  # format 6: channels per value group (None: kv_group, as versions 1-5)
    kv_rotation: str | None = None  # format 6: "hadamard" when the values were rotated before quantizing
    kv_bytes_file: int | None = None  # bytes of the saved keys and values (codes, scales, zeros, recent), measured
    sha256: str = ""  # version 3: `file_sha256` of the file, metadata and tensor table included (set when saving)

    @property
    def whole(self) -> bool:
        """The prefix was kept whole (scoring "question", or --method full): every task evicts it with
        its own question in the observation window, at its own budget, method and window."""
        return self.scoring == "question" or self.method == "full"

    def value_coding(self) -> dict:
        """The keyword arguments `engine.cachefile` takes for how this file's values are coded: value_group
        (channels per group) and rotated (`kv_rotation` is "hadamard")."""
        return {"value_group": self.kv_value_group or self.kv_group, "rotated": self.kv_rotation == ROTATION}

    @property
    def used_text(self) -> str:
        """The document text the prefix was rendered from."""
        return self.text if self.prompt_text is None else self.prompt_text

    def to_json(self) -> str:
        """The metadata as one JSON object (the value of `META_KEY`)."""
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: dict) -> CacheMeta:
        """Build from the header's JSON object.

        Raises:
            KeyError / TypeError: a field missing or of the wrong shape.
        """
        optional = {"data_sha256", CHECKSUM, *V2_DEFAULTS}
        values = {f.name: data[f.name] for f in fields(cls) if f.name not in optional}
        values["layers"] = [LayerMeta(**layer) for layer in values["layers"]]
        sums = {name: str(data.get(name, "")) for name in ("data_sha256", CHECKSUM)}
        return cls(**values, **sums, **v2_fields(data))


@dataclass(frozen=True)
class SavedCache:
    """A .cake file checked by `read_saved` (header, size, checksum, format version)."""

    path: Path
    meta: CacheMeta
    file_bytes: int
    seconds: float = 0.0  # reading and checking it (header, size, checksum)

    @property
    def name(self) -> str:
        """The file's name, for messages."""
        return self.path.name


def is_cache_path(document: str) -> bool:
    """True when a document argument names a saved cache (its name ends in .cake)."""
    return document != "-" and document.lower().endswith(SUFFIX)


def _again(meta_source: str | None, path: Path) -> str:
    source = meta_source if meta_source and meta_source != "<stdin>" else "DOCUMENT"
    return f"compress the document again: cake compress {source} -o {path}"


def split_file(blob: bytes, path: Path) -> tuple[dict, int]:
    """The safetensors header (JSON) and where the data starts, checking that the data covers the file.

    Raises:
        CakeError: truncated, not a safetensors file, or bytes past the last tensor.
    """
    broken = CakeError(f"{path} is not a saved cake-cli cache (no readable header)", _again(None, path))
    if len(blob) < 8:
        raise CakeError(f"{path} is truncated ({len(blob)} bytes)", _again(None, path))
    if len(blob) > 8 and blob[8:9] != b"{":  # a safetensors header is JSON right after its 8-byte length
        raise broken
    size = int.from_bytes(blob[:8], "little")
    if size > len(blob) - 8:
        raise CakeError(
            f"{path} is truncated ({len(blob)} bytes, its header alone says {size + 8})", _again(None, path)
        )
    try:
        header = json.loads(blob[8 : 8 + size].decode("utf-8"))
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, IndexError, AttributeError):
        raise broken from None
    if 8 + size + end != len(blob):
        what = "truncated" if 8 + size + end > len(blob) else "damaged (bytes after the last tensor)"
        raise CakeError(f"{path} is {what}: {len(blob)} bytes, its header says {8 + size + end}", _again(None, path))
    return header, 8 + size


def read_saved(path: str | Path) -> SavedCache:
    """Read and check a .cake file's header, size and checksum (no torch).

    Raises:
        CakeError (exit 1): missing or unreadable, truncated, corrupt (header or checksum), not made
            by cake-cli, or another format version; each with the fix.
    """
    path, start_time = Path(path).expanduser(), time.perf_counter()
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise CakeError(f"no such file: {path}", "give a .cake file written by `cake compress`") from None
    except OSError as exc:
        raise CakeError(f"cannot read {path} ({exc.strerror or exc})") from None
    header, start = split_file(blob, path)
    raw = (header.get("__metadata__") or {}).get(META_KEY) if isinstance(header.get("__metadata__"), dict) else None
    try:
        data = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CakeError(f"{path} is a safetensors file but not a saved cake-cli cache", _again(None, path))
    check_version(data, path)
    check_checksum(header, data, blob[start:], path)
    try:
        meta = CacheMeta.from_json(data)
    except (KeyError, TypeError) as exc:
        raise CakeError(f"{path} is corrupt (metadata field {exc} missing or malformed)", _again(None, path)) from None
    check_quantization(meta, path)
    return SavedCache(path, meta, len(blob), time.perf_counter() - start_time)


def check_checksum(header: dict, meta: dict, data: bytes, path: Path) -> None:
    """Refuse a file whose checksum does not match: from version 3 over the metadata, the tensor table
    and the data (`file_sha256`); versions 1-2 recorded the data's only (`data_sha256`).

    Raises:
        CakeError (exit 1): corrupt or edited, with the command that remakes the file.
    """
    if meta.get("format_version", 0) >= 3:
        if file_sha256(header, meta, data) == meta.get(CHECKSUM):
            return
        what = "corrupt or edited: its metadata or tensors do not match their checksum"
    else:
        if hashlib.sha256(data).hexdigest() == meta.get("data_sha256"):
            return
        what = "corrupt: its tensors do not match their checksum"
    raise CakeError(f"{path} is {what}", _again(meta.get("source"), path))


def _canonical(value) -> bytes:
    """One byte string per JSON value (sorted keys, no spaces), however the file's JSON was written."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def file_sha256(header: dict, meta: dict, data: bytes) -> str:
    """The checksum a version 3 .cake stores in its metadata's `sha256`: sha256 over the metadata
    (every field but `sha256` itself), the tensor table (names, dtypes, shapes, offsets) and the
    tensor data.

    Args:
        header: the safetensors header (JSON object); its `__metadata__` is left out (`meta` is it).
        meta: the metadata object (`CacheMeta.to_json`, parsed).
        data: the data section, bytes.
    """
    table = {name: entry for name, entry in header.items() if name != "__metadata__"}
    digest = hashlib.sha256()
    for part in (_canonical({k: v for k, v in meta.items() if k != CHECKSUM}), b"\0", _canonical(table), b"\0"):
        digest.update(part)
    digest.update(data)
    return digest.hexdigest()


def blob_sha256(blob: bytes) -> str:
    """`file_sha256` of a safetensors file written with a `META_KEY` metadata (what `read_saved` checks)."""
    header, start = split_file(blob, Path("<new .cake>"))
    return file_sha256(header, json.loads(header["__metadata__"][META_KEY]), blob[start:])


# ---- format version 2: versions, KV bits ------------------------------------------------------------

V2_DEFAULTS = {  # what a version 1 file means (versions 2-4: no kv_sink; 2-5: no value group, no rotation)
    "kv_bits": 16, "kv_group": None, "kv_recent": 0, "kv_bytes_file": None, "kv_sink": 0,
    "kv_value_group": None, "kv_rotation": None,
}  # fmt: skip


def v2_fields(data: dict) -> dict:
    """The format-2 fields of a header's JSON object (and the later kv_* ones), `V2_DEFAULTS` for those an older
    file lacks (version 1: all; versions 2-4: `kv_sink`, no sink tokens; 2-5: value group and rotation)."""
    return {name: data.get(name, default) for name, default in V2_DEFAULTS.items()}


def check_version(data: dict, path: Path) -> None:
    """Refuse a format version this build cannot read (one line, with the command that remakes the file).

    Raises:
        CakeError (exit 1): a newer version (made by a newer cake-cli) or an unknown one.
    """
    version = data.get("format_version")
    if version in READABLE_VERSIONS:
        return
    made = f"made by cake-cli {data.get('cake_cli_version', '?')}"
    newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
    what = "newer than this cake-cli reads" if newer else "not one this cake-cli reads"
    raise CakeError(
        f"{path} has cache format version {version!r} ({made}), {what} (versions "
        f"{', '.join(map(str, READABLE_VERSIONS))})",
        ("upgrade cake-cli, or " if newer else "") + _again(data.get("source"), path),
    )


def _positive(n) -> bool:
    """n is an int >= 1 (not a bool)."""
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1


def check_quantization(meta: CacheMeta, path: Path) -> None:
    """Refuse KV bits, group or recent-token settings no cake-cli writes (a damaged or hand-made header).

    Raises:
        CakeError (exit 1): naming the setting, with the command that remakes the file.
    """
    bits, group, recent, sink = meta.kv_bits, meta.kv_group, meta.kv_recent, meta.kv_sink
    value_group, rotation = meta.kv_value_group, meta.kv_rotation
    bad_group = bits != 16 and not _positive(group)
    bad_group |= value_group is not None and (bits == 16 or meta.format_version < 6 or not _positive(value_group))
    counts = (recent, sink)
    bad_count = any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in counts)
    old_two = bits == 2 and meta.format_version < 5  # 2-bit codes came with format 5
    bad_rotation = rotation not in (None, ROTATION)
    bad_rotation |= rotation is not None and (bits == 16 or meta.format_version < 6)
    g = meta.value_coding()["value_group"]
    bad_rotation |= rotation is not None and _positive(g) and g & (g - 1) != 0  # a block is one group of 2^k
    if bits not in KV_BITS or bad_group or bad_count or old_two or bad_rotation:
        raise CakeError(
            f"{path} is corrupt: its KV quantization settings (bits {bits!r}, group {group!r}, recent {recent!r}, "
            f"sink {sink!r}, value group {value_group!r}, rotation {rotation!r}) are not ones cake-cli writes "
            f"(bits {', '.join(map(str, KV_BITS))})",
            _again(meta.source, path),
        )
