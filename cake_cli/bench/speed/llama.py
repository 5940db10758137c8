"""`cake bench speed --llama`: llama.cpp's decode and prefill on the same GGUF, document, threads and
token count, through llama-cpp-python (the `llama` extra), as SpeedRows beside ours.

What a CPU user would run instead of cake-cli is llama.cpp on the model's own GGUF file, with its
full cache (it has no eviction). `LlamaEngine` runs it like our engine rows, inside their rounds
(`rows.run_speed`, a `rows.RoundEngine`): one unmeasured warm-up on WARMUP_TOKENS tokens generating
WARMUP_NEW_TOKENS, then, at the end of each round, one timed run of prefill (``Llama.eval`` over
the prompt) and greedy decoding (one ``eval`` per token, argmax of the last logits) under
`memory.PeakRss`, so its row and ours are compared round by round. Where llama-cpp-python is not
installed, or the model has no GGUF, there is no row and the benchmark says why in one line.
"""

from __future__ import annotations

import importlib.util
import time
from contextlib import contextmanager
from pathlib import Path

from cake_cli.bench.memory import PeakRss
from cake_cli.bench.speed.rows import WARMUP_NEW_TOKENS, WARMUP_TOKENS
from cake_cli.errors import CakeError
from cake_cli.models.embedded import EMBEDDED_MODELS, assemble, locate

METHOD = "llama.cpp"  # the rows' method name (full cache, its own KV layout)
INSTALL = "pip install -e '.[llama]' (builds llama-cpp-python from source, about 8 min on 2 cores)"


def missing() -> str | None:
    """Why the llama.cpp row cannot run here (one line), or None when llama-cpp-python imports."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed"
    try:
        importlib.import_module("llama_cpp")
    except ImportError as exc:  # e.g. a dependency missing after a --no-deps install
        return f"llama-cpp-python does not import ({exc})"
    return None


def model_gguf(spec: str | None, embedded: str | None, folder: Path) -> Path:
    """The GGUF llama.cpp runs for a model: `spec` itself when it is a .gguf file, else the embedded
    model's GGUF (`embedded`: its source name), verified and, when in parts, joined into `folder`.

    Raises:
        CakeError: the model has no GGUF (a plain checkpoint), or the embedded parts are damaged.
    """
    if spec and spec.lower().endswith(".gguf") and Path(spec).expanduser().is_file():
        return Path(spec).expanduser()
    if embedded is None:
        raise CakeError("the llama.cpp row needs a GGUF model", "use an embedded model or --models FILE.gguf")
    em = EMBEDDED_MODELS[embedded]
    return assemble(em, locate(em), folder / em.gguf_file)


def next_token(llm) -> int:
    """The greedy next token: argmax of the last evaluated token's logits, read from the context
    (``Llama.eval`` keeps no logits unless every token's are asked for)."""
    import llama_cpp  # noqa: PLC0415 - optional dependency
    import numpy as np  # noqa: PLC0415 - only with llama-cpp-python (it depends on numpy)

    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
    return int(logits.argmax())


def timed_prefill(llm, token_ids: list[int]) -> tuple[float, float, int]:
    """Prefill `token_ids` from an empty cache: (prefill seconds, time to first token, the first token)."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(token_ids)
    prefill = time.perf_counter() - start
    token = next_token(llm)
    return prefill, time.perf_counter() - start, token


def timed_decode(llm, token: int, steps: int) -> float:
    """`steps` greedy decode steps from `token` (one ``eval`` each): seconds."""
    begin = time.perf_counter()
    for _ in range(steps):
        llm.eval([token])
        token = next_token(llm)
    return time.perf_counter() - begin


def _greedy(llm, token_ids: list[int], new_tokens: int, prefilled=None) -> dict:
    """One run: prefill `token_ids`, then `new_tokens` greedy tokens (new_tokens - 1 decode steps).

    `prefilled` = (llama state after the prefill, prefill seconds, TTFT, first token): restore that
    state instead of prefilling again (`--prefill-once`); its times are reported again."""
    with PeakRss() as rss:
        if prefilled is None:
            prefill, ttft, token = timed_prefill(llm, token_ids)
        else:
            state, prefill, ttft, token = prefilled
            llm.load_state(state)
        decode = timed_decode(llm, token, new_tokens - 1)
    steps = new_tokens - 1
    return {
        "prefill_seconds": prefill,
        "ttft_seconds": ttft,
        "decode_tokens_per_second": steps / decode if decode > 0 else 0.0,
        "decode_steps": steps,
        "kv_bytes_kept": 0,  # llama.cpp's cache is not measured from tensors here
        "kv_peak_prefill": 0,
        "kv_bytes_full": 0,
        "rss_peak_delta": max(rss.peak - rss.start, 0),
        "eviction_seconds": 0.0,
        "sampling_seconds": 0.0,
        "decode_seconds": decode,
    }


def open_llama(gguf: Path, tokens: int, threads: tuple):
    """llama.cpp on `gguf` with a context of `tokens` (+ a small margin), threads = (prefill, decode).

    Raises:
        CakeError: llama-cpp-python missing (with the install command) or the GGUF cannot be loaded.
    """
    reason = missing()
    if reason:
        raise CakeError(reason, INSTALL)
    from llama_cpp import Llama  # noqa: PLC0415 - optional dependency

    try:
        return Llama(
            model_path=str(gguf),
            n_ctx=tokens + 8,
            n_batch=512,
            n_threads=threads[1],
            n_threads_batch=threads[0],
            verbose=False,
        )
    except (ValueError, RuntimeError, OSError) as exc:
        raise CakeError(f"llama.cpp cannot load {gguf.name}: {exc}") from None


class LlamaEngine:
    """llama.cpp as a `rows.RoundEngine`: one instance of the GGUF for every length, warmed up at once.

    Args:
        gguf: the model's GGUF file (the embedded one, assembled, or the --model file).
        token_ids: the prompt (our tokenizer's ids: the same GGUF's vocabulary); a length n runs on
            its first n tokens.
        group: the rows' group, "<model> · <dtype> · llama.cpp".
        lengths: the lengths it will be asked for (the context is sized for the longest).
        new_tokens: tokens generated per run.
        threads: (prefill, decode) CPU threads, as our rows use.
        prefill_once: one timed prefill per length now, its state saved (``Llama.save_state``) and
            restored before each run (`rows.run_speed`'s option of the same name).

    Raises:
        CakeError: llama-cpp-python missing (with the install command) or the GGUF cannot be loaded.
    """

    method = METHOD

    def __init__(self, gguf: Path, token_ids: list[int], group: str, *, lengths: list[int], new_tokens: int,
                 threads: tuple, prefill_once: bool = False):  # fmt: skip
        self.group, self.token_ids, self.new_tokens = group, token_ids, new_tokens
        self.llm = open_llama(gguf, max(lengths) + new_tokens, threads)
        self.prefilled: dict[int, tuple] = {}
        with _as_cake_error():
            _greedy(self.llm, token_ids[:WARMUP_TOKENS], WARMUP_NEW_TOKENS)  # warm-up, not measured
            if prefill_once:
                for n in lengths:
                    prefill, ttft, token = timed_prefill(self.llm, token_ids[:n])
                    self.prefilled[n] = (self.llm.save_state(), prefill, ttft, token)

    def measure(self, length: int) -> dict:
        """One timed run on the first `length` tokens (from the saved prefill with `prefill_once`).

        Raises:
            CakeError: llama.cpp failed (e.g. out of memory for its context).
        """
        with _as_cake_error():
            return _greedy(self.llm, self.token_ids[:length], self.new_tokens, self.prefilled.get(length))


@contextmanager
def _as_cake_error():
    """llama-cpp-python's errors (RuntimeError, ValueError) as one-line CakeErrors."""
    try:
        yield
    except (RuntimeError, ValueError) as exc:
        raise CakeError(f"llama.cpp failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
