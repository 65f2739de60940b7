"""The one sanitiser for text that reaches a terminal: names, objectives, errors, output previews.

Goal names and objectives are written by an AI worker, errors quote what a user or a provider sent, and
output previews are whatever a command printed. Printed raw, an escape sequence in any of them can clear
the screen, retitle the window, rewrite the clipboard (OSC 52) or hide text (bidi overrides). Every table
and text view therefore passes such text through :func:`term_line` (one line: every non-printable
character shown as its Python escape, ``\\x1b``, ``\\n``, ``\\u202e``) or :func:`term_block` (several
lines: escape sequences dropped, newlines and tabs kept, the rest escaped). Printable text, including any
non-ASCII letter, is left exactly as it was. JSON output needs neither: the encoder escapes control
characters, and HTML is escaped by its own renderer.
"""

from __future__ import annotations

import re
from typing import Final

ANSI: Final = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]")
"""CSI, OSC and charset sequences: what a program's coloured output is made of."""

_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def strip_ansi(text: str) -> str:
    """Remove CSI, OSC and charset escape sequences (a lone ESC stays, to be escaped)."""
    return ANSI.sub("", text) if "\x1b" in text else text


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def term_line(text: str) -> str:
    """``text`` as one inert line: every non-printable character (newlines too) shown as its escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def term_block(text: str) -> str:
    """``text`` as inert lines: escape sequences dropped, ``\\r\\n`` folded, newlines and tabs kept."""
    text = strip_ansi(text).replace("\r\n", "\n")
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in "\n\t" else _escape(ch) for ch in text)
