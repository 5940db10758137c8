"""A task request on a .cake file, checked against the file before torch loads (light).

The model (and its dtype) of a saved cache are fixed. So are the method, the budget and the
observation window of a prefix already evicted (scoring "end" / "instruction"): a request leaves
them unset (None, or `--dtype auto`) to take the file's, or gives the same values; anything else
contradicts the file and is a usage error naming the fix. A prefix kept whole (scoring
"question", or --method full) is evicted when the question is asked: there the task's own budget,
method and window apply (the file's by default). Decoding settings stay free.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cake_cli.engine.allocation import ALLOCATIONS, GLOBAL
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.methods import FULL, resolve
from cake_cli.errors import CakeError, UsageError
from cake_cli.models.dtypes import check_dtype
from cake_cli.models.profiles import check_model_spec, model_spec
from cake_cli.tasks.inputs.documents import Document
from cake_cli.tasks.request import Plan, TaskRequest
from cake_cli.tasks.saved.fileformat import CacheMeta, SavedCache, is_cache_path
from cake_cli.tasks.templates import load_template


def _contradiction(saved: SavedCache, flag: str, given, stored) -> UsageError:
    return UsageError(
        f"{flag} {given} contradicts {saved.name}, which was compressed with {flag} {stored}",
        f"drop {flag} (the file's setting is used), or compress again with {flag} {given}",
    )


def same_model(given: str, meta: CacheMeta) -> bool:
    """Whether a --model value names the model a cache was made with (name, alias or path).

    Raises:
        CakeError: `given` is no model at all (unknown name, missing path).
    """
    if given == meta.model:
        return True
    profile = check_model_spec(given)
    if profile is not None and meta.profile is not None:
        return profile.name == meta.profile
    path = Path(given).expanduser()
    return path.exists() and Path(meta.model).exists() and path.resolve() == Path(meta.model).resolve()


def _model(request: TaskRequest, saved: SavedCache) -> str:
    meta = saved.meta
    if request.model is None:
        try:
            check_model_spec(meta.model)
        except CakeError:
            raise CakeError(
                f"{saved.name} was compressed with the model {meta.model}, which is not available here",
                "pass --model with that model, or compress the document again with another",
            ) from None
        return meta.model
    if not same_model(model_spec(request.model), meta):
        raise UsageError(
            f"--model {request.model} does not match {saved.name}, which was compressed with {meta.model_name}",
            f"drop --model (the file's model is used), or compress the document again with --model {request.model}",
        )
    return request.model


def settle(request: TaskRequest, saved: SavedCache) -> TaskRequest:
    """The request with the file's prefill settings filled in.

    Raises:
        UsageError: --model, --dtype, --method/--allocation/--indicator, --budget or --window
            contradicts the file; or a task that cannot use a saved prefix (complete, --at).
        CakeError: the file's model is not available here.
    """
    meta = saved.meta
    if not load_template(request.task).chat or request.at_line is not None:
        raise UsageError(
            f"{request.task} continues a source file as raw text; {saved.name} holds a chat prompt's document",
            "give the source file itself",
        )
    model = _model(request, saved)
    dtype = check_dtype(request.dtype)
    if dtype is not None and dtype != meta.dtype:
        raise _contradiction(saved, "--dtype", dtype, meta.dtype)
    if meta.whole:  # evicted when the question is asked: the task's own settings, the file's by default
        given = any(x is not None for x in (request.method, request.allocation, request.indicator))
        return replace(
            request,
            model=model,
            dtype=meta.dtype,
            method=request.method or ("cake" if meta.method == FULL and request.budget is not None else meta.method),
            allocation=request.allocation if given else meta.allocation,
            indicator=request.indicator if given else meta.indicator,
            budget=request.budget if request.budget is not None else meta.budget,
            window=request.window if request.window is not None else meta.window,
        )
    stored_pair = None if meta.method == FULL else (meta.allocation, meta.indicator)
    if request.method is not None or request.allocation is not None or request.indicator is not None:
        given = request.method or meta.method
        if resolve(given, request.allocation, request.indicator) != stored_pair:
            shown = "+".join(p for p in (request.allocation, request.indicator) if p) or given
            raise _contradiction(saved, "--method", shown, meta.method)
    for flag, given, stored in (("--budget", request.budget, meta.budget), ("--window", request.window, meta.window)):
        if given is not None and given != stored:
            raise _contradiction(saved, flag, given, stored if stored is not None else "none (--method full)")
    return replace(
        request,
        model=model,
        dtype=meta.dtype,
        method=meta.method,
        allocation=meta.allocation,
        indicator=meta.indicator,
        budget=meta.budget,
        window=meta.window,
    )


def saved_config(meta: CacheMeta, decode_policy: str) -> CakeConfig:
    """The CakeConfig an evicted prefix (`not meta.whole`) was compressed with, decoding with `decode_policy`."""
    return CakeConfig(
        budget=meta.budget,
        window=meta.window,
        tau1=meta.tau1,
        tau2=meta.tau2,
        gamma=meta.gamma,
        pool_kind=meta.pool_kind,
        pool_kernel=meta.pool_kernel,
        decode_policy=decode_policy,
        allocation=meta.allocation,
        indicator=meta.indicator,
    )


def saved_document(meta: CacheMeta) -> Document:
    """The document a cache was compressed from, as the task sees it (text for needle locations)."""
    return Document(text=meta.text, source=meta.source, kind=meta.kind, page_offsets=tuple(meta.page_offsets))


def scoring_request(request: TaskRequest, scoring: str) -> TaskRequest:
    """The request of a document compressed now with `scoring`: `reconstruct` ranks tokens by the attention
    a reconstruction of the document gives them, so with neither --method nor --indicator given it runs the
    paper's `cake` rather than the profile's default method (whose indicator, e.g. cake-chunk's, ranks a
    question-aware prefill); what the user named is kept, and `check_scoring_method` checks it. A .cake
    file's request is unchanged (the file's own method applies)."""
    if is_cache_path(request.document):
        return request
    if scoring == "reconstruct" and request.method is None and request.indicator is None:
        return replace(request, method="cake")
    return request


def check_scoring_method(plan: Plan, scoring: str) -> None:
    """Refuse a --scoring that cannot go with the plan's method (a document compressed now, not a .cake).

    Raises:
        UsageError: `reconstruct` with --method full (nothing to evict), or with an indicator other than
            CAKE's (the reconstruction's attention ranks the tokens: `engine.reconstruct`).
    """
    check_global(plan, scoring)
    if scoring != "reconstruct" or plan.saved is not None:
        return
    if not plan.evicts:
        raise UsageError(
            "--scoring reconstruct scores the document to evict it, and --method full evicts nothing",
            "drop --method full, or keep the whole prefix with --scoring question",
        )
    if plan.config.indicator != "cake":
        raise UsageError(
            "--scoring reconstruct ranks tokens by the attention a reconstruction of the document gives them; "
            f"it takes no {plan.config.indicator} indicator",
            "use --method cake (CAKE budgets), --allocation uniform (equal budgets) or --allocation global (KVzip)",
        )


def check_global(plan: Plan, scoring: str | None = None) -> None:
    """Refuse `--allocation global` (KVzip's one ranking over layers and KV heads) where no reconstruction
    scores it: it runs only when a document is compressed with `--scoring reconstruct` (compress, chat), or
    on a .cake file made that way (its own setting).

    Args:
        scoring: the --scoring of a document compressed now (compress, chat); None for a task command.

    Raises:
        UsageError: global with another scoring, with a prefix kept whole, or with a task's own prefill.
    """
    if not plan.evicts or plan.config.allocation != GLOBAL:
        return
    if plan.saved is not None and not plan.saved.meta.whole:
        return  # the file's own allocation
    if plan.saved is None and scoring == "reconstruct":
        return
    raise UsageError(
        "--allocation global ranks the reconstruction scores of every layer and KV head; it needs --scoring "
        "reconstruct",
        "compress with: cake compress DOC -o FILE.cake --scoring reconstruct --allocation global; or choose "
        f"--allocation {'|'.join(ALLOCATIONS)}",
    )
