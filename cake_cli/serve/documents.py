"""The served documents folder: names resolved inside it (never outside), uploads kept in it, and every
text or PDF document compressed once into a .cake file keyed by its sha256 and the settings, so the
same document is never prefilled twice (across requests and restarts).

Layout: `DIR/NAME` (documents and .cake files, uploads too) and `DIR/.cake-cache/SHA-SETTINGS.cake`
(the compressed prefixes, written atomically: a stopped server leaves no half-written file). A .cake is
compressed with the default scoring ("question": the prefix kept whole), so each request's own budget,
method and window apply when it asks (`tasks.saved.compress`).

Not thread-safe by design: the server calls `prepare` and `upload` from its one model worker.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from cake_cli.files import write_atomic
from cake_cli.serve.errors import NOT_FOUND, ApiError
from cake_cli.tasks import pipeline
from cake_cli.tasks.planning import plan
from cake_cli.tasks.request import COMPRESS, Callbacks, Plan, TaskRequest
from cake_cli.tasks.runner import ReadyModel
from cake_cli.tasks.saved.fileformat import DEFAULT_SCORING, FORMAT_VERSION, SUFFIX, SavedCache, read_saved
from cake_cli.tasks.saved.request import check_scoring_method, scoring_request

CACHE_DIR = ".cake-cache"
UPLOAD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,199}")  # one plain file name, no folders
SERVED_SCORINGS = ("question", "end", "instruction")  # reconstruct (4-5x a prefill) is `cake compress`'s
UPLOAD_SUFFIXES = (".txt", ".md", ".pdf", ".rst", ".csv", ".json", ".html", ".xml", ".log", ".tex")


@dataclass(frozen=True)
class Prepared:
    """A request's plan on its document's .cake and the prefix it continues."""

    plan: Plan
    prefix: pipeline.Prefix
    cache: str  # the .cake, relative to the served folder
    compressed_now: bool
    compress_seconds: float
    read_now: bool  # the .cake was read from disk by this request (else its prefix was in memory)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class DocumentFolder:
    """Documents served from `root` on one loaded model; `prefixes`: compressed prefixes kept in memory."""

    def __init__(self, root: Path, ready: ReadyModel, model: str | None, prefixes: int = 4):
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self.ready, self.model, self.prefixes = ready, model, prefixes
        loaded = ready.loaded
        settings = f"{loaded.name}|{loaded.dtype}|{loaded.weights}|{DEFAULT_SCORING}|{FORMAT_VERSION}"
        self.settings_key = sha256_of(settings.encode())[:8]
        self._saved: dict[tuple, SavedCache] = {}  # (path, mtime_ns, size) -> the file read and checked
        self._loaded: OrderedDict[tuple, pipeline.Prefix] = OrderedDict()  # least recently used first

    def resolve(self, name: str | None) -> Path:
        """The file a request names, inside the served folder.

        Raises:
            ApiError: 400 no name, an absolute name, '..', a hidden part or a link leading out; 404 no such file.
        """
        if not name:
            raise ApiError(400, "no document: name one in cake.document (see GET /v1/documents)", code="document")
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if "\x00" in name or PurePosixPath(name).is_absolute() or any(p == ".." or p.startswith(".") for p in parts):
            message = f"document name '{name}' must be a plain name inside the served folder"
            raise ApiError(400, message, code="document")
        path = self.root.joinpath(*parts)
        real = path.resolve()
        if not real.is_relative_to(self.root):
            raise ApiError(400, f"document name '{name}' leads outside the served folder", code="document")
        if not real.is_file():
            raise ApiError(404, f"no document '{name}' in the served folder", NOT_FOUND, "document_not_found")
        return real

    def names(self) -> list[str]:
        """The documents served (relative names), sorted."""
        found = (p for p in self.root.rglob("*") if p.is_file())
        rels = (p.relative_to(self.root).as_posix() for p in found)
        return sorted(r for r in rels if not any(part.startswith(".") for part in r.split("/")))

    def cache_path(self, data: bytes, request: TaskRequest, scoring: str) -> Path:
        """Where the document with these bytes is kept compressed for this model and these settings: with the
        default scoring the prefix is kept whole (any budget can ask it); a question-agnostic scoring evicts it
        once, so its budget, window and method are part of the key."""
        key = self.settings_key
        if scoring != DEFAULT_SCORING:
            fields = (scoring, request.budget, request.window, request.method, request.allocation, request.indicator)
            key += "-" + sha256_of("|".join(map(str, fields)).encode())[:8]
        return self.root / CACHE_DIR / f"{sha256_of(data)[:32]}-{key}{SUFFIX}"

    def _read(self, path: Path) -> SavedCache:
        stat = path.stat()
        key = (path, stat.st_mtime_ns, stat.st_size)
        if key not in self._saved:
            self._saved = {k: v for k, v in self._saved.items() if k[0] != path}
            self._saved[key] = read_saved(path)
        return self._saved[key]

    def _compress(self, source: Path, cake: Path, request: TaskRequest, cb: Callbacks, scoring: str) -> float:
        """Compress `source` into `cake` (atomically); its seconds."""
        start = time.perf_counter()
        if scoring == DEFAULT_SCORING:  # kept whole: the file is the same whoever asks first (the CAKE defaults;
            # each request's own budget and method apply when it asks)
            request = replace(request, budget=None, window=None, method=None, allocation=None, indicator=None)
        checked = plan(scoring_request(replace(request, task=COMPRESS, document=str(source), fields={}), scoring), cb)
        check_scoring_method(checked, scoring)
        prefix = pipeline.open_prefix(self.ready, checked, cb, scoring)
        cake.parent.mkdir(parents=True, exist_ok=True)
        pipeline.save_prefix(prefix, cake)
        return time.perf_counter() - start

    def compressed(
        self, source: Path, request: TaskRequest, cb: Callbacks, scoring: str | None = None
    ) -> tuple[Path, bool, float]:
        """(the .cake of `source`, compressed by this call, its seconds): `source` itself when it is a .cake.
        `scoring`: how a document compressed now is scored (`AGNOSTIC` or the default).

        Raises:
            ApiError: 400 a scoring not served, or one given with a .cake (already scored).
        """
        if source.suffix.lower() == SUFFIX:
            if scoring is not None:
                raise ApiError(400, "cake.scoring applies to a text or PDF document, not a .cake", code="scoring")
            return source, False, 0.0
        scoring = scoring or DEFAULT_SCORING
        if scoring not in SERVED_SCORINGS:
            raise ApiError(400, f"cake.scoring '{scoring}' is not one of {', '.join(SERVED_SCORINGS)}", code="scoring")
        cake = self.cache_path(source.read_bytes(), request, scoring)
        if cake.exists():
            return cake, False, 0.0
        return cake, True, self._compress(source, cake, request, cb, scoring)

    def prepare(
        self, name: str | None, request: TaskRequest, cb: Callbacks | None = None, scoring: str | None = None
    ) -> Prepared:
        """A request's plan and prefix on the document `name`: a .cake in the folder is used as it is; a text or
        PDF document is compressed the first time (and whenever its bytes change), then read from its .cake.

        Raises:
            ApiError: see `resolve`. CakeError / ConfigError: bad settings, a document that cannot be read, a
                .cake made with another model.
        """
        cb = cb or Callbacks()
        cake, now, seconds = self.compressed(self.resolve(name), request, cb, scoring)
        saved = self._read(cake)
        checked = plan(replace(request, document=str(cake)), cb, saved=saved)
        prefix, read = self._prefix(saved, checked, cb)
        return Prepared(checked, prefix, cake.relative_to(self.root).as_posix(), now, seconds, read)

    def _prefix(self, saved: SavedCache, checked: Plan, cb: Callbacks) -> tuple[pipeline.Prefix, bool]:
        """(the .cake's prefix, read from the file by this call): kept in memory, least recently used dropped."""
        key = (saved.path, saved.meta.sha256)
        if key in self._loaded:
            self._loaded.move_to_end(key)
            return self._loaded[key], False
        prefix = pipeline.open_prefix(self.ready, checked, cb)
        self._loaded[key] = prefix
        while len(self._loaded) > self.prefixes:
            self._loaded.popitem(last=False)
        return prefix, True

    def upload(
        self, name: str, data: bytes, request: TaskRequest, cb: Callbacks | None = None, scoring: str | None = None
    ) -> dict:
        """Keep an uploaded text or PDF document in the folder (as `name`, or `STEM-SHA8.SUFFIX` when another
        document holds that name) and compress it now unless it was already.

        Raises:
            ApiError: 400 a name that is not one plain file name of a text or PDF kind.
            CakeError: a document that cannot be read (empty, binary, scanned PDF); it is not kept.
        """
        if not UPLOAD_NAME.fullmatch(name or "") or Path(name).suffix.lower() not in UPLOAD_SUFFIXES:
            raise ApiError(
                400,
                f"upload name '{name}' must be one plain file name ending in {', '.join(UPLOAD_SUFFIXES)}",
                code="document",
            )
        sha = sha256_of(data)
        path = self.root / name
        if path.exists() and (not path.is_file() or path.read_bytes() != data):
            path = self.root / f"{path.stem}-{sha[:8]}{path.suffix}"
        written = not path.exists()
        if written:
            write_atomic(path, data, "the uploaded document")
        try:
            cake, now, seconds = self.compressed(path, request, cb or Callbacks(), scoring)
        except BaseException:
            if written:  # a document that cannot be read is not kept
                path.unlink(missing_ok=True)
            raise
        meta = self._read(cake).meta
        return {
            "document": path.name,
            "sha256": sha,
            "bytes": len(data),
            "cache": cake.relative_to(self.root).as_posix(),
            "compressed_now": now,
            "compress_seconds": seconds,
            "prefix_tokens": len(meta.prefix_ids),
            "document_tokens": meta.document_tokens,
            "kv_bytes": meta.kv_bytes,
        }
