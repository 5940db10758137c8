"""PDF text extraction with pypdfium2 (PDFium, the PDF engine of Chromium).

Only this module imports the PDF library; :mod:`cake_cli.tasks.inputs.documents` turns the page texts it
returns into a :class:`~cake_cli.tasks.inputs.documents.Document`.

Why PDFium: it keeps the spaces between words. In a one-off comparison on real PDFs from Debian
packages (pdfTeX, xdvipdfmx and Apache FOP output; its script and figures were not kept, so none
are quoted here) pypdf glued whole lines together on the xdvipdfmx file ("packagemaintenancesystem;
theDebian…") and pdfplumber glued words on most files, while PDFium kept the words apart; PDFium
was also the fastest of the three, and it repairs broken cross-reference tables when it opens a
file.
"""

from __future__ import annotations

import re

import pypdfium2
import pypdfium2.raw as pdfium_c

from cake_cli.errors import CakeError

# PDFium writes U+FFFE where a word was hyphenated at a line end (and drops the line break).
_LINE_END_HYPHEN = "\ufffe"
# A plain word fragment (letters only, not inside a hyphenated or dotted token) before U+FFFE.
_HYPHENATED_WORD = re.compile(r"(?<![\w\-.])([^\W\d_]+)\ufffe(?=([^\W\d_]))")

_REPAIR_HINT = "re-download it, or repair it first, e.g. `qpdf in.pdf repaired.pdf`"


def extract_pages(data: bytes, source: str, password: str | None = None) -> tuple[list[str], set[int], list[str]]:
    """Extract the raw text of every page of a PDF.

    Args:
        data: the whole PDF file (bytes).
        source: the name to show in messages (path as given, or ``"<stdin>"``).
        password: user or owner password; only tried when the empty password fails.

    Returns:
        ``(pages, scanned_pages, warnings)``: one text per page in page order (``""`` for a page
        without a text layer), line-end hyphenation undone by :func:`rejoin_hyphenated`; the
        1-based numbers of pages with images but no text; one-line warnings (pages that could
        not be read).

    Raises:
        CakeError: encrypted and no/wrong password, unsupported encryption, or a file PDFium
            cannot open even after repair.
    """
    doc = _open(data, source, password)
    pages: list[str] = []
    scanned_pages: set[int] = set()
    broken: list[int] = []
    try:
        for number in range(1, len(doc) + 1):
            try:
                text, scanned = _page_text(doc, number - 1)
            except pypdfium2.PdfiumError:
                text, scanned = "", False
                broken.append(number)
            pages.append(text)
            if scanned:
                scanned_pages.add(number)
    finally:
        doc.close()
    warnings = []
    if broken:
        warnings.append(f"{source}: could not read page(s) {format_pages(broken)} (damaged); skipped them")
    return pages, scanned_pages, warnings


def _page_text(doc: pypdfium2.PdfDocument, index: int) -> tuple[str, bool]:
    """Text of page ``index`` (0-based; de-hyphenated) and whether the page looks scanned.

    A page looks scanned when it has no text but draws an image (also inside a form XObject).

    Raises:
        pypdfium2.PdfiumError: the page cannot be loaded.
    """
    page = doc[index]
    try:
        textpage = page.get_textpage()
        try:
            text = rejoin_hyphenated(textpage.get_text_range())
        finally:
            textpage.close()
        images = page.get_objects(filter=(pdfium_c.FPDF_PAGEOBJ_IMAGE,))
        scanned = not text.strip() and any(True for _ in images)
    finally:
        page.close()
    return text, scanned


def rejoin_hyphenated(text: str) -> str:
    """Undo PDFium's line-end hyphen marker U+FFFE.

    ``docu\\ufffementation`` becomes ``documentation`` (lowercase letters on both sides of a plain
    word); anything else keeps a real hyphen: ``S\\ufffePlus`` → ``S-Plus``,
    ``day-to\\ufffeday`` → ``day-to-day``, ``--gen\\ufffeerror`` → ``--gen-error``.
    """

    def join(match: re.Match[str]) -> str:
        head, next_char = match.group(1), match.group(2)
        if head[-1].islower() and next_char.islower():
            return head
        return head + "-"

    return _HYPHENATED_WORD.sub(join, text).replace(_LINE_END_HYPHEN, "-")


def format_pages(pages: list[int]) -> str:
    """Compress sorted 1-based page numbers: ``[1, 3, 4, 5, 9]`` → ``"1, 3-5, 9"``."""
    runs: list[list[int]] = []
    for number in pages:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _open(data: bytes, source: str, password: str | None) -> pypdfium2.PdfDocument:
    """Open with the empty password first, then ``password``; map PDFium errors to CakeError."""
    try:
        return pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError as error:
        code = error.err_code
    if code == pdfium_c.FPDF_ERR_PASSWORD:
        if password is None:
            raise CakeError(f"{source} is encrypted", "pass its password with --password")
        try:
            return pypdfium2.PdfDocument(data, password=password)
        except pypdfium2.PdfiumError as error:
            if error.err_code == pdfium_c.FPDF_ERR_PASSWORD:
                message = f"wrong password for {source}"
                raise CakeError(message, "check the --password value") from None
            code = error.err_code
    if code == pdfium_c.FPDF_ERR_SECURITY:
        raise CakeError(
            f"{source} uses an encryption scheme PDFium does not support",
            "decrypt it first, e.g. `qpdf --decrypt --password=PW in.pdf out.pdf`",
        )
    if code == pdfium_c.FPDF_ERR_SUCCESS:  # opened, but the page tree is empty
        raise CakeError(f"{source} has no pages", _REPAIR_HINT)
    raise CakeError(f"{source} is damaged and could not be repaired", _REPAIR_HINT)
