"""The request bodies the server reads (OpenAI's chat and text completions, plus the `cake` extension
object) and the replies it writes. Pydantic models, validated strictly where the meaning would change
(unknown `cake` keys, n > 1) and leniently where clients send fields that do not matter here.

How a request becomes a task: the `cake` object names the document (`document`, a name inside the served
folder) and the task (`task`: qa by default, summarize, needle); the question is the last user message
(chat) or the prompt (completions). Earlier turns are not replayed: every question starts again from the
compressed document, as `cake chat` does. Budget, method, window, allocation, indicator and decode
policy are per request; the reply's `cake` object carries the report.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cake_cli.serve.errors import ApiError
from cake_cli.tasks.results import RunResult

TASKS = ("qa", "summarize", "needle")
FIELD_OF = {"qa": "question", "needle": "query"}  # the template field the question fills (summarize: none)


class CakeOptions(BaseModel):
    """The `cake` extension object of a request body."""

    model_config = ConfigDict(extra="forbid")

    document: str | None = None  # a name inside the served folder (a text, PDF or .cake file)
    task: str = "qa"
    budget: int | None = Field(default=None, ge=0)
    window: int | None = Field(default=None, ge=1)
    method: str | None = None
    allocation: str | None = None
    indicator: str | None = None
    decode_policy: str = "fixed"
    scoring: str | None = None  # a text or PDF document compressed now: question (default), end, instruction


class Message(BaseModel):
    """One chat message; `content` as text or as OpenAI's list of parts (text parts are joined)."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields (user, logprobs: false, …) that change nothing

    model: str
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)
    cake: CakeOptions = Field(default_factory=CakeOptions)

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ChatBody(_Common):
    messages: list[Message] = Field(min_length=1)

    def question(self) -> str:
        users = [m for m in self.messages if m.role == "user"]
        return users[-1].text() if users else ""


class CompletionBody(_Common):
    prompt: str | list[str] = ""

    def question(self) -> str:
        if isinstance(self.prompt, list):
            if len(self.prompt) > 1:
                raise ApiError(400, "one prompt per request (prompt lists of several are not batched)", code="n")
            return self.prompt[0] if self.prompt else ""
        return self.prompt


def parse(kind: type[_Common], data) -> _Common:
    """Validate a decoded JSON body.

    Raises:
        ApiError: 400 naming the first bad field.
    """
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "body"
        raise ApiError(400, f"{where}: {first['msg']}", code="invalid_value") from None


@dataclass(frozen=True)
class Served:
    """A finished answer and where it came from, for the reply's `cake` object."""

    result: RunResult
    document: str  # the name the request gave
    cache: str | None  # the .cake it was answered from, relative to the served folder
    compressed_now: bool  # True when this request compressed the document (first use)
    compress_seconds: float
    queue_seconds: float  # waiting for the model
    read_now: bool = True  # the .cake was read from disk for this request (else its prefix was in memory)


def finish_reason(result: RunResult) -> str:
    """OpenAI's finish_reason: "length" when the token allowance ran out, else "stop"."""
    return "length" if result.stop_reason in ("max_new_tokens", "max_positions") else "stop"


def report(served: Served) -> dict:
    """The `cake` object of a reply: settings, memory, timings (seconds), the cited passage (or None)."""
    r, cache = served.result, served.result.cache
    return {
        "document": served.document,
        "task": r.task,
        "method": r.method,
        "budget": r.budget,
        "window": r.window,
        "prompt_tokens": r.prompt_tokens,
        "document_tokens": r.document_tokens,
        "kv_bytes_full": r.kv_bytes_full,
        "kv_bytes_kept": r.kv_bytes_kept,
        "memory_saved_bytes": r.kv_bytes_full - r.kv_bytes_kept,
        "saved_fraction": r.saved_fraction,
        "cache": served.cache,
        "scoring": cache.scoring if cache else None,
        "compressed_now": served.compressed_now,
        "timings": {
            "queue_seconds": served.queue_seconds,
            "compress_seconds": served.compress_seconds,
            "read_seconds": cache.read_seconds if cache and served.read_now else 0.0,
            "first_token_seconds": cache.first_token_seconds if cache else None,
            "prefill_seconds": r.prefill_seconds,
            "decode_seconds": r.decode_seconds,
            "decode_tokens_per_second": r.decode_tokens_per_second,
        },
        "support": asdict(r.support) if r.support else None,
        "location": asdict(r.location) if r.location else None,
        "stop_reason": r.stop_reason,
        "warnings": list(r.warnings),
    }


def usage(result: RunResult) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.generated_tokens,
        "total_tokens": result.prompt_tokens + result.generated_tokens,
    }


class Reply:
    """Builds the reply objects of one request (chat or text completion), one id and timestamp for all."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, served: Served) -> dict:
        """The non-streamed reply."""
        r = served.result
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": r.printed}}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": r.printed, "logprobs": None}
            head = self._head("text_completion")
        choice["finish_reason"] = finish_reason(r)
        return {**head, "choices": [choice], "usage": usage(r), "cake": report(served)}

    def chunk(self, text: str | None = None, served: Served | None = None, first: bool = False) -> dict:
        """One streamed event: a piece of text, or (with `served`) the last one with finish_reason, usage and
        the `cake` report."""
        reason = finish_reason(served.result) if served else None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else ({} if text is None else {"content": text})
            out = {**self._head("chat.completion.chunk"), "choices": [{"index": 0, "delta": delta}]}
        else:
            out = {**self._head("text_completion"), "choices": [{"index": 0, "text": text or "", "logprobs": None}]}
        out["choices"][0]["finish_reason"] = reason
        if served is not None:
            out["usage"], out["cake"] = usage(served.result), report(served)
        return out
