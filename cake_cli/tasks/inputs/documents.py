"""Load the document a task reads: a PDF, a text file, or stdin (``-``), as normalised text.

``load_document("report.pdf")`` / ``load_document("notes.txt")`` / ``load_document("-")`` return
a frozen :class:`Document`. Every input problem the user can fix raises
:class:`~cake_cli.errors.CakeError` (exit code 1) with a one-line message and a hint; problems
that still leave text to work with become one-line ``Document.warnings``.

Format detection looks at the bytes, not the name: input starting with ``%PDF-`` is a PDF
(also on stdin); anything else is text. Text decoding policy, in order:

1. a UTF-16 byte-order mark → UTF-16; a UTF-8 one (or none) → strict UTF-8;
2. NUL bytes in the first KiB, or > 10 % control bytes in the first 8 KiB → "looks binary";
3. not valid UTF-8 but with some valid multi-byte UTF-8 sequences → UTF-8 with the invalid
   bytes replaced by U+FFFD (warning with the count);
4. no valid multi-byte UTF-8 at all → a legacy 8-bit file: cp1252, or latin-1 when cp1252
   cannot decode it (warning naming the encoding).

PDF text comes from :mod:`cake_cli.tasks.inputs.pdf` (pypdfium2; the library comparison is there).
Offsets are Python ``str`` indices (Unicode code points) into ``Document.text``.
"""

from __future__ import annotations

import bisect
import re
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cake_cli.errors import CakeError
from cake_cli.tasks.inputs import pdf

STDIN_NAME = "<stdin>"
PAGE_SEPARATOR = "\n\n"  # between the texts of two PDF pages in Document.text
PDF_MAGIC = b"%PDF-"

_BINARY_SNIFF_BYTES = 1024  # NUL within these → binary
_CONTROL_SNIFF_BYTES = 8192  # control-byte share measured over these
_MAX_CONTROL_SHARE = 0.10
_TEXT_CONTROLS = frozenset(b"\t\n\r\f\v\x1b")  # control bytes normal in text files

# Deleted by normalize_text: C0/C1 controls (line breaks are split off before), DEL, the BOM /
# zero-width no-break space, soft hyphen, and the non-characters U+FFFE/U+FFFF.
_DELETE = {c: None for c in (*range(0x00, 0x20), *range(0x7F, 0xA0), 0xAD, 0xFEFF, 0xFFFE, 0xFFFF)}
_DELETE.pop(ord("\t"))
_BLANK_RUN = re.compile(r"\n{4,}")  # more than two blank lines

_BLANK_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf"})  # spaces, separators, controls, format characters

_BINARY_HINT = "pass a PDF or a text file; convert other formats first, e.g. `pandoc FILE -t plain`"
_CONTENT_HINT = "give a document that has text in it"


@dataclass(frozen=True)
class Document:
    """A loaded document.

    Attributes:
        text: normalised text (see :func:`normalize_text`); PDF pages joined by ``"\\n\\n"``.
        source: the path as given, or ``"<stdin>"``.
        kind: ``"pdf"`` or ``"text"``.
        page_offsets: for a PDF, one entry per page: the offset (code points) in ``text`` where
            that page starts; a page without text gets the offset of the next page's start (or
            ``len(text)``), so it owns no characters. Empty for text.
        warnings: one-line warnings for the user, each starting with ``source``.
    """

    text: str
    source: str
    kind: str
    page_offsets: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()


def load_document(source: str, *, password: str | None = None, stdin: BinaryIO | None = None) -> Document:
    """Read ``source`` (a path, or ``"-"`` for ``stdin``) and return its normalised text.

    Args:
        source: file path, or ``"-"`` to read bytes from ``stdin``.
        password: PDF password; used only when the PDF does not open with the empty password.
        stdin: byte stream for ``"-"``; defaults to ``sys.stdin.buffer``.

    Raises:
        CakeError: missing file, a directory, unreadable file, empty or blank input ("nothing to read":
            only whitespace and invisible characters, see `is_blank`), binary input, PDF that is
            scanned (no text on any page), encrypted without/with a wrong password, or damaged beyond
            repair.
    """
    name = STDIN_NAME if source == "-" else source
    data = _read_stdin(stdin) if source == "-" else _read_file(source)
    if not data:
        raise CakeError(f"{name} is empty; nothing to read", _CONTENT_HINT)
    if data[:_BINARY_SNIFF_BYTES].lstrip().startswith(PDF_MAGIC):
        return _load_pdf(data, name, password)
    if source != "-" and Path(source).suffix.lower() == ".pdf":
        raise CakeError(
            f"{name} is not a PDF (it does not start with %PDF-)", "re-download it; if it is text, rename it to .txt"
        )
    text, warnings = decode_text(data, name)
    text = normalize_text(text)
    if is_blank(text):
        raise CakeError(f"{name} has only whitespace; nothing to read", _CONTENT_HINT)
    return Document(text=text, source=name, kind="text", warnings=tuple(warnings))


def is_blank(text: str) -> bool:
    """True when `text` holds nothing to read: only whitespace, Unicode spaces and separators (Zs, Zl,
    Zp), controls (Cc) and format characters (Cf: zero-width space U+200B, joiners, direction marks,
    U+FEFF, ...). Stops at the first visible character."""
    return all(ch.isspace() or unicodedata.category(ch) in _BLANK_CATEGORIES for ch in text)


def normalize_text(text: str) -> str:
    """Normalise text for a language model, in this order:

    1. every line break (``\\r\\n``, ``\\r``, ``\\f``, ``\\v``, U+2028, …; see ``str.splitlines``)
       becomes ``\\n``;
    2. control characters except ``\\n`` and ``\\t`` are deleted, as are U+00AD (soft hyphen),
       U+FEFF (BOM) and U+FFFE/U+FFFF (before step 3, so the result is stable);
    3. Unicode NFKC (ligatures ``ﬁ`` → ``fi``, full-width and no-break spaces → plain ones);
    4. trailing whitespace on each line is removed;
    5. runs of more than two blank lines become two; blank lines at the start and end go.

    Idempotent: ``normalize_text(normalize_text(s)) == normalize_text(s)``.
    """
    text = "\n".join(line.translate(_DELETE) for line in text.splitlines())
    lines = [line.rstrip() for line in unicodedata.normalize("NFKC", text).split("\n")]
    return _BLANK_RUN.sub("\n\n\n", "\n".join(lines)).strip("\n")


def page_of_offset(doc: Document, offset: int) -> int | None:
    """The 1-based PDF page holding character ``offset`` of ``doc.text``; ``None`` for text.

    ``offset == len(doc.text)`` (an end position) maps to the last page with text.

    Raises:
        ValueError: ``offset`` outside ``0 .. len(doc.text)``.
    """
    if not 0 <= offset <= len(doc.text):
        raise ValueError(f"offset {offset} is outside the document (0..{len(doc.text)})")
    if doc.kind != "pdf" or not doc.page_offsets:
        return None
    if offset == len(doc.text) and offset > 0:
        offset -= 1
    return bisect.bisect_right(doc.page_offsets, offset)


def pages_of_range(doc: Document, start: int, end: int) -> str | None:
    """The PDF pages characters ``start .. end`` of ``doc.text`` touch, e.g. ``"30-44"`` or ``"7"``;
    ``None`` for text. Offsets are clamped to the text."""
    if doc.kind != "pdf" or not doc.page_offsets:
        return None
    start, end = max(0, min(start, len(doc.text))), max(0, min(end, len(doc.text)))
    first, last = page_of_offset(doc, start), page_of_offset(doc, max(start, end - 1))
    return str(first) if first == last else f"{first}-{last}"


def decode_text(data: bytes, name: str) -> tuple[str, list[str]]:
    """Decode text bytes by the policy in the module docstring.

    Returns:
        ``(text, warnings)``; text is not yet normalised.

    Raises:
        CakeError: the bytes look binary.
    """
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return data.decode("utf-16"), []
        except UnicodeDecodeError:
            message = f"{name} looks binary, not text (broken UTF-16)"
            raise CakeError(message, _BINARY_HINT) from None
    if _looks_binary(data):
        raise CakeError(f"{name} looks binary, not text", _BINARY_HINT)
    try:
        return data.decode("utf-8-sig"), []
    except UnicodeDecodeError:
        pass
    text = data.decode("utf-8-sig", errors="replace")
    bad = text.count("\ufffd") - data.count("\ufffd".encode())
    multibyte = len(text) - len(text.encode("ascii", errors="ignore")) - bad  # valid non-ASCII
    if multibyte > 0:
        return text, [f"{name}: not valid UTF-8; replaced {bad} undecodable byte sequence(s) with U+FFFD"]
    try:
        text = data.decode("cp1252")
        return text, [f"{name}: not UTF-8; decoded as cp1252 (Windows Western European)"]
    except UnicodeDecodeError:
        return data.decode("latin-1"), [f"{name}: not UTF-8; decoded as latin-1 (ISO-8859-1)"]


def _looks_binary(data: bytes) -> bool:
    """NUL in the first KiB, or more than 10 % non-text control bytes in the first 8 KiB."""
    if b"\x00" in data[:_BINARY_SNIFF_BYTES]:
        return True
    head = data[:_CONTROL_SNIFF_BYTES]
    controls = sum(1 for byte in head if (byte < 0x20 or byte == 0x7F) and byte not in _TEXT_CONTROLS)
    return controls > _MAX_CONTROL_SHARE * len(head)


def _load_pdf(data: bytes, name: str, password: str | None) -> Document:
    """Extract, normalise and join the pages; warn about pages without text (scanned or blank).

    Raises:
        CakeError: no page has text ("looks scanned"), or from :func:`cake_cli.tasks.inputs.pdf.extract_pages`.
    """

    raw_pages, scanned_pages, warnings = pdf.extract_pages(data, name, password)
    pages = [normalize_text(page) for page in raw_pages]
    if all(is_blank(page) for page in pages):
        raise CakeError(
            f"{name} has no text on any page; it looks scanned",
            "run OCR first, e.g. `ocrmypdf in.pdf out.pdf`, then pass out.pdf",
        )
    empty = [number for number, page in enumerate(pages, 1) if is_blank(page)]
    scanned = [number for number in empty if number in scanned_pages]
    blank = [number for number in empty if number not in scanned_pages]
    if scanned:
        warnings.append(
            f"{name}: page(s) {pdf.format_pages(scanned)} of {len(pages)} have images "
            "but no text (scanned?); run OCR (e.g. ocrmypdf) to include them"
        )
    if blank:
        warnings.append(f"{name}: page(s) {pdf.format_pages(blank)} of {len(pages)} have no text; skipped")
    text, offsets = join_pages(pages)
    return Document(text=text, source=name, kind="pdf", page_offsets=offsets, warnings=tuple(warnings))


def join_pages(pages: list[str]) -> tuple[str, tuple[int, ...]]:
    """Join page texts with :data:`PAGE_SEPARATOR`, skipping blank pages.

    Returns:
        ``(text, offsets)``: ``offsets[i]`` is where page ``i`` starts in ``text`` (code points);
        a blank page gets the start of the next page with text (or ``len(text)``).
    """
    kept = [page for page in pages if not is_blank(page)]
    text = PAGE_SEPARATOR.join(kept)
    starts = []  # where each kept page starts in text
    position = 0
    for page in kept:
        starts.append(position)
        position += len(page) + len(PAGE_SEPARATOR)
    offsets = []
    next_kept = 0  # index into starts of the next page with text
    for page in pages:
        offsets.append(starts[next_kept] if next_kept < len(starts) else len(text))
        if not is_blank(page):
            next_kept += 1
    return text, tuple(offsets)


def _read_file(path: str) -> bytes:
    """All bytes of ``path``; file-system problems become CakeError with a fix."""
    file = Path(path)
    if file.is_dir():
        raise CakeError(f"{path} is a directory, not a file", "pass a file inside it")
    try:
        with open(file, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        hint = "check the path"
        raise CakeError(f"{path}: no such file", hint) from None
    except PermissionError:
        hint = f"make it readable, e.g. `chmod u+r {path}`"
        raise CakeError(f"{path}: permission denied", hint) from None
    except IsADirectoryError:
        raise CakeError(f"{path} is a directory, not a file", "pass a file inside it") from None
    except OSError as error:
        message = f"{path}: cannot read ({error.strerror or error})"
        raise CakeError(message, "check the path and the disk") from None


def _read_stdin(stdin: BinaryIO | None) -> bytes:
    """All bytes of ``stdin`` (default ``sys.stdin.buffer``); a terminal is refused, not read."""
    stream = stdin if stdin is not None else getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise CakeError("no stdin to read from", "pass a file path instead of -")
    if stdin is None and stream.isatty():
        raise CakeError(
            "- reads stdin, but stdin is a terminal", "pipe text in, e.g. `cat notes.txt | cake summarize -`"
        )
    return stream.read()
