"""Compress a document once, answer many tasks on it: `cake compress`, .cake inputs, `cake chat`, `qa -q`.

The prefix every chat task shares (the chat template's opening and the document block,
`templates.DOCUMENT_BLOCK`) is prefilled once (kept whole, or evicted with the CAKE cascade, see
below); a task then runs only its own suffix (instruction, question, end of turn) as a
continuation on a copy of that cache (`engine.continuation`) and decodes. From a .cake file or
from the cache compressed in this process, the same code runs on bit-identical tensors, so the
answers are token-identical.

When is the document scored? The paper, like SnapKV, scores tokens with the question inside the
observation window. `fileformat.SCORINGS`:

- ``question`` (the default): the prefix is prefilled once and kept whole; each task runs its
  continuation with the CAKE cascade (`engine.continuation.extend_and_evict`), its own question in
  the window, and evicts to its budget then. The cache equals the one a prefill of the whole prompt
  leaves, so answers keep the question-aware quality; the file holds the full KV cache of the prefix.
- ``end`` (question-agnostic): the window is the last w tokens of the prefix (the end of the
  document block); the prefix is evicted once and the file holds B·L tokens.
- ``instruction`` (question-agnostic): the qa template's own instruction with an empty question, and
  the chat template's end of turn (its last w tokens at most), is appended to the prefix for scoring
  only: it fills the observation window, then its g tokens are dropped from the cache. The budget is
  raised by g while compressing, so the document keeps B·L tokens as with ``end``.
- ``reconstruct`` (question-agnostic, KVzip's proxy): the prefix is prefilled whole, then the model is
  asked to repeat the document (`REPEAT_INSTRUCTION` as the user's request, the chat template's turn
  end and assistant header) and the document's tokens follow, teacher-forced, in chunks over the
  prefix (`engine.reconstruct`); each cached pair is scored by the most attention it gets from that
  reconstruction, CAKE's budgets come from the same attention, and the prefix is evicted to B·L tokens
  once. The file holds only the budget.

On the retrieval benchmark (`cake_cli.bench.reuse`, benchmarks/cache.md) both agnostic scorings
lose most of the question-aware score, even at twice the budget; hence the default.

Chat memory: every turn starts again from the compressed document (each turn's question and answer
are dropped after it), so memory never grows past the document's cache plus one turn, and a turn's
answer is the one `cake qa FILE.cake QUESTION` gives; a follow-up question has no earlier turn to
refer to.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from cake_cli.engine.allocation import GLOBAL
from cake_cli.engine.continuation import compress as compress_prefix
from cake_cli.engine.continuation import continue_prefix
from cake_cli.engine.generate import decode
from cake_cli.engine.reconstruct import compress_by_reconstruction
from cake_cli.errors import CakeError
from cake_cli.tasks.request import Callbacks, Plan
from cake_cli.tasks.results import CacheInfo, RunResult
from cake_cli.tasks.runner import Prepared, ReadyModel, finish, finite, prompt_limit, ready_model
from cake_cli.tasks.saved.fileformat import DEFAULT_SCORING
from cake_cli.tasks.saved.store import Compressed, build_meta, saved_cascade
from cake_cli.tasks.templates import DOCUMENT_BLOCK, build_prefix, build_prompt, render_split
from cake_cli.tasks.threads import choose, decode_following_load
from cake_cli.tasks.threads import using as threads_using

ANSWER_RESERVE = 512  # positions a compressed prefix leaves free for a task's continuation and answer
REPEAT_INSTRUCTION = "Repeat the document above exactly, word for word."  # the `reconstruct` scoring's request


def probe_ids(plan: Plan, tokenizer, text: str, window: int) -> list[int]:
    """The `instruction` scoring probe: the template's suffix with empty fields, its last `window` tokens."""
    suffix = render_split(tokenizer, plan.template, text, **dict.fromkeys(plan.template.fields, ""))[1]
    return suffix[-window:]


def reconstruction_ids(plan: Plan, tokenizer, prefix) -> tuple[list[int], list[int]]:
    """The `reconstruct` scoring's (repeat prompt ids, target ids): the prefix's user turn finished with
    `REPEAT_INSTRUCTION` (then the chat template's end of turn and assistant header), and the document as
    used in the prefix, tokenized on its own (the answer the model is teacher-forced to give).

    Raises:
        CakeError: the repeat prompt does not start with the prefix (a chat template that rewrites it).
    """
    template = replace(plan.template, user=DOCUMENT_BLOCK + REPEAT_INSTRUCTION, fields=())
    head, repeat = render_split(tokenizer, template, prefix.document_text)
    if head != list(prefix.input_ids) or not repeat:
        raise CakeError("the chat template rewrites the document prefix: the reconstruction prompt cannot follow it")
    return repeat, list(tokenizer(prefix.document_text, add_special_tokens=False)["input_ids"])


def _reconstructed(plan: Plan, cb: Callbacks, loaded, prefix, ids: torch.Tensor, config):
    """(the prefix compressed by reconstruction scoring, the repeat prompt's ids)."""
    repeat, target = reconstruction_ids(plan, loaded.tokenizer, prefix)

    def on_chunk(index: int, count: int) -> None:
        cb.status(f"reconstruction: chunk {index + 1} of {count} ({len(target)} document tokens repeated)")

    as_tensor = [torch.tensor([x], device=loaded.device) for x in (repeat, target)]  # [1, p], [1, t]
    state = compress_by_reconstruction(loaded.model, ids, *as_tensor, config, on_layer=cb.on_layer, on_chunk=on_chunk)
    return state, repeat


def compress(plan: Plan, cb: Callbacks, ready: ReadyModel | None = None, scoring: str = DEFAULT_SCORING) -> Compressed:
    """Prefill the plan's document inside the shared prefix with the CAKE cascade and evict (Sec. 4.2).

    Raises:
        CakeError: the model, a prefix that does not fit, a chat template that does not carry the
            message text verbatim (no prefix to share), non-finite values.
    """
    ready = ready or ready_model(plan.request, cb)
    loaded, request = ready.loaded, plan.request
    limit = prompt_limit(loaded, ANSWER_RESERVE)
    prefix = build_prefix(
        loaded.tokenizer, plan.template, plan.text, max_prompt_tokens=limit, truncate=request.truncate
    )
    warnings: list[str] = []
    for message in prefix.warnings:
        cb.warn(warnings, message)
    config = plan.config if plan.evicts else None
    if not render_split(
        loaded.tokenizer, plan.template, prefix.document_text, **dict.fromkeys(plan.template.fields, "?")
    )[1]:
        raise CakeError(f"the chat template of {loaded.name} rewrites the message text: no prefix can be shared")
    probe = (
        probe_ids(plan, loaded.tokenizer, prefix.document_text, config.window)
        if config and scoring == "instruction"
        else []
    )
    n, whole = len(prefix.input_ids), scoring == "question"
    if config is not None and n <= config.budget and not whole:
        cb.warn(
            warnings,
            f"the budget ({config.budget}) is not smaller than the document prefix ({n} tokens): nothing is evicted",
        )
    ids = torch.tensor([list(prefix.input_ids)], device=loaded.device)  # [1, n]
    probe_t = torch.tensor([probe], device=loaded.device) if probe else None  # [1, g]
    how = "kept whole: each question evicts it when asked" if whole else f"scored with the {scoring}"
    how = "scored by a reconstruction of the document" if scoring == "reconstruct" and config else how
    cb.status(f"compress: {n} tokens through {loaded.model.config.num_hidden_layers} layers, {how}")
    if config is not None and config.allocation == GLOBAL and ready.backend == "flash_attention_2":
        raise CakeError(
            "--allocation global keeps a different number of tokens per KV head, which flash_attention_2 cannot mask",
            "use --attention sdpa or eager",
        )
    threads = choose(request.threads)
    with finite(loaded), threads_using(threads.prefill):
        if scoring == "reconstruct" and config is not None:
            state, probe = _reconstructed(plan, cb, loaded, prefix, ids, config)
        else:
            state = compress_prefix(
                loaded.model, ids, None if whole else config, probe_ids=probe_t, on_layer=cb.on_layer
            )
    meta = build_meta(plan, ready, state, prefix, scoring, probe)
    state = replace(state, cascade=saved_cascade(meta))
    return Compressed(ready, meta, state, None, None, 0.0, warnings, threads)


def _prepared(compressed: Compressed, plan: Plan) -> Prepared:
    """The task's prompt on the saved document, checked to start exactly with the saved prefix."""
    loaded, meta = compressed.ready.loaded, compressed.meta
    prompt = build_prompt(
        loaded.tokenizer, plan.template, meta.used_text, max_prompt_tokens=10**9, **plan.request.fields
    )
    prefix = meta.prefix_ids
    where = compressed.path.name if compressed.path else "the compressed document"
    if prompt.prefix_tokens != len(prefix) or list(prompt.input_ids[: len(prefix)]) != prefix:
        raise CakeError(
            f"the {plan.request.task} prompt does not start with the prefix saved in {where} (another task "
            "template, chat template or tokenizer than when it was compressed)",
            f"compress the document again: cake compress {meta.source} -o FILE.cake",
        )
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    if len(prompt.input_ids) == len(prefix) or (limit is not None and len(prompt.input_ids) >= limit):
        raise CakeError(
            f"the {plan.request.task} prompt has {len(prompt.input_ids) - len(prefix)} tokens after the "
            f"{len(prefix)}-token saved prefix; at least 1 and at most {(limit or 0) - len(prefix) - 1} fit",
            "shorten the question",
        )
    prompt = replace(
        prompt, document_tokens=meta.document_tokens, original_document_tokens=meta.original_document_tokens
    )
    return Prepared(
        plan,
        loaded,
        compressed.ready.backend,
        plan.config if plan.evicts else None,
        prompt,
        [*plan.warnings, *compressed.warnings],
        choose(plan.request.threads),
    )


def answer(compressed: Compressed, plan: Plan, cb: Callbacks | None = None) -> RunResult:
    """Run one task on the compressed prefix: its continuation, then decoding (`engine.continuation`).

    Raises:
        CakeError: the task's prompt does not start with the saved prefix, does not fit, or
            non-finite values.
    """
    cb = cb or Callbacks()
    began = time.perf_counter()
    prep = _prepared(compressed, plan)
    model, n = prep.loaded.model, len(compressed.meta.prefix_ids)
    timing: dict[str, float] = {}

    def run(input_ids: torch.Tensor, *, on_token=None, before_decode=None, **decode_options):
        cb.status(f"continuation: {input_ids.shape[1] - n} task tokens after the {n}-token compressed prefix")

        def first(token: int) -> None:
            timing.setdefault("first", time.perf_counter() - began)
            if on_token is not None:
                on_token(token)

        with threads_using(prep.threads.prefill):
            cont, capacity = continue_prefix(
                model, compressed.state, input_ids, prep.config, evict=compressed.meta.whole
            )
            if before_decode is not None:
                before_decode(cont)
        return decode_following_load(
            prep.threads,
            decode,
            model,
            input_ids,
            cont,
            prep.config,
            capacity=capacity,
            on_token=first,
            **decode_options,
        )

    result = finish(prep, cb, run)
    meta = compressed.meta
    info = CacheInfo(
        path=str(compressed.path) if compressed.path else None,
        file_bytes=compressed.file_bytes,
        kv_bytes=compressed.state.kv_bytes,
        prefix_tokens=n,
        continuation_tokens=len(prep.prompt.input_ids) - n,
        scoring=meta.scoring,
        prefix_prefill_seconds=meta.prefill_seconds,
        read_seconds=compressed.read_seconds,
        first_token_seconds=timing.get("first", time.perf_counter() - began),
    )
    return replace(result, cache=info, question=plan.request.fields.get("question"))
