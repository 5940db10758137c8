"""Compressed document prefixes in memory (`Compressed`) and on disk (.cake files: `save`, `load`).

The file format and its light checks are in `tasks.saved.fileformat`; compressing and answering in
`tasks.saved.compress`. Loading checks what the light checks cannot: the model's fingerprint (weights
and tokenizer, `models.fingerprint`) and that the tensors fit this model.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from cake_cli import __version__
from cake_cli.engine.cachefile import cache_from_tensors, cache_tensors, quantized_in_memory, value_coding_of
from cake_cli.engine.cascade import LayerStats
from cake_cli.engine.config import DEFAULT_KV_GROUP, DEFAULT_KV_SINK, KV_BITS
from cake_cli.engine.continuation import SavedCascade
from cake_cli.engine.families import attention_layout
from cake_cli.engine.generate import Prefilled
from cake_cli.engine.indicators import accumulates
from cake_cli.engine.kvquant import DamagedTensorError, entry_bytes
from cake_cli.errors import CakeError
from cake_cli.files import write_atomic
from cake_cli.models.fingerprint import fingerprint
from cake_cli.models.profiles import model_spec
from cake_cli.tasks.request import Callbacks, Plan
from cake_cli.tasks.results import BITS_GIVEN, CompressResult, human_bytes, summary_fields
from cake_cli.tasks.runner import ReadyModel, ready_model
from cake_cli.tasks.saved.fileformat import (
    FORMAT,
    FORMAT_VERSION,
    META_KEY,
    ROTATION,
    CacheMeta,
    LayerMeta,
    blob_sha256,
)
from cake_cli.tasks.threads import Threads, choose

DEFAULT_RECENT = 32  # tokens kept in the model's dtype when a --method full prefix (no window) is quantized


@dataclass
class Compressed:
    """A compressed document prefix ready for continuations (from a .cake file or compressed now)."""

    ready: ReadyModel
    meta: CacheMeta
    state: Prefilled  # never changed: every answer continues a copy
    path: Path | None  # the .cake it was read from (None: compressed in this run)
    file_bytes: int | None
    read_seconds: float  # reading + checking the file now (0 when compressed in this run)
    warnings: list[str]  # about the document as compressed (e.g. middle-truncated); every answer carries them
    threads: Threads | None = None  # the threads it was compressed with (None: read from a file)


def _layers(state: Prefilled) -> list[LayerMeta]:
    out = []
    for row in state.rows():
        stats = row.stats
        log_p = stats.log_preference if stats and stats.log_preference != float("-inf") else None
        heads = None if row.heads is None else list(row.heads)
        out.append(LayerMeta(row.budget, row.kept, stats and stats.dispersion, stats and stats.shift, log_p, heads))
    return out


def saved_cascade(meta: CacheMeta) -> SavedCascade:
    """The per-layer statistics and final budgets the file records, for reports and decoding."""
    stats = [
        None
        if m.dispersion is None
        else LayerStats(m.dispersion, m.shift, float("-inf") if m.log_preference is None else m.log_preference)
        for m in meta.layers
    ]
    budgets = [m.budget for m in meta.layers] if meta.evicted else None
    return SavedCascade(stats, budgets, meta.evicted)


def build_meta(plan: Plan, ready: ReadyModel, state: Prefilled, prefix, scoring: str, probe: list[int]) -> CacheMeta:
    """The metadata of a prefix just compressed: `state` after the cascade (probe dropped), `prefix` the
    `templates.Prompt` of the prefix, `probe` the scoring probe's ids ([] for `end`). Bytes measured
    from the cache tensors; the model's --model value is kept as given (a path made absolute)."""
    loaded, request, config, doc = ready.loaded, plan.request, plan.config, plan.doc
    spec = model_spec(request.model)
    spec = str(Path(spec).expanduser().resolve()) if Path(spec).expanduser().exists() else spec
    evicts = plan.evicts
    return CacheMeta(
        format=FORMAT,
        format_version=FORMAT_VERSION,
        cake_cli_version=__version__,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        model=spec,
        model_name=loaded.name,
        profile=loaded.profile.name if loaded.profile else None,
        fingerprint=fingerprint(loaded.model, loaded.tokenizer),
        dtype=str(loaded.dtype).replace("torch.", ""),
        device=str(loaded.device),
        method=request.method,
        allocation=config.allocation if evicts else None,
        indicator=config.indicator if evicts else None,
        budget=config.budget if evicts else None,
        window=config.window if evicts else None,
        tau1=config.tau1 if evicts else None,
        tau2=config.tau2 if evicts else None,
        tau_rule=plan.tau_rule if evicts else "",
        gamma=config.gamma if evicts else None,
        pool_kind=config.pool_kind if evicts else None,
        pool_kernel=config.pool_kernel if evicts else None,
        scoring=scoring if evicts else "none",
        probe_ids=probe,
        evicted=bool(state.cascade is not None and state.cascade.evicting),
        layers=_layers(state),
        prefix_ids=list(prefix.input_ids),
        source=doc.source,
        kind=doc.kind,
        page_offsets=list(doc.page_offsets),
        text=doc.text,
        prompt_text=None if prefix.document_text == doc.text else prefix.document_text,
        document_tokens=prefix.document_tokens,
        original_document_tokens=prefix.original_document_tokens,
        prefill_seconds=state.seconds,
        eviction_seconds=state.cascade.seconds if state.cascade is not None else 0.0,
        kv_bytes=state.kv_bytes,
        kv_bytes_full=state.cache.full_bytes,
        kv_peak=state.peak_bytes,
    )


def save(compressed: Compressed, path: str | Path, bits: int = 16) -> int:
    """Write the compressed prefix to a .cake file atomically (`tasks.saved.fileformat` format), its keys
    and values at `bits` (`quantized_meta`); its size in bytes.

    Raises:
        CakeError: the file cannot be written (the old one, if any, is untouched), or keys/values that
            cannot be quantized (beyond float16's range).
    """
    meta = quantized_meta(compressed, bits)
    try:
        cache = compressed.state.cache
        group = meta.kv_group or DEFAULT_KV_GROUP
        tensors = cache_tensors(cache, bits, group, meta.kv_recent, meta.kv_sink, **meta.value_coding())
    except ValueError as exc:
        raise CakeError(f"cannot save the cache at {bits} bits ({exc})", "save it at --kv-bits 16") from None
    kv = sum(t.numel() * t.element_size() for name, t in tensors.items() if not name.startswith("positions."))
    compressed.meta = replace(meta, kv_bytes_file=kv)
    blob = save_tensors(tensors, metadata={META_KEY: compressed.meta.to_json()})
    meta = replace(compressed.meta, sha256=blob_sha256(blob))
    blob = save_tensors(tensors, metadata={META_KEY: meta.to_json()})  # same tensors, the checksum added to the header
    compressed.meta = meta
    write_atomic(path, blob, "the .cake file")
    return len(blob)


def quantized_meta(compressed: Compressed, bits: int) -> CacheMeta:
    """The metadata of `compressed` saved at `bits`: 16 (nothing quantized), or 8 / 4 / 2 with the default key
    group, the values coded as `cachefile.value_coding_of` its cache says (format 6: Hadamard-rotated in groups of
    `DEFAULT_KV_VALUE_GROUP` channels where that group divides the heads), the observation window's w tokens (32
    for --method full) and the first `DEFAULT_KV_SINK` tokens (the attention sinks, format 5) kept in the model's
    dtype (`engine.kvquant`).

    Raises:
        CakeError: bits not in `engine.config.KV_BITS`.
    """
    if bits not in KV_BITS:
        raise CakeError(f"--kv-bits {bits} is not supported", f"choose one of {', '.join(map(str, KV_BITS))}")
    meta = compressed.meta
    if bits == 16:
        return replace(meta, kv_bits=16, kv_group=None, kv_recent=0, kv_sink=0, kv_value_group=None, kv_rotation=None)
    recent = meta.window or DEFAULT_RECENT
    coding = value_coding_of(compressed.state.cache)
    values = dict(kv_value_group=coding["value_group"], kv_rotation=ROTATION if coding["rotated"] else None)
    return replace(meta, kv_bits=bits, kv_group=DEFAULT_KV_GROUP, kv_recent=recent, kv_sink=DEFAULT_KV_SINK, **values)


def held_quantized(compressed: Compressed, bits: int) -> Compressed:
    """A document compressed in this run held at `bits` in memory (`engine.kvmemory`): the parts a .cake saved at
    `bits` would hold (`quantized_meta`'s group and recent tokens), so it answers exactly as that file loaded;
    bits 16 returns `compressed` itself.

    Raises:
        CakeError: bits not in `engine.config.KV_BITS`, or keys/values that cannot be quantized.
    """
    meta = quantized_meta(compressed, bits)
    if bits == 16:
        return compressed
    try:
        state = quantized_in_memory(
            compressed.state, bits, meta.kv_group, meta.kv_recent, meta.kv_sink, **meta.value_coding()
        )
    except ValueError as exc:
        raise CakeError(f"cannot hold the cache at {bits} bits ({exc})", "use --kv-bits 16") from None
    return replace(compressed, meta=meta, state=state)


def load(plan: Plan, cb: Callbacks, ready: ReadyModel | None = None) -> Compressed:
    """Load the plan's .cake file (`plan.saved`, already checked by `tasks.planning.plan`) onto the model.

    Raises:
        CakeError: the model's weights or tokenizer are not the ones the file was made with
            (fingerprint), or tensors that do not fit this model (exit 1, with the fix).
    """
    saved, meta = plan.saved, plan.saved.meta
    ready = ready or ready_model(plan.request, cb)
    loaded, config = ready.loaded, ready.loaded.model.config
    loaded.dtype_reason = f"the dtype {saved.name} was compressed in"
    start = time.perf_counter()
    again = f"compress the document again with this model: cake compress {meta.source} -o {saved.path}"
    if fingerprint(loaded.model, loaded.tokenizer) != meta.fingerprint:
        raise CakeError(
            f"{saved.name} was made with other weights or another tokenizer than {loaded.name}",
            "answer with the --weights it was compressed with, or " + again,
        )
    try:
        tensors = load_tensors(saved.path.read_bytes())
        windows = attention_layout(config).windows
        group = meta.kv_group or DEFAULT_KV_GROUP
        n = len(meta.prefix_ids)
        cache = cache_from_tensors(
            tensors, config.num_hidden_layers, n, loaded.device, windows,
            bits=meta.kv_bits, group=group, in_memory=True, **meta.value_coding(),
        )  # fmt: skip
    except DamagedTensorError as exc:
        raise CakeError(f"{saved.name} is damaged ({exc})", again.replace("with this model: ", "")) from None
    except (ValueError, OSError, RuntimeError) as exc:
        raise CakeError(f"{saved.name} does not fit {loaded.name} ({exc})", again) from None
    if cache.ragged() and ready.backend == "flash_attention_2":
        raise CakeError(
            f"{saved.name} keeps a different number of tokens per KV head (--allocation global), which "
            "flash_attention_2 cannot mask",
            "use --attention sdpa or eager",
        )
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    for layer in cache.layers:
        if layer.keys.shape[1] != heads or layer.keys.dtype != loaded.dtype:
            raise CakeError(f"{saved.name} does not fit {loaded.name} (KV heads or dtype differ)", again)
    h2o_decode = not meta.whole and plan.config.decode_policy == "fixed" and accumulates(meta.indicator)
    if h2o_decode and not cache.accumulating():  # a file from before the scores were saved with it
        raise CakeError(f"{saved.name} holds no accumulated attention, which {meta.indicator} decodes by", again)
    cache.full_bytes = meta.kv_bytes_full
    kv = cache.kv_bytes()
    state = Prefilled(cache, saved_cascade(meta), torch.empty(0), 0.0, cache.lengths(), kv, kv)
    seconds = saved.seconds + time.perf_counter() - start
    cb.status(
        f"loaded {saved.name}: {len(meta.prefix_ids)}-token prefix, KV {human_bytes(kv)}, read in {seconds:.2f} s"
    )
    warnings = []
    if meta.prompt_text is not None:
        cb.warn(
            warnings,
            f"{saved.name} holds the document middle-truncated from {meta.original_document_tokens} "
            f"to {meta.document_tokens} tokens (the model's prompt limit when it was compressed)",
        )
    return Compressed(ready, meta, state, saved.path, saved.file_bytes, seconds, warnings)


def smaller_files(compressed: Compressed, file_bytes: int) -> tuple[tuple[int, int], ...]:
    """((bits, bytes), …) for each --kv-bits below the one `compressed` was saved at: the size its .cake
    file of `file_bytes` would have at those bits, from the cache's shapes (`kvquant.entry_bytes`, with
    `quantized_meta`'s group, recent and sink tokens; nothing is quantized). The keys and values are counted
    exactly; the JSON header is taken as unchanged (a quantized file's grows by under 100 bytes for each of its 8
    more tensor names a layer, with its kv_* fields)."""
    meta, cache = compressed.meta, compressed.state.cache
    now = meta.kv_bytes_file or meta.kv_bytes
    out = []
    for bits in (b for b in KV_BITS if b < meta.kv_bits):
        q = quantized_meta(compressed, bits)
        kv = 0
        for layer in cache.layers:
            for kind, x in (("keys", layer.keys), ("values", layer.values)):  # [1, H_kv, len, d]
                _, heads, length, dim = x.shape
                group = q.kv_group if kind == "keys" else q.value_coding()["value_group"]
                kv += entry_bytes(heads, length, dim, x.element_size(), kind, bits, group, q.kv_recent, q.kv_sink)
        out.append((bits, file_bytes - now + kv))
    return tuple(out)


def file_bits(bits: int | None, profile) -> tuple[int, str]:
    """(bits, why) of the .cake file `cake compress` writes: `bits` (--kv-bits) when given, else the model
    profile's `kv_bits` with its evidence (`Profile.kv_bits_source`), else 16 (a model without a profile)."""
    if bits is not None:
        return bits, BITS_GIVEN
    if profile is None:
        return 16, "the model's dtype (the model has no profile to say otherwise)"
    source = f": {profile.kv_bits_source}" if profile.kv_bits_source else ""
    return profile.kv_bits, f"the {profile.name} profile's default{source}"


def compress_result(
    compressed: Compressed, path: Path, file_bytes: int, load_seconds: float, bits_reason: str = ""
) -> CompressResult:
    """The report of `cake compress` (one dataclass for the rich view and --json); `bits_reason`: why the file
    holds its bits (`file_bits`)."""
    meta, state, loaded = compressed.meta, compressed.state, compressed.ready.loaded
    threads = compressed.threads or choose(None)
    settings = {f: getattr(meta, f) for f in ("budget", "window", "tau1", "tau2", "tau_rule", "gamma")}
    engine = SimpleNamespace(
        evicted=meta.evicted,
        layers=state.rows(),
        kv_bytes_full=meta.kv_bytes_full,
        kv_bytes_kept=meta.kv_bytes,
        kv_peak_prefill=meta.kv_peak,
        prefill_seconds=meta.prefill_seconds,
        eviction_seconds=meta.eviction_seconds,
        load_seconds=load_seconds,
    )
    tokens = (len(meta.prefix_ids), meta.document_tokens, meta.original_document_tokens)
    fields = summary_fields(loaded, compressed.ready.backend, meta.dtype, tokens, settings, engine, threads)
    extra = dict(path=str(path), file_bytes=file_bytes, method=meta.method, scoring=meta.scoring)
    extra.update(kv_bits=meta.kv_bits, kv_bits_reason=bits_reason, kv_group=meta.kv_group)
    extra.update(kv_bytes_file=meta.kv_bytes_file or meta.kv_bytes)
    extra.update(kv_value_group=meta.value_coding()["value_group"], kv_rotation=meta.kv_rotation)
    extra.update(document_bytes=len(meta.used_text.encode("utf-8")))
    extra.update(smaller_files=smaller_files(compressed, file_bytes))
    return CompressResult(**fields, **extra, warnings=tuple(compressed.warnings))
