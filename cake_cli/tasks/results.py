"""Result objects: one frozen dataclass feeds both the rich report and --json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from cake_cli import __version__
from cake_cli.engine.allocation import preference_weights
from cake_cli.engine.config import KV_BITS
from cake_cli.engine.measures import saved_fraction, tokens_per_second


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB' (binary units)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


@dataclass(frozen=True)
class LayerResult:
    """One layer after prefill (docs/method.md §Layer preference, §Budget allocation)."""

    layer: int
    dispersion: float | None  # H_l, nats (None when the prompt is not longer than the window)
    shift: float | None  # V_l
    preference_share: float | None  # P_l / sum_k P_k, in [0, 1]
    budget: int | None  # B_l evictable tokens kept (None when nothing was evicted, or a local layer)
    kept: int  # tokens the layer holds after prefill (B_l + w, or all; a local layer: its window - 1 at most)
    window: int | None = None  # a local layer's native sliding window (tokens; no CAKE budget), None: global
    heads: tuple[int, ...] | None = None  # tokens kept per KV head when they differ (--allocation global), else None


@dataclass(frozen=True)
class Location:
    """Where an answer's passage is in the document (needle search, `cake_cli.tasks.answers.locate`).

    Offsets are Python str indices (code points) into the loaded document text.
    """

    start: int  # first character of the matching passage
    end: int  # one past its last character
    percent: float  # depth: start / len(text) · 100
    page: int | None  # 1-based PDF page of `start`; None for text
    similarity: float  # rapidfuzz partial-ratio of the answer to the passage, 0-100
    text: str  # the passage as it is in the document


@dataclass(frozen=True)
class Support:
    """How an answer is backed by the document (templates with `locate: true`: qa, needle;
    `tasks.answers.cite`)."""

    status: str  # "located" (its passage is in the document), "unsupported" (no passage found) or "abstained"
    answer: str  # the short answer, without its quoted passage ("" when abstained)
    passage: str  # the passage the model quoted ("" when it quoted none: the answer itself was looked for)
    reason: str = ""  # one line: why unsupported, or what an abstention means after a middle cut
    withheld: bool = False  # --abstain unsupported: the unsupported answer was not shown (`answers.abstain`)
    abstain_probability: float | None = None  # --abstain doubt: the model's P(abstaining) (`answers.check`)


@dataclass(frozen=True)
class Dropped:
    """The part of the document the middle cut left out of the prompt (the model never read it).
    Offsets are Python str indices into the loaded document text."""

    start: int  # first character not read
    end: int  # one past the last character not read
    length: int  # the document's characters
    tokens: int  # document tokens left out
    pages: str | None  # PDF pages that part touches, e.g. "21-44" (None for text)

    def describe(self) -> str:
        """'characters 68012-101990 (40.0%-60.0% of the document, pages 30-44)'."""
        n = max(self.length, 1)
        pages = f", pages {self.pages}" if self.pages else ""
        share = f"{100 * self.start / n:.1f}%-{100 * self.end / n:.1f}% of the document"
        return f"characters {self.start}-{self.end} ({share}{pages})"


@dataclass(frozen=True)
class SectionAnswer:
    """One section of a document read with `--long sections`: where it is and what it gave."""

    index: int  # 1-based
    start: int  # first character of the section in the document text
    end: int  # one past its last character
    pages: str | None  # PDF pages it spans, e.g. "1-12" (None for text)
    document_tokens: int  # the section's tokens
    answer: str  # what the model generated on this section
    support: Support | None  # qa: located / unsupported / abstained (None for summarize)
    location: Location | None  # qa: the located passage (document offsets)
    kept: bool  # qa: the answer is kept (its passage was found); summarize: always
    prefill_seconds: float
    decode_seconds: float


@dataclass(frozen=True)
class CacheInfo:
    """How a run used a compressed document prefix (a .cake input, chat, qa with several questions).
    Bytes measured (file size on disk, KV tensors), times in seconds. The run's own `prefill_seconds`
    is the forward over its `continuation_tokens` only; the document's is `prefix_prefill_seconds`."""

    path: str | None  # the .cake file read; None when the prefix was compressed in this run
    file_bytes: int | None  # the file's size on disk
    kv_bytes: int  # the compressed prefix's keys and values
    prefix_tokens: int  # the shared prefix (chat opening + document block)
    continuation_tokens: int  # this task's own tokens, run after the prefix
    scoring: str  # the .cake's ("question": kept whole, evicted per question; "end", "instruction", "reconstruct")
    prefix_prefill_seconds: float  # the prefill of the prefix: once in this run, or when the file was made
    read_seconds: float  # reading and checking the file now (0 when compressed in this run)
    first_token_seconds: float  # from the start of this answer (file read included) to its first token

    @property
    def prefill_saved_seconds(self) -> float:
        """The prefix prefill a .cake spared this run: `prefix_prefill_seconds` less reading the file
        (the continuation runs either way); 0 when the prefix was compressed in this run."""
        return self.prefix_prefill_seconds - self.read_seconds if self.path is not None else 0.0


@dataclass(frozen=True)
class PrefillSummary:
    """What every run reports about its prompt, settings, per-layer budgets and the KV cache after
    prefill (shared by RunResult and InspectResult). Bytes from the cache tensors, times in seconds."""

    model: str
    device: str
    dtype: str
    dtype_reason: str  # why this dtype (`models.dtypes.auto_dtype`, or "asked for")
    weights: str  # linear layers: bf16 | int8 | int4 | w8a8 (`models.weights`)
    weights_reason: str  # why (`models.weights.auto_weights`, or "asked for")
    attention: str
    prompt_tokens: int
    document_tokens: int
    original_document_tokens: int
    budget: int | None  # B, tokens per layer on average incl. window (None: --method full)
    window: int | None  # w, tokens (None: --method full, nothing is scored)
    tau1: float | None  # temperatures and gamma as used (None: --method full)
    tau2: float | None
    tau_rule: str  # how the taus were chosen ("" for --method full)
    gamma: float | None
    evicted: bool  # False when the prompt fits the budget (no layer is cut)
    layers: tuple[LayerResult, ...]
    kv_bytes_full: int
    kv_bytes_kept: int  # after prefill
    kv_peak_prefill: int
    load_seconds: float
    prefill_seconds: float  # the forward over this run's prompt tokens (after a compressed prefix: its own only)
    eviction_seconds: float  # scoring + eviction
    prefill_threads: int  # torch CPU threads (`tasks.threads`)
    decode_threads: int
    threads_reason: str

    @property
    def saved_fraction(self) -> float:
        """1 - kept / full KV bytes after prefill."""
        return saved_fraction(self.kv_bytes_kept, self.kv_bytes_full)

    def to_dict(self) -> dict:
        """JSON-ready dict: every field plus saved_fraction and the cake-cli version."""
        data = asdict(self)
        data["layers"] = [asdict(layer) for layer in self.layers]
        data["warnings"] = list(getattr(self, "warnings", ()))
        data["saved_fraction"] = self.saved_fraction
        data["cake_cli_version"] = __version__
        return data


def summary_fields(
    loaded, backend: str, dtype: str, tokens: tuple[int, int, int], settings: Mapping, engine, threads
) -> dict:
    """The PrefillSummary fields of any run, the one place they are filled (task runs, inspect-layers,
    `cake compress`).

    Args:
        loaded: the `models.loader.LoadedModel` (name, device, dtype_reason, load_seconds).
        backend: the attention backend in use.
        dtype: the dtype the KV cache was computed in, e.g. "bfloat16".
        tokens: (prompt, document as used, document before truncation) token counts.
        settings: budget, window, tau1, tau2, tau_rule and gamma as used (all None / "" for --method full).
        engine: the prefill's measured numbers: `evicted`, `layers` (engine `LayerRow`s), `kv_bytes_full`,
            `kv_bytes_kept`, `kv_peak_prefill` (bytes), `prefill_seconds`, `eviction_seconds`, and
            `load_seconds` when it differs from the loader's (a saved cache).
        threads: the `tasks.threads.Threads` choice (prefill, decode, reason).
    """
    return dict(
        model=loaded.name,
        device=str(loaded.device),
        dtype=dtype,
        dtype_reason=loaded.dtype_reason,
        weights=loaded.weights,
        weights_reason=loaded.weights_reason,
        attention=backend,
        prompt_tokens=tokens[0],
        document_tokens=tokens[1],
        original_document_tokens=tokens[2],
        **{k: settings[k] for k in ("budget", "window", "tau1", "tau2", "tau_rule", "gamma")},
        evicted=engine.evicted,
        layers=layer_results(engine.layers),
        kv_bytes_full=engine.kv_bytes_full,
        kv_bytes_kept=engine.kv_bytes_kept,
        kv_peak_prefill=engine.kv_peak_prefill,
        load_seconds=getattr(engine, "load_seconds", loaded.load_seconds),
        prefill_seconds=engine.prefill_seconds,
        eviction_seconds=engine.eviction_seconds,
        prefill_threads=threads.prefill,
        decode_threads=threads.decode,
        threads_reason=threads.reason,
    )


@dataclass(frozen=True)
class Selected:
    """What `--prefill select` kept (`engine.selection`): the full model read `kept_tokens` of the
    prompt's `prompt_tokens`, chosen by layer `layer`'s attention (0-based; layers 0..layer ran over
    the whole prompt first, in `seconds`, counted in the run's prefill seconds)."""

    layer: int
    kept_tokens: int
    prompt_tokens: int
    seconds: float


@dataclass(frozen=True)
class RunResult(PrefillSummary):
    """Everything a task run produced and measured."""

    task: str
    answer: str
    decode_policy: str
    method: str
    allocation: str | None  # None: --method full
    indicator: str | None
    kv_bytes_final: int
    decode_seconds: float
    decode_steps: int
    sampling_seconds: float  # choosing tokens (n-gram blocking included), within the decode loop
    generated_tokens: int
    stop_reason: str
    warnings: tuple[str, ...] = ()
    location: Location | None = None  # needle search: where the quoted passage is (None: not found / n.a.)
    raw_answer: str | None = None  # code completion: the generated text before code-only cleaning
    cache: CacheInfo | None = None  # set when the run continued a compressed prefix
    question: str | None = None  # the question, for runs that answer several (qa -q, chat)
    support: Support | None = None  # qa / needle: located, unsupported or abstained (None: the task cites nothing)
    dropped: Dropped | None = None  # what the middle cut left out (None: the whole document was read)
    sections: tuple[SectionAnswer, ...] = ()  # --long sections: every section (the run's figures add them up)
    reply: str | None = (
        None  # qa / needle: the whole reply as streamed (answer + passage); `answer` is the short answer
    )
    selected: Selected | None = None  # --prefill select: the tokens the model read (None: the whole prompt)

    @property
    def printed(self) -> str:
        """The answer as the terminal showed it: the whole reply of a cited task, else the answer."""
        return self.reply if self.reply is not None else self.answer

    @property
    def decode_tokens_per_second(self) -> float:
        return tokens_per_second(self.decode_steps, self.decode_seconds)

    def to_dict(self) -> dict:
        """JSON-ready dict: every field plus the derived ratios."""
        data = super().to_dict()
        data["location"] = asdict(self.location) if self.location else None
        if self.cache is not None:
            data["cache"]["prefill_saved_seconds"] = self.cache.prefill_saved_seconds
        data["decode_tokens_per_second"] = self.decode_tokens_per_second
        return data


def preference_shares(log_prefs: list[float | None]) -> list[float | None]:
    """P_l / sum P from log P, with the allocation's own weights (`allocation.preference_weights`:
    P = 0 layers get 0, and every layer the same share when all P are 0, as the budgets are then
    uniform); None entries (unscored layers) stay None."""
    weights = iter(preference_weights([x for x in log_prefs if x is not None]))
    shares = [None if x is None else next(weights) for x in log_prefs]
    total = sum(s for s in shares if s is not None)
    return [None if s is None else s / total for s in shares]


def layer_results(rows) -> tuple[LayerResult, ...]:
    """LayerResults from the engine's per-layer rows (`engine.generate.LayerRow`: layer, stats,
    budget, kept, window); preference shares are P_l / sum P from the stored log P."""
    shares = preference_shares([row.stats.log_preference if row.stats else None for row in rows])
    return tuple(
        LayerResult(
            row.layer,
            row.stats.dispersion if row.stats else None,
            row.stats.shift if row.stats else None,
            share,
            row.budget,
            row.kept,
            row.window,
            getattr(row, "heads", None),
        )
        for row, share in zip(rows, shares)
    )


@dataclass(frozen=True)
class InspectResult(PrefillSummary):
    """A prefill-only look at how CAKE scores and budgets each layer (`cake inspect-layers`)."""

    document: str  # the path as given, "<stdin>", or the packaged sample's path
    template: str  # the task template whose prompt was prefilled
    evictable_total: int | None  # (B - w) · L over the global layers: what the B_l share (None: --method full)
    warnings: tuple[str, ...] = ()

    @property
    def budget_sum(self) -> int | None:
        """sum of B_l (evictable tokens kept over the global layers); None when nothing was evicted."""
        return sum(layer.budget for layer in self.layers if layer.budget is not None) if self.evicted else None

    def to_dict(self) -> dict:
        """JSON-ready dict: every field plus budget_sum, saved_fraction and the cake-cli version."""
        data = super().to_dict()
        data["budget_sum"] = self.budget_sum
        return data


@dataclass(frozen=True)
class CompressResult(PrefillSummary):
    """What `cake compress` saved: the prefix's settings, per-layer budgets, KV bytes and the file."""

    path: str
    file_bytes: int  # the .cake file on disk (tensors + metadata)
    method: str
    scoring: str  # "question" (kept whole, evicted per question), "end" / "instruction" / "reconstruct"; "none": full
    kv_bits: int = 16  # bits per saved key/value (16: the model's dtype; 8 / 4: grouped affine, `engine.kvquant`)
    kv_bits_reason: str = ""  # why these bits: "--kv-bits", or the profile's default and its evidence
    kv_group: int | None = None  # tokens per key group (None at 16 bits)
    kv_value_group: int | None = None  # channels per value group (None at 16 bits)
    kv_rotation: str | None = None  # "hadamard": values rotated before quantizing (format 6)
    kv_bytes_file: int = 0  # the saved keys and values (codes, scales, zeros, exact recent tokens), measured
    document_bytes: int = 0  # UTF-8 bytes of the document text the model read (after extraction)
    smaller_files: tuple[tuple[int, int], ...] = ()  # (bits, file bytes) at each --kv-bits below kv_bits
    warnings: tuple[str, ...] = ()

    @property
    def size_hint(self) -> str | None:
        """One line when the file is over `SIZE_HINT_RATIO`× the document's text (`size_hint`), else None."""
        return size_hint(self.file_bytes, self.document_bytes, self.kv_bits, self.smaller_files)

    @property
    def file_ratio(self) -> float:
        """File bytes / kept KV bytes in memory (at 16 bits the target is at most 1.05 plus the metadata)."""
        return self.file_bytes / self.kv_bytes_kept if self.kv_bytes_kept else 0.0

    @property
    def file_fraction(self) -> float:
        """File bytes / the full cache's KV bytes (what a file of the uncompressed prefix would hold)."""
        return self.file_bytes / self.kv_bytes_full if self.kv_bytes_full else 0.0

    def to_dict(self) -> dict:
        """JSON-ready dict: every field plus file_ratio, file_fraction, saved_fraction and the cake-cli version."""
        data = super().to_dict()
        data["file_ratio"] = self.file_ratio
        data["file_fraction"] = self.file_fraction
        data["size_hint"] = self.size_hint
        return data


BITS_GIVEN = "--kv-bits"  # `CompressResult.kv_bits_reason` when the user chose the bits

SIZE_HINT_RATIO = 100  # a .cake file over this many times its document's text gets `size_hint`'s line


def size_hint(file_bytes: int, document_bytes: int, kv_bits: int, smaller: tuple[tuple[int, int], ...]) -> str | None:
    """The line `cake compress` adds when its file is over `SIZE_HINT_RATIO`× the document's text (UTF-8 bytes)
    and a smaller --kv-bits exists: the ratio and the option with the file size at each smaller bits
    (`smaller`: (bits, bytes) pairs, `tasks.saved.store.smaller_files`), and that 2 bits loses answers where
    it is offered (benchmarks/cache.md). None at --kv-bits 2 (nothing smaller), at or under the ratio, or for
    an empty document."""
    if kv_bits <= min(KV_BITS) or not smaller or document_bytes <= 0 or file_bytes <= SIZE_HINT_RATIO * document_bytes:
        return None
    sizes = " / ".join(human_bytes(size) for _, size in smaller)
    options = " / ".join(str(bits) for bits, _ in smaller)
    return (
        f"the file is {file_bytes / document_bytes:.0f}× the document's text ({human_bytes(file_bytes)} for "
        f"{human_bytes(document_bytes)}): --kv-bits {options} would write about {sizes}"
        + (" (2 bits loses answers: benchmarks/cache.md)" if any(bits == 2 for bits, _ in smaller) else "")
    )
