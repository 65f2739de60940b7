"""Terminal text: ANSI stripping, line assembly and sanitising, as the reference does them
(docs/reference/loopd.md#s5).

Watches, until-awaits and pattern reads all see the same lines: ANSI-stripped, ``\\r\\n`` folded to
``\\n``, and of a line rewritten with bare ``\\r`` (progress bars) only the text after the last ``\\r``.
"""

from __future__ import annotations

import codecs
import re
from typing import Final

from ..text_safe import strip_ansi

__all__ = ["LineAssembler", "clean_line", "sanitize", "split_lines", "strip_ansi"]

_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_line(raw: str) -> str:
    """One complete raw line as watches see it: ANSI stripped, only what follows the last bare ``\\r``."""
    line = strip_ansi(raw)
    if "\r" in line:
        line = line.rstrip("\r")
        line = line[line.rfind("\r") + 1 :]
    return line


def sanitize(text: str) -> str:
    """Text safe to put in a message or an event: ANSI and control characters gone, lines assembled."""
    text = strip_ansi(text).replace("\r\n", "\n")
    text = "\n".join(clean_line(line) for line in text.split("\n"))
    return _CONTROL.sub("", text)


class LineAssembler:
    """Turn a byte stream into complete lines, carrying the partial last line between chunks."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._partial = ""

    def feed(self, data: bytes) -> list[str]:
        """The complete lines ``data`` finishes (raw: ANSI and ``\\r`` still in; see :func:`clean_line`)."""
        text = self._partial + self._decoder.decode(data)
        if "\n" not in text:
            self._partial = text
            return []
        lines = text.replace("\r\n", "\n").split("\n")
        self._partial = lines.pop()
        return lines

    def flush(self) -> list[str]:
        """The last line, even without its newline (at exit)."""
        text = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [text] if text else []


def split_lines(data: bytes) -> list[str]:
    """All lines of a finished byte string (the retained log), raw."""
    a = LineAssembler()
    return a.feed(data) + a.flush()
