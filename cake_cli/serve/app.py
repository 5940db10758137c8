"""The ASGI app of `cake serve` (FastAPI): OpenAI's `/v1/models`, `/v1/chat/completions` and `/v1/completions`
(streamed as server-sent events ending with `data: [DONE]`, or whole), `/health`, the queue's state
(`/v1/cake/status`) and the documents folder (`/v1/documents`: list, upload). A thin caller of the task
pipeline (`tasks.pipeline`), as the CLI is.

Every request runs on the one loaded model in its turn (`serve.slots`); a client that goes away stops its
generation at the next piece of text; a stopping server cancels the running one. Errors are JSON
(`serve.errors`), never a traceback.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import anyio
from anyio.to_thread import run_sync
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from cake_cli.engine.config import ConfigError, SamplingConfig
from cake_cli.errors import CakeError
from cake_cli.serve.documents import SERVED_SCORINGS, DocumentFolder
from cake_cli.serve.errors import AUTH, NOT_FOUND, SERVER, TOO_LARGE, ApiError, from_cake
from cake_cli.serve.protocol import FIELD_OF, TASKS, ChatBody, CompletionBody, Reply, Served, parse
from cake_cli.serve.settings import ServeSettings
from cake_cli.serve.slots import Job, RequestQueue
from cake_cli.tasks import pipeline
from cake_cli.tasks.planning import cake_config_for, check_request
from cake_cli.tasks.request import Callbacks, TaskRequest
from cake_cli.tasks.runner import ReadyModel

log = logging.getLogger("uvicorn.error.cake")  # a child of uvicorn's logger: its handlers and level print it
_END = object()


class Server:
    """The app's state: settings, the model, its documents folder, its queue, the runs in progress."""

    def __init__(self, settings: ServeSettings, ready: ReadyModel, model_id: str):
        self.settings, self.ready, self.model_id = settings, ready, model_id
        self.folder = DocumentFolder(settings.documents, ready, settings.model, settings.prefixes)
        self.queue = RequestQueue(settings.max_queue)
        self.streams: set[pipeline.TextStream] = set()
        self.base = TaskRequest(
            task="qa",
            document="",
            model=settings.model,
            dtype=settings.dtype,
            weights=settings.weights,
            attention=settings.attention,
            threads=settings.threads,
        )

    def authorize(self, request: Request) -> None:
        """Raises ApiError 401 unless the request carries the key (when one is set)."""
        key = self.settings.api_key
        if key and not hmac.compare_digest(request.headers.get("authorization", "").encode(), f"Bearer {key}".encode()):
            raise ApiError(401, "a valid API key is needed: send 'Authorization: Bearer KEY'", AUTH, "invalid_api_key")

    def task_request(self, body: ChatBody | CompletionBody) -> TaskRequest:
        """The TaskRequest of a body, its settings checked (cheap: no document read yet).

        Raises:
            ApiError: 404 another model; 400 a bad task, question, token limit or CAKE setting.
        """
        if body.model not in (self.model_id, self.settings.model):
            raise ApiError(
                404, f"model '{body.model}' is not served here; this server serves '{self.model_id}'", NOT_FOUND,
                "model_not_found",
            )  # fmt: skip
        cake = body.cake
        if cake.task not in TASKS:
            raise ApiError(400, f"cake.task '{cake.task}' is not one of {', '.join(TASKS)}", code="invalid_value")
        question = body.question().strip()
        field = FIELD_OF.get(cake.task)
        if field and not question:
            where = "the last user message" if isinstance(body, ChatBody) else "prompt"
            raise ApiError(400, f"task {cake.task} needs a question: {where} is empty", code="invalid_value")
        if cake.scoring is not None and cake.scoring not in SERVED_SCORINGS:
            served = ", ".join(SERVED_SCORINGS)
            raise ApiError(400, f"cake.scoring '{cake.scoring}' is not one of {served}", code="scoring")
        limit = body.limit()
        if limit is not None and limit > self.settings.max_tokens:
            raise ApiError(400, f"max_tokens {limit} is over this server's limit of {self.settings.max_tokens}")
        try:
            sampling = SamplingConfig(body.temperature or 0.0, 1.0 if body.top_p is None else body.top_p, body.seed)
            request = replace(
                self.base,
                task=cake.task,
                fields={field: question} if field else {},
                budget=cake.budget,
                window=cake.window,
                method=cake.method,
                allocation=cake.allocation,
                indicator=cake.indicator,
                decode_policy=cake.decode_policy,
                max_new_tokens=limit,
                sampling=sampling,
            )
            check_request(request)
            cake_config_for(self.ready.loaded.profile, request)
        except (CakeError, ConfigError) as exc:
            raise from_cake(exc) from None
        return request

    async def answer(self, request: Request, job: Job, body, task: TaskRequest) -> AsyncIterator[str | Served]:
        """The answer's text pieces, then its `Served`. The model is held from the first step to the last;
        a step running on the worker thread is waited for even when the request is cancelled."""
        async with self.queue.turn(job):
            waited = job.started - job.admitted
            cb = Callbacks(on_layer=job.on_layer, on_status=lambda line: log.info("[%d] %s", job.id, line))
            with anyio.CancelScope(shield=True):  # the model is busy until it returns, whatever the client does
                prepared = await run_sync(self.folder.prepare, body.cake.document, task, cb, body.cake.scoring)
            stream = pipeline.stream(self.ready, prepared.plan, prepared.prefix, replace(cb, on_text=job.on_text))
            self.streams.add(stream)
            try:
                while (piece := await run_sync(next, stream, _END)) is not _END:
                    yield piece
                    if await request.is_disconnected():
                        stream.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await run_sync(stream.close)
                self.streams.discard(stream)
                job.phase = "cancelled" if stream.cancelled else "done"
                if stream.cancelled:
                    self.queue.counts["cancelled"] += 1
            name, cache = body.cake.document, prepared.cache
            now, seconds = prepared.compressed_now, prepared.compress_seconds
            yield Served(stream.result, name, cache, now, seconds, waited, prepared.read_now)

    async def complete(self, request: Request, kind) -> JSONResponse | StreamingResponse:
        self.authorize(request)
        body = parse(kind, decode_json(await read_body(request, self.settings.max_body)))
        task = self.task_request(body)
        self.folder.resolve(body.cake.document)  # 400 / 404 before the queue and before a stream starts
        job = self.queue.admit("chat" if kind is ChatBody else "completion", body.cake.document)
        reply = Reply(kind is ChatBody, self.model_id)
        began = time.perf_counter()
        if body.stream:
            return StreamingResponse(
                self.events(request, job, body, task, reply, began),
                media_type="text/event-stream",
                background=BackgroundTask(self.queue.leave, job),
            )
        served = None
        try:
            async for item in self.answer(request, job, body, task):
                served = item if isinstance(item, Served) else served
        except (CakeError, ConfigError) as exc:
            if not isinstance(exc, pipeline.Cancelled):
                self.queue.counts["failed"] += 1
            raise from_cake(exc) from None
        finally:
            self.queue.leave(job)
        self.queue.counts["served"] += 1
        seconds = time.perf_counter() - began
        log.info("%s %s: %d tokens in %.2f s", job.kind, job.document, served.result.generated_tokens, seconds)
        return JSONResponse(reply.whole(served))

    async def events(self, request, job, body, task, reply: Reply, began: float) -> AsyncIterator[str]:
        if reply.chat:
            yield sse(reply.chunk(first=True))
        try:
            async for item in self.answer(request, job, body, task):
                if isinstance(item, Served):
                    self.queue.counts["served"] += 1
                    yield sse(reply.chunk(served=item))
                else:
                    yield sse(reply.chunk(item))
        except (CakeError, ConfigError, ApiError) as exc:
            if not isinstance(exc, pipeline.Cancelled):
                self.queue.counts["failed"] += 1
            yield sse((exc if isinstance(exc, ApiError) else from_cake(exc)).body())
        except Exception as exc:  # the status line is sent: the error goes in the stream
            log.exception("unexpected error while streaming")
            yield sse(ApiError(500, f"internal error: {type(exc).__name__}", SERVER).body())
        finally:
            self.queue.leave(job)
        log.info("%s %s (streamed) in %.2f s", job.kind, job.document, time.perf_counter() - began)
        yield sse("[DONE]")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused past `limit` bytes (by its Content-Length, or as it arrives).

    Raises:
        ApiError: 413 too large; 400 a Content-Length that is not a number.
    """
    declared = request.headers.get("content-length")
    try:
        if declared is not None and int(declared) > limit:
            message = f"the body ({declared} bytes) is over the limit of {limit} bytes"
            raise ApiError(413, message, TOO_LARGE, "too_large")
    except ValueError:
        raise ApiError(400, "Content-Length is not a number") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the body is over the limit of {limit} bytes", TOO_LARGE, "too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(raw: bytes) -> dict:
    """Raises ApiError 400 unless `raw` is one JSON object."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise ApiError(400, "the body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    return data


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's JSON: ours (`ApiError`), the router's (404, 405), and anything unexpected (500,
    logged; no traceback to the client)."""

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        kind = NOT_FOUND if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(ApiError(exc.status_code, str(exc.detail), kind).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return JSONResponse(ApiError(500, f"internal error: {type(exc).__name__}", SERVER).body(), status_code=500)


def create_app(settings: ServeSettings, ready: ReadyModel, model_id: str) -> FastAPI:
    """The app serving `ready` (loaded once) as `model_id` from `settings.documents`."""
    server = Server(settings, ready, model_id)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        for stream in list(server.streams):  # stopping: end the running generation at its next piece
            stream.cancel()

    app = FastAPI(title="cake serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    add_error_handlers(app)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_id}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        server.authorize(request)
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "cake-cli"}]}

    @app.get("/v1/cake/status")
    async def status(request: Request) -> dict:
        server.authorize(request)
        return {"model": model_id, **server.queue.status()}

    @app.get("/v1/documents")
    async def documents(request: Request) -> dict:
        server.authorize(request)
        return {"object": "list", "data": [{"id": name, "object": "document"} for name in server.folder.names()]}

    @app.post("/v1/documents")
    async def upload(
        request: Request, name: str = "", scoring: str | None = None, budget: int | None = None
    ) -> JSONResponse:
        server.authorize(request)
        data = await read_body(request, settings.max_upload)
        job = server.queue.admit("upload", name)
        async with server.queue.turn(job):
            with anyio.CancelScope(shield=True):
                try:
                    base = replace(server.base, budget=budget)
                    out = await run_sync(server.folder.upload, name, data, base, None, scoring)
                except (CakeError, ConfigError) as exc:
                    raise from_cake(exc) from None
            job.phase = "done"
        server.queue.counts["served"] += 1
        return JSONResponse({"object": "document", **out}, status_code=201 if out["compressed_now"] else 200)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await server.complete(request, ChatBody)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.complete(request, CompletionBody)

    return app
