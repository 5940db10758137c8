"""The real-document QA set: questions on documents that Debian packages and CPython ship.

The set (`data/real_qa.yaml`, validated strictly, version 2) stores no document text: each
document is named by where it is installed (a Debian package and the path of a PDF or text it
ships, or a file of CPython's standard library), with the sha256 of the text the project's own
loader (`tasks.inputs.documents`) extracts from it, its length and pages, and its token count
(the default model's tokenizer). Each question has its type, its gold answers and its evidence:
the character offset (and PDF page) where a short quote of the passage that holds the answer
starts. Unanswerable questions (type ``unanswerable``) have neither answers nor evidence: the
document does not hold the answer; they list the key terms (`absent`) an answer would need, none
of which the text holds. Each document belongs to one half of a fixed split by document (`split`:
"tune", on which settings may be chosen, or "held-out", which reports them). Version 1 files (no
split, no key terms) still load, without a split. The Debian documents are DFSG-free and
CPython's are under the PSF licence, so the short quotes may be kept as evidence.

Opening the set (`open_documents`) finds each document, extracts its text, and checks every
quote: exactly at its offset (whitespace may differ: PDF lines wrap), else near it or anywhere
in the text, else fuzzily (rapidfuzz, similarity at least `FUZZY_MIN`). A document whose package
is not installed is skipped with a reason that names the package; one whose text changed (another
package version) is kept when its quotes are still found, and a question whose quote is not
found is skipped with its reason.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import sys
import sysconfig
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from rapidfuzz import fuzz

from cake_cli.errors import CakeError
from cake_cli.tasks.inputs.documents import Document, load_document, page_of_offset

SCHEMA_VERSION = 2
VERSIONS = (1, 2)  # version 1: no `split` per document, no `absent` per unanswerable question
SPLITS = ("tune", "held-out")  # the halves of the set, by document
QUESTION_TYPES = ("name", "date", "number", "term", "reason", "unanswerable")
UNANSWERABLE = "unanswerable"
SOURCES = ("debian", "python")
FUZZY_MIN = 90.0  # least rapidfuzz partial-ratio for a quote found fuzzily (extraction differs slightly)
NEAR = 2000  # characters around the stored offset searched first


def data_path() -> Path:
    """The packaged set: `cake_cli/bench/data/real_qa.yaml`."""
    return Path(str(resources.files("cake_cli.bench") / "data" / "real_qa.yaml"))


# ---- the file, as written: strict pydantic models -------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Evidence(_Strict):
    offset: Annotated[int, Field(ge=0)]  # character offset of the quote in the extracted text
    page: Annotated[int, Field(ge=1)] | None = None  # 1-based PDF page of the offset (None for text)
    quote: Annotated[str, Field(min_length=8, max_length=300)]


class _Question(_Strict):
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    question: Annotated[str, Field(min_length=5)]
    type: Literal["name", "date", "number", "term", "reason", "unanswerable"]
    answers: list[Annotated[str, Field(min_length=1)]] = []
    evidence: _Evidence | None = None
    absent: list[Annotated[str, Field(min_length=2)]] = []  # unanswerable: key terms the text must not hold

    @model_validator(mode="after")
    def _answerable(self) -> _Question:
        if self.type == UNANSWERABLE and (self.answers or self.evidence):
            raise ValueError(f"question {self.id}: an unanswerable question has no answers and no evidence")
        if self.type != UNANSWERABLE and (not self.answers or self.evidence is None):
            raise ValueError(f"question {self.id}: an answerable question needs answers and evidence")
        if self.type != UNANSWERABLE and self.absent:
            raise ValueError(f"question {self.id}: only an unanswerable question lists absent key terms")
        return self


class _Document(_Strict):
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    title: str
    source: Literal["debian", "python"]
    package: str | None = None  # the Debian package that ships it (source: debian)
    path: str  # absolute (debian) or relative to the standard library (python)
    licence: str
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]  # of the extracted text (UTF-8)
    chars: Annotated[int, Field(gt=0)]
    tokens: Annotated[int, Field(gt=0)]  # with the set's tokenizer
    pages: Annotated[int, Field(ge=1)] | None = None
    split: Literal["tune", "held-out"] | None = None  # required from version 2
    questions: Annotated[list[_Question], Field(min_length=1)]

    @model_validator(mode="after")
    def _where(self) -> _Document:
        if self.source == "debian" and (not self.package or not self.path.startswith("/")):
            raise ValueError(f"document {self.id}: a Debian document needs its package and an absolute path")
        if self.source == "python" and (self.package or self.path.startswith("/")):
            raise ValueError(f"document {self.id}: a Python document has a path inside the standard library only")
        return self


class _SetFile(_Strict):
    version: int
    tokenizer: str  # whose tokens `tokens` counts
    python: str  # the CPython version the python documents' offsets were taken on, e.g. "3.11"
    documents: Annotated[list[_Document], Field(min_length=1)]

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        if isinstance(v, bool) or v not in VERSIONS:
            raise ValueError(f"version {v}, expected {SCHEMA_VERSION} (or {', '.join(map(str, VERSIONS[:-1]))})")
        return v

    @model_validator(mode="after")
    def _unique(self) -> _SetFile:
        ids = [d.id for d in self.documents] + [q.id for d in self.documents for q in d.questions]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"ids used twice: {', '.join(twice)}")
        return self

    @model_validator(mode="after")
    def _versioned(self) -> _SetFile:
        """Version 2 needs each document's split and each unanswerable question's key terms; version 1
        has neither."""
        for d in self.documents:
            unanswerable = [q for q in d.questions if q.type == UNANSWERABLE]
            if self.version == 1 and (d.split is not None or any(q.absent for q in d.questions)):
                raise ValueError(f"document {d.id}: split and absent key terms need version 2")
            if self.version >= 2 and d.split is None:
                raise ValueError(f"document {d.id}: no split (one of {', '.join(SPLITS)})")
            if self.version >= 2 and any(not q.absent for q in unanswerable):
                missing = next(q.id for q in unanswerable if not q.absent)
                raise ValueError(f"question {missing}: an unanswerable question lists its absent key terms")
        return self


# ---- the set, as the code uses it -----------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """Where the passage that holds a gold answer starts, and a short quote of it."""

    offset: int  # characters into the extracted text
    page: int | None  # 1-based PDF page (None for text)
    quote: str


@dataclass(frozen=True)
class RealQuestion:
    """One question of the set."""

    id: str
    question: str
    type: str  # of QUESTION_TYPES
    answers: tuple[str, ...]  # gold answers (any one is right); () when unanswerable
    evidence: Evidence | None  # None when unanswerable
    absent: tuple[str, ...] = ()  # unanswerable: key terms an answer would need, none in the text

    @property
    def answerable(self) -> bool:
        return self.type != UNANSWERABLE


@dataclass(frozen=True)
class RealDocument:
    """One document of the set: where it is installed and what its extracted text was."""

    id: str
    title: str
    source: str  # "debian" or "python"
    package: str | None
    path: str
    licence: str
    sha256: str
    chars: int
    tokens: int
    pages: int | None
    questions: tuple[RealQuestion, ...]
    split: str | None = None  # of SPLITS (None in a version 1 file)

    @property
    def file(self) -> Path:
        """The installed file: the path itself (debian) or inside this Python's standard library."""
        return Path(self.path) if self.source == "debian" else Path(sysconfig.get_paths()["stdlib"]) / self.path

    def missing(self) -> str | None:
        """Why the document cannot be read here (its package is not installed), or None."""
        if self.file.is_file():
            return None
        if self.source == "debian":
            return f"{self.path} is not installed: apt-get install {self.package}"
        version = sys.version.split()[0]
        return f"{self.path} is not in this Python's standard library ({self.file.parent}, Python {version})"


@dataclass(frozen=True)
class RealSet:
    """The whole set: its documents (in file order) and the tokenizer their token counts use."""

    documents: tuple[RealDocument, ...]
    tokenizer: str
    python: str
    version: int = SCHEMA_VERSION

    @property
    def questions(self) -> tuple[RealQuestion, ...]:
        return tuple(q for d in self.documents for q in d.questions)

    def split_ids(self, split: str) -> tuple[str, ...]:
        """The ids of the documents in one half of the set, in file order.

        Raises:
            CakeError: `split` is not one of SPLITS, or the set has no split (a version 1 file).
        """
        if split not in SPLITS:
            raise CakeError(f"unknown split {split!r} of the real set", f"choose from {', '.join(SPLITS)}")
        if any(d.split is None for d in self.documents):
            raise CakeError(f"this real set (version {self.version}) has no split", "use a version 2 set")
        return tuple(d.id for d in self.documents if d.split == split)


def load_set(path: Path | None = None) -> RealSet:
    """Read and validate the set (strict: unknown keys, wrong types, a missing field, an answerable
    question without answers or evidence, ids used twice are errors).

    Raises:
        CakeError: the file is missing, not YAML, or not valid (one line naming the first problem).
    """
    path = path or data_path()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CakeError(f"cannot read the real-document set {path} ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise CakeError(f"{path.name} is not valid YAML: {str(exc).splitlines()[0]}") from None
    try:
        spec = _SetFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CakeError(f"{path.name} is not a valid real-document set: {where}: {first['msg']}") from None
    documents = tuple(
        RealDocument(
            d.id,
            d.title,
            d.source,
            d.package,
            d.path,
            d.licence,
            d.sha256,
            d.chars,
            d.tokens,
            d.pages,
            tuple(
                RealQuestion(
                    q.id,
                    q.question,
                    q.type,
                    tuple(q.answers),
                    Evidence(q.evidence.offset, q.evidence.page, q.evidence.quote) if q.evidence else None,
                    tuple(q.absent),
                )
                for q in d.questions
            ),
            d.split,
        )
        for d in spec.documents
    )
    return RealSet(documents, spec.tokenizer, spec.python, spec.version)


# ---- reading the documents and checking the quotes ------------------------------------------


def read_document(doc: RealDocument) -> Document:
    """The document's text through the project's loader (`tasks.inputs.documents.load_document`); a
    ``.gz`` file (Debian compresses most of what it ships) is decompressed first.

    Raises:
        CakeError: the file is missing or cannot be read (see `RealDocument.missing`).
    """
    reason = doc.missing()
    if reason:
        raise CakeError(f"document {doc.id}: {reason}")
    file = doc.file
    if file.suffix == ".gz":
        try:
            data = gzip.decompress(file.read_bytes())
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            hint = f"reinstall it: apt-get install --reinstall {doc.package}"
            raise CakeError(f"cannot decompress {file} ({exc})", hint) from None
        return replace(load_document("-", stdin=io.BytesIO(data)), source=str(file), warnings=())
    return load_document(str(file))


def text_sha256(text: str) -> str:
    """The sha256 of a text's UTF-8 bytes (hex)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Found:
    """Where a quote was found: its span in the text and how."""

    start: int
    end: int
    how: str  # "at offset" (exact, or whitespace apart), "moved" (elsewhere), "fuzzy" (rapidfuzz)
    similarity: float  # 100 unless fuzzy


def spaced_pattern(quote: str, flags: int = 0) -> re.Pattern:
    """A pattern for `quote` with any run of whitespace between its words."""
    return re.compile(r"\s+".join(re.escape(word) for word in quote.split()), flags)


def present_terms(text: str, terms) -> list[str]:
    """The terms found in `text` (case-insensitive, any whitespace between their words): for an
    unanswerable question, the key terms the document should not hold."""
    return [t for t in terms if spaced_pattern(t, re.IGNORECASE).search(text)]


def find_quote(text: str, quote: str, offset: int) -> Found | None:
    """Find `quote` in `text`, stored at `offset`: there (whitespace may differ), near it, anywhere,
    then fuzzily (rapidfuzz partial ratio >= FUZZY_MIN, near the offset first); None if not found."""
    pattern = spaced_pattern(quote)
    hit = pattern.match(text, offset) if 0 <= offset <= len(text) else None
    if hit:
        return Found(hit.start(), hit.end(), "at offset", 100.0)
    lo, hi = max(0, offset - NEAR), min(len(text), offset + len(quote) + NEAR)
    hit = pattern.search(text, lo, hi) or pattern.search(text)
    if hit:
        return Found(hit.start(), hit.end(), "moved", 100.0)
    for a, b in ((lo, hi), (0, len(text))):
        found = fuzz.partial_ratio_alignment(" ".join(quote.split()), text[a:b])
        if found is not None and found.score >= FUZZY_MIN:
            return Found(a + found.dest_start, a + found.dest_end, "fuzzy", float(found.score))
    return None


@dataclass(frozen=True)
class OpenDocument:
    """A document of the set read here: its text, and where each answerable question's quote is."""

    spec: RealDocument
    doc: Document  # the extracted text (pages for a PDF)
    changed: bool  # the text's sha256 differs from the stored one (another package version)
    found: dict  # question id -> Found (answerable questions whose quote was found)
    skipped: dict  # question id -> why it is left out (its quote was not found)

    @property
    def questions(self) -> tuple[RealQuestion, ...]:
        """The questions that can be asked here (unanswerable ones, and those whose quote was found)."""
        return tuple(q for q in self.spec.questions if q.id not in self.skipped)

    def page_of(self, found: Found) -> int | None:
        return page_of_offset(self.doc, found.start)


def check_document(spec: RealDocument, doc: Document) -> OpenDocument:
    """Check a read document against the set: its sha256, and every quote (`find_quote`)."""
    found, skipped = {}, {}
    for q in spec.questions:
        if q.evidence is None:
            continue
        where = find_quote(doc.text, q.evidence.quote, q.evidence.offset)
        if where is None:
            skipped[q.id] = f"quote not found in {spec.path}: {q.evidence.quote[:60]!r}"
        else:
            found[q.id] = where
    return OpenDocument(spec, doc, text_sha256(doc.text) != spec.sha256, found, skipped)


def open_documents(real: RealSet, ids: list[str] | None = None) -> tuple[list[OpenDocument], list[str]]:
    """Read the set's documents (all, or those named in `ids`) and check them.

    Returns:
        (documents read, one line per document left out: its id and why, e.g. its package is not
        installed; plus one line per changed document).

    Raises:
        CakeError: an id in `ids` is not in the set.
    """
    known = {d.id: d for d in real.documents}
    unknown = [i for i in ids or [] if i not in known]
    if unknown:
        raise CakeError(f"no document {', '.join(unknown)} in the real set", f"choose from {', '.join(known)}")
    chosen = [known[i] for i in ids] if ids else list(real.documents)
    opened, notes = [], []
    for spec in chosen:
        reason = spec.missing()
        if reason:
            notes.append(f"{spec.id}: skipped, {reason}")
            continue
        checked = check_document(spec, read_document(spec))
        if checked.changed:
            notes.append(
                f"{spec.id}: its text differs from the set's (another version of {spec.package or 'Python'}); "
                f"{len(checked.found)} quotes found again, {len(checked.skipped)} questions left out"
            )
        opened.append(checked)
    return opened, notes
