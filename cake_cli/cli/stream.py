"""The answer on stdout: streamed text pieces, with the line ended before anything else prints."""

from __future__ import annotations

import sys


class AnswerStream:
    """Streams answer text to stdout, keeping track of an unfinished line."""

    def __init__(self):
        self.open_line = False

    def text(self, piece: str) -> None:
        """Write `piece`; a piece that starts a line of its own ("\\n…") after the line was already
        ended (a warning came between) does not leave a blank line."""
        if not self.open_line and piece.startswith("\n"):
            piece = piece[1:]
        sys.stdout.write(piece)
        sys.stdout.flush()
        self.open_line = True

    def end_line(self) -> None:
        """End the answer's line, so a terminal shows what follows on a line of its own."""
        if self.open_line:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.open_line = False
