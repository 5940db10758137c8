"""Document loading: PDFs built with fpdf2 from real text, text decoding, normalisation, errors."""

from __future__ import annotations

import difflib
import gzip
import importlib.util
import io
import os
import re
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest
from fpdf import FPDF
from fpdf.enums import EncryptionMethod
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from cake_cli.errors import CakeError
from cake_cli.tasks.inputs import documents
from cake_cli.tasks.inputs.documents import Document, join_pages, load_document, normalize_text, page_of_offset
from cake_cli.tasks.inputs.pdf import format_pages, rejoin_hyphenated

LICENSE = (Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text(encoding="utf-8")
SOURCE = LICENSE[:8000]
DEBIAN_DOCS = Path("/usr/share/doc")


def write_pdf(path: Path, pages: list[str | None], encryption: dict | None = None) -> Path:
    """One page per entry: text (wrapped by fpdf2), ``None`` blank, ``"<image>"`` image only."""
    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    if encryption:
        pdf.set_encryption(**encryption)
    for content in pages:
        pdf.add_page()
        if content == "<image>":
            pdf.image(Image.new("L", (120, 80), 128), x=20, y=20, w=120)
        elif content:
            pdf.multi_cell(0, 5, content)
    pdf.output(str(path))
    return path


def words_in_order(source: str, extracted: str) -> float:
    """Share of the source's words found in the extracted text in the same order (0..1)."""
    want, got = source.split(), extracted.split()
    blocks = difflib.SequenceMatcher(None, want, got, autojunk=False).get_matching_blocks()
    return sum(block.size for block in blocks) / len(want)


def load_error(*args, **kwargs) -> CakeError:
    with pytest.raises(CakeError) as info:
        load_document(*args, **kwargs)
    assert info.value.exit_code == 1
    assert info.value.hint
    return info.value


@pytest.fixture(scope="module")
def license_pdf(tmp_path_factory) -> Path:
    return write_pdf(tmp_path_factory.mktemp("pdf") / "license.pdf", [SOURCE])


# --- PDF text -------------------------------------------------------------------------------


def test_pdf_keeps_words_and_spaces(license_pdf):
    doc = load_document(str(license_pdf))
    assert doc.kind == "pdf" and doc.source == str(license_pdf) and doc.warnings == ()
    assert words_in_order(SOURCE, doc.text) >= 0.99
    # Long runs survive verbatim with their spaces (only line wrapping may differ).
    flat = " ".join(doc.text.split())
    for sentence in (
        "Python was created in the early 1990s by Guido van Rossum at Stichting",
        "In 1995, Guido continued his work on Python at the Corporation for National",
    ):
        assert sentence in flat
    source_tokens = set(SOURCE.split())
    glued = [t for t in doc.text.split() if len(t) >= 25 and t not in source_tokens]
    assert glued == []


def test_pdf_pages_offsets_and_page_of_offset(tmp_path):
    paragraphs = [p for p in SOURCE.split("\n\n") if len(p) > 200][:3]
    doc = load_document(str(write_pdf(tmp_path / "three.pdf", paragraphs)))
    assert len(doc.page_offsets) == 3 and doc.page_offsets[0] == 0
    for number, (start, paragraph) in enumerate(zip(doc.page_offsets, paragraphs, strict=True), 1):
        first_words = " ".join(paragraph.split()[:6])
        assert " ".join(doc.text[start:].split()[:6]) == first_words
        assert page_of_offset(doc, start) == number
        assert page_of_offset(doc, start + 10) == number
    assert page_of_offset(doc, doc.page_offsets[1] - 1) == 1  # the separator belongs to page 1
    assert page_of_offset(doc, len(doc.text)) == 3
    with pytest.raises(ValueError):
        page_of_offset(doc, len(doc.text) + 1)
    with pytest.raises(ValueError):
        page_of_offset(doc, -1)


def test_pdf_from_stdin_is_detected_by_magic_bytes(license_pdf):
    doc = load_document("-", stdin=io.BytesIO(license_pdf.read_bytes()))
    assert doc.kind == "pdf" and doc.source == "<stdin>"
    assert words_in_order(SOURCE, doc.text) >= 0.99


def test_join_pages_gives_blank_pages_no_characters():
    text, offsets = join_pages(["abc", "", "de", " "])
    assert text == "abc\n\nde"
    assert offsets == (0, 5, 5, 7)
    doc = Document(text=text, source="x.pdf", kind="pdf", page_offsets=offsets)
    assert [page_of_offset(doc, i) for i in range(len(text) + 1)] == [1, 1, 1, 1, 1, 3, 3, 3]


@given(st.lists(st.sampled_from(["", " ", "a", "bc\nd", "ef gh"]), min_size=1, max_size=8))
def test_join_pages_offsets_match_a_slow_scan(pages):
    text, offsets = join_pages(pages)
    doc = Document(text=text, source="x.pdf", kind="pdf", page_offsets=offsets)
    for number, page in enumerate(pages, 1):
        if page.strip():
            start = offsets[number - 1]
            assert text[start : start + len(page)] == page
            assert {page_of_offset(doc, i) for i in range(start, start + len(page))} == {number}


@pytest.mark.parametrize(
    ("raw", "joined"),
    [
        ("docu\ufffementation", "documentation"),
        ("über\ufffeall", "überall"),
        ("S\ufffePlus", "S-Plus"),
        ("day-to\ufffeday", "day-to-day"),
        ("--gen\ufffeerror", "--gen-error"),
        ("R 4.2\ufffe1", "R 4.2-1"),
    ],
)
def test_rejoin_hyphenated(raw, joined):
    assert rejoin_hyphenated(raw) == joined


def test_format_pages():
    assert format_pages([1, 3, 4, 5, 9]) == "1, 3-5, 9"


# --- encryption -----------------------------------------------------------------------------


def test_pdf_with_empty_user_password_opens_without_one(tmp_path):
    path = write_pdf(tmp_path / "owner.pdf", [SOURCE[:1500]], {"owner_password": "owner-only"})
    doc = load_document(str(path))
    assert words_in_order(SOURCE[:1500], doc.text) >= 0.99


NO_CRYPTOGRAPHY = importlib.util.find_spec("cryptography") is None  # fpdf2 needs it for AES


@pytest.mark.parametrize(
    "method",
    [
        EncryptionMethod.RC4,
        pytest.param(
            EncryptionMethod.AES_256, marks=pytest.mark.skipif(NO_CRYPTOGRAPHY, reason="fpdf2 AES needs cryptography")
        ),
    ],
)
def test_pdf_with_user_password(tmp_path, method):
    encryption = {"owner_password": "owner", "user_password": "s3cret", "encryption_method": method}
    path = write_pdf(tmp_path / "locked.pdf", [SOURCE[:1500]], encryption)
    error = load_error(str(path))
    assert "encrypted" in error.message and "--password" in error.hint
    assert words_in_order(SOURCE[:1500], load_document(str(path), password="s3cret").text) >= 0.99
    as_owner = load_document(str(path), password="owner")
    assert as_owner.text == load_document(str(path), password="s3cret").text
    error = load_error(str(path), password="wrong")
    assert "wrong password" in error.message


# --- pages without text ---------------------------------------------------------------------


@pytest.mark.parametrize("pages", [["<image>"], [None], ["<image>", None]])
def test_pdf_without_any_text_looks_scanned(tmp_path, pages):
    error = load_error(str(write_pdf(tmp_path / "scan.pdf", pages)))
    assert "looks scanned" in error.message and "ocrmypdf" in error.hint


def test_mixed_pdf_warns_which_pages_are_empty(tmp_path):
    pages = [SOURCE[:1000], "<image>", None, SOURCE[1000:2000], "<image>", "<image>"]
    doc = load_document(str(write_pdf(tmp_path / "mixed.pdf", pages)))
    assert len(doc.page_offsets) == 6
    assert words_in_order(SOURCE[:2000], doc.text) >= 0.99
    assert len(doc.warnings) == 2
    scanned, blank = doc.warnings
    assert "page(s) 2, 5-6 of 6" in scanned and "OCR" in scanned
    assert "page(s) 3 of 6" in blank
    assert page_of_offset(doc, doc.page_offsets[3]) == 4


# --- damaged PDFs ---------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [0.3, 0.9])
def test_truncated_pdf_is_a_clear_error(license_pdf, tmp_path, cut):
    data = license_pdf.read_bytes()
    path = tmp_path / "cut.pdf"
    path.write_bytes(data[: int(len(data) * cut)])
    assert "damaged" in load_error(str(path)).message


@pytest.mark.parametrize("data", [b"%PDF-1.7\n" + b"garbage " * 200, b"%PDF-"])
def test_garbage_with_pdf_header_is_a_clear_error(tmp_path, data):
    path = tmp_path / "junk.bin"
    path.write_bytes(data)
    assert "damaged" in load_error(str(path)).message


def test_broken_xref_table_is_repaired(license_pdf, tmp_path):
    data = license_pdf.read_bytes()
    broken = re.sub(rb"\d{10} 00000 n", b"0000000001 00000 n", data)  # every offset wrong
    assert broken != data
    path = tmp_path / "xref.pdf"
    path.write_bytes(broken)
    assert load_document(str(path)).text == load_document(str(license_pdf)).text


def test_pdf_name_without_pdf_bytes_is_an_error(tmp_path):
    path = tmp_path / "download.pdf"
    path.write_text("<html>404 Not Found</html>")
    assert "not a PDF" in load_error(str(path)).message


# --- files and stdin ------------------------------------------------------------------------


def test_text_file_utf8(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("# Notes\r\n\r\nCafé ☕ — naïve\r\n", encoding="utf-8-sig")
    doc = load_document(str(path))
    assert doc == Document(text="# Notes\n\nCafé ☕ — naïve", source=str(path), kind="text")
    assert page_of_offset(doc, 3) is None


def test_stdin_text():
    doc = load_document("-", stdin=io.BytesIO(SOURCE.encode()))
    assert doc.source == "<stdin>" and doc.kind == "text"
    assert doc.text.split() == SOURCE.split()


def test_stdin_terminal_is_refused(monkeypatch):
    class TerminalBuffer(io.BytesIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(documents.sys, "stdin", SimpleNamespace(buffer=TerminalBuffer(b"unread")))
    assert "terminal" in load_error("-").message


def test_missing_file():
    error = load_error("/nonexistent/report.pdf")
    assert "no such file" in error.message


def test_directory(tmp_path):
    assert "directory" in load_error(str(tmp_path)).message


def test_unreadable_file(tmp_path, monkeypatch):
    path = tmp_path / "secret.txt"
    path.write_text("hello")

    def deny(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(documents, "open", deny, raising=False)  # root ignores chmod 000
    error = load_error(str(path))
    assert "permission denied" in error.message and "chmod" in error.hint


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_for_real(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("hello")
    path.chmod(0)
    assert "permission denied" in load_error(str(path)).message


def test_empty_file(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    assert "nothing to read" in load_error(str(path)).message


@pytest.mark.parametrize("data", [b"", b"  \n\t\r\n \xc2\xa0\n"])
def test_empty_or_whitespace_stdin(data):
    assert "nothing to read" in load_error("-", stdin=io.BytesIO(data)).message


@pytest.mark.parametrize(
    "text",
    [
        " \n\u200b\n",  # a zero-width space (Cf) among whitespace: the issue's "HTML document with no content"
        "\u2060\u200d\u200c\u200e\u202f\u3000\u2029",  # word joiner, ZWJ, ZWNJ, LRM, narrow/ideographic spaces
        "\t\u180e \u2063\n",  # Mongolian vowel separator, invisible separator
    ],
)
def test_unicode_spaces_and_format_characters_are_blank(tmp_path, text):
    path = tmp_path / "blank.html"
    path.write_text(text, encoding="utf-8")
    error = load_error(str(path))
    assert error.message == f"{path} has only whitespace; nothing to read"
    assert load_error("-", stdin=io.BytesIO(text.encode())).message == "<stdin> has only whitespace; nothing to read"


def test_is_blank_stops_at_any_visible_character():
    assert documents.is_blank("") and documents.is_blank("\u200b \ufeff\n")
    assert not documents.is_blank("\u200b.") and not documents.is_blank("\u200bé") and not documents.is_blank("中")


@pytest.mark.parametrize("data", [b"PK\x03\x04\x14\x00\x00\x00" + bytes(range(256)) * 4, bytes(range(1, 32)) * 100])
def test_binary_input(tmp_path, data):
    path = tmp_path / "report.docx"
    path.write_bytes(data)
    error = load_error(str(path))
    assert error.message == f"{path} looks binary, not text" and "pandoc" in error.hint


def test_latin1_file_is_decoded_with_a_warning(tmp_path):
    path = tmp_path / "old.txt"
    path.write_bytes("Café crème, naïve façade – «Zürich» ½\n".encode("cp1252"))
    doc = load_document(str(path))
    assert doc.text == "Café crème, naïve façade – «Zürich» 1⁄2"  # NFKC: ½ → 1⁄2
    assert doc.warnings == (f"{path}: not UTF-8; decoded as cp1252 (Windows Western European)",)
    path.write_bytes("Grüße\x81".encode("latin-1"))  # 0x81 is undefined in cp1252
    doc = load_document(str(path))
    assert doc.text == "Grüße" and "latin-1" in doc.warnings[0]


def test_mostly_utf8_with_a_bad_byte_keeps_utf8(tmp_path):
    path = tmp_path / "cut.txt"
    path.write_bytes("naïve café ".encode() + b"\xff" + " über".encode())
    doc = load_document(str(path))
    assert doc.text == "naïve café \ufffd über"
    assert "replaced 1 undecodable" in doc.warnings[0]


def test_utf16_with_bom(tmp_path):
    path = tmp_path / "win.txt"
    path.write_bytes("Hello, Wörld\r\n".encode("utf-16"))
    assert load_document(str(path)).text == "Hello, Wörld"


# --- normalize_text -------------------------------------------------------------------------


def test_normalize_ligatures_and_widths():
    assert normalize_text("ﬁnd the ﬂow of ﬀ\u00a0ｆｕｌｌ") == "find the flow of ff full"


def test_normalize_removes_control_characters():
    assert normalize_text("a\x00b\x07c\x1bd\x7fe\u0085f\u00adg\ufeffh\ti") == "abcde\nfgh\ti"


def test_normalize_lines():
    text = "  first  \r\nsecond\t \rthird\n\n\n\n\n\nfourth\n\n\nfifth\n\n"
    assert normalize_text(text) == "  first\nsecond\nthird\n\n\nfourth\n\n\nfifth"


@given(st.text(alphabet=st.sampled_from("aé ﬁ\u0301\x00\x07\t\n\r\x0c\u2028\xa0\ufeff\xad½")))
def test_normalize_is_idempotent(text):
    once = normalize_text(text)
    assert normalize_text(once) == once
    assert "\r" not in once and "\x00" not in once and not once.startswith("\n")


# --- real PDFs from Debian packages (present only where installed) -------------------------


@pytest.mark.parametrize(
    ("path", "phrase"),
    [
        ("debian-history/docs/project-history.en.pdf", "The Debian Project was officially founded by Ian Murdock"),
        (
            "debian/FAQ/debian-faq.en.pdf.gz",  # pypdf 7.1 glues these words ("packagemaintenance…")
            "the Debian package maintenance system is unique and particularly",
        ),
    ],
)
def test_real_debian_pdf(tmp_path, path, phrase):
    source = DEBIAN_DOCS / path
    if not source.exists():
        pytest.skip(f"{source} not installed (apt-get install debian-history debian-faq)")
    if source.suffix == ".gz":
        unpacked = tmp_path / source.stem
        unpacked.write_bytes(gzip.decompress(source.read_bytes()))
        source = unpacked
    doc = load_document(str(source))
    assert len(doc.page_offsets) >= 20
    assert phrase in " ".join(doc.text.split())
    words = re.findall(r"[A-Za-z]+", doc.text)
    assert len(words) > 5000
    assert sum(len(word) >= 20 for word in words) / len(words) < 0.001  # no glued words
