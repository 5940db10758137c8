"""Code completion helpers: the context up to a line, and code-only answers.

`cake complete` asks for code only, and also cleans what comes back, because an instruct model
sometimes wraps code in markdown fences or opens with a sentence of prose:

- the prompt ends inside its last context line (no trailing newline, see the `complete` template),
  so the text before the model's first newline finishes that line: it is dropped
  (`continues_line`), and the first line printed is the next line of the file (`--at LINE`: line LINE);
- leading blank lines, markdown fences (```` ``` ````, ```` ```python ````) and prose lines before
  the first code line are dropped;
- a closing fence after the code ends the answer;
- the answer stops after `max_lines` non-blank lines (blank lines between them are kept,
  trailing ones are not).

A line is prose when it is not indented and either opens like chat ("Here is", "Sure", "The
following", …) or reads like a sentence: capital first letter, at least four words, ending in
'.', ':' or '!', and no code punctuation. Only lines before the first code line are tested, so a
docstring or comment inside the code is never dropped.
"""

from __future__ import annotations

import re
from pathlib import Path

from cake_cli.errors import CakeError, UsageError
from cake_cli.tasks.inputs.documents import STDIN_NAME, Document, decode_text, normalize_text

DEFAULT_LINES = 5  # lines of code `cake complete` prints by default
TOKENS_PER_LINE = 24  # generation allowance per requested line, tokens (code lines average ~10)

_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # what editors and Python's tokenizer count as a new line
_CHAT_OPENER = re.compile(
    r"^(here(?:'s| is| are)|sure\b|certainly\b|of course\b|below\b|the (?:following|completed|next|rest)\b|"
    r"this (?:code|function|completes)\b|i(?:'ll| will| have)\b|let(?:'s| me)\b|to complete\b|note\b)",
    re.IGNORECASE,
)
_CODE_PUNCTUATION = re.compile(r"[()\[\]{}=;#<>\"'`_]")


def check_lines(max_lines: int) -> None:
    """Raises UsageError unless `--lines` is at least 1."""
    if max_lines < 1:
        raise UsageError(f"--lines must be at least 1 (got {max_lines})", "e.g. --lines 5")


def check_at_line(at_line: int) -> None:
    """Raises UsageError unless `--at` is at least 2 (line 1 has nothing before it)."""
    if at_line < 2:
        raise UsageError(
            f"--at must be at least 2 (got {at_line}): line 1 has nothing before it",
            "give the 1-based number of the first line to predict",
        )


def is_prose(line: str) -> bool:
    """True when `line` looks like a sentence of chat prose rather than code (see the module doc)."""
    if not line.strip() or line[0].isspace():
        return False
    text = line.strip()
    if _CHAT_OPENER.match(text):
        return True
    return len(text.split()) >= 4 and text[0].isupper() and text[-1] in ".:!" and not _CODE_PUNCTUATION.search(text)


def is_fence(line: str) -> bool:
    """True for a markdown code fence line (```` ``` ```` or ```` ```python ````)."""
    return line.strip().startswith("```")


class CodeFilter:
    """Streaming filter: feed generated text in pieces, get back the code-only text to print.

    Output lines are joined by '\\n', with no trailing newline. Lines are emitted whole, once
    their newline arrives (or at `finish`).

    Args:
        max_lines: most non-blank code lines to keep (>= 1).
        continues_line: the text starts inside the prompt's last line: everything up to and
            including the first newline finishes that line and is dropped (a text without a
            newline gives nothing).

    Raises:
        UsageError: max_lines < 1.
    """

    def __init__(self, max_lines: int = DEFAULT_LINES, continues_line: bool = False):
        check_lines(max_lines)
        self.max_lines = max_lines
        self.continuing = continues_line  # still inside the prompt's last line
        self.buffer = ""
        self.started = False  # the first code line has been emitted
        self.done = False  # max_lines reached or a closing fence seen: ignore the rest
        self.count = 0  # non-blank code lines emitted
        self.pending_blank = 0  # blank lines held until more code follows
        self.parts: list[str] = []  # everything emitted so far

    @property
    def text(self) -> str:
        """The code emitted so far."""
        return "".join(self.parts)

    def feed(self, piece: str) -> str:
        """Take the next piece of generated text; return the code it completes (maybe '')."""
        self.buffer += piece
        *lines, self.buffer = self.buffer.split("\n")
        if lines and self.continuing:  # the first newline ends the prompt's last line
            lines, self.continuing = lines[1:], False
        return "".join(self._line(line) for line in lines)

    def finish(self) -> str:
        """The code in the last, unterminated line (call once, after the last `feed`)."""
        line, self.buffer = self.buffer, ""
        return "" if self.continuing else self._line(line)

    def _line(self, line: str) -> str:
        if self.done:
            return ""
        if is_fence(line):
            self.done = self.started  # an opening fence is skipped, a closing one ends the code
            return ""
        if not line.strip():
            self.pending_blank += self.started
            return ""
        if not self.started and is_prose(line):
            return ""
        out = ("\n" if self.started else "") + "\n" * self.pending_blank + line.rstrip()
        self.started, self.pending_blank = True, 0
        self.count += 1
        self.done = self.count >= self.max_lines
        self.parts.append(out)
        return out


def filter_code(text: str, max_lines: int = DEFAULT_LINES, continues_line: bool = False) -> str:
    """`text` cleaned to code only, at most `max_lines` non-blank lines (the CodeFilter rules)."""
    f = CodeFilter(max_lines, continues_line)
    f.feed(text)
    f.finish()
    return f.text


def cut_at_line(text: str, at_line: int) -> str:
    """The text of lines 1 .. at_line - 1 (1-based, as editors number them), without the final
    newline and trailing blank lines, so a completion starts at line `at_line`.

    Raises:
        UsageError: at_line < 2, past the end (more than the line count + 1), or nothing but
            blank lines before it.
    """
    check_at_line(at_line)
    lines = _LINE_BREAK.split(text)
    count = len(lines) - (lines[-1] == "")  # a final newline ends the last line, it starts none
    if at_line > count + 1:
        raise UsageError(
            f"--at {at_line} is outside the file (lines 2 to {count + 1} can be completed)",
            "give the 1-based number of the first line to predict",
        )
    context = "\n".join(lines[: at_line - 1]).rstrip()
    if not context.strip():
        raise UsageError(f"nothing but blank lines before line {at_line}", "choose a later --at line")
    return context


def context_before(doc: Document, at_line: int) -> str:
    """The completion context for `--at`: for a text file, cut from the file's own bytes, so the
    line numbers are the file's (the loader's normalisation collapses runs of blank lines and
    strips leading ones); for stdin or a PDF, cut from the loaded text.

    Args:
        doc: the loaded `documents.Document` (its `source` is the path as given).
        at_line: 1-based number of the first line to predict.

    Raises:
        UsageError: see `cut_at_line`.
        CakeError: the file cannot be read again.
    """
    if doc.kind != "text" or doc.source == STDIN_NAME or not Path(doc.source).is_file():
        return cut_at_line(doc.text, at_line)
    try:
        raw, _ = decode_text(Path(doc.source).read_bytes(), doc.source)
    except OSError as exc:
        raise CakeError(f"cannot read {doc.source} ({exc.strerror})") from None
    return normalize_text(cut_at_line(raw, at_line))


def max_new_tokens_for(lines: int, template_default: int) -> int:
    """Generation allowance for `lines` lines of code: the template's, or more for many lines."""
    return max(template_default, TOKENS_PER_LINE * lines)
