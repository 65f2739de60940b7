"""The one sanitiser for text that reaches a terminal: names, objectives, errors, output previews.

Goal names and objectives are written by an AI worker, errors quote what a user or a provider sent, and
output previews are whatever a command printed. Printed raw, an escape sequence in any of them can clear
the screen, retitle the window, rewrite the clipboard (OSC 52) or hide text (bidi overrides). Every table
and text view therefore passes such text through :func:`term_line` (one line: every non-printable
character shown as its Python escape, ``\\x1b``, ``\\n``, ``\\u202e``) or :func:`term_block` (several
lines: escape sequences dropped, newlines and tabs kept, the rest escaped). Printable text, including any
non-ASCII letter, is left exactly as it was. :func:`term_lines` keeps a message's own lines and escapes the
rest, escape sequences included. JSON written with ``ensure_ascii=False`` escapes C0 controls but not DEL, C1
controls (``\x9b`` is a CSI) or bidi overrides; :func:`json_safe` escapes those as ``\\uXXXX``. HTML is
escaped by its own renderer.
"""

from __future__ import annotations

import re
import unicodedata
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


def term_lines(text: str) -> str:
    """``text`` with its newlines kept and every other non-printable character shown as its escape."""
    return "\n".join(term_line(line) for line in text.split("\n"))


def _json_escape(m: re.Match[str]) -> str:
    code = ord(m.group(0))
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


_JSON_RAW: Final = re.compile(r"[^\x00-\x7e]")


def json_safe(doc: str) -> str:
    """A JSON document with every non-printable character the encoder left raw written as ``\\uXXXX``."""
    if doc.isprintable():
        return doc
    return _JSON_RAW.sub(lambda m: m.group(0) if m.group(0).isprintable() else _json_escape(m), doc)


def _columns(ch: str) -> int:
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0  # accents, joiners, variation selectors: drawn on the character before
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def display_width(text: str) -> int:
    """The columns a terminal gives ``text``: two for wide and full-width characters (CJK, most emoji), none
    for combining marks and zero-width joiners. Tables pad by this, not ``len``, so a name in CJK or with an
    emoji does not push the columns after it to the right."""
    return sum(_columns(ch) for ch in text)


def fit(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` columns, with ``…`` where it was cut."""
    if display_width(text) <= width:
        return text
    kept, used = [], 1  # the ellipsis takes one column
    for ch in text:
        used += _columns(ch)
        if used > width:
            break
        kept.append(ch)
    return "".join(kept) + "…"


def pad(text: str, width: int) -> str:
    """``text`` followed by spaces up to ``width`` columns."""
    return text + " " * max(width - display_width(text), 0)
