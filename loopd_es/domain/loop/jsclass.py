"""JavaScript's character classes, ``trim`` and UTF-16 lengths, which the reference's ``/loop`` parser runs on.

The reference is JavaScript: its ``\\s`` and ``String.prototype.trim`` know a fixed whitespace set (with
U+FEFF, without U+0085 and U+001C-U+001F, which Python's ``str.split`` and ``\\s`` treat as whitespace), its
``\\d`` is ASCII, its ``\\b`` and ``/i`` are ASCII-only, its ``$`` is the very end, and ``length`` and ``slice``
count UTF-16 code units. Python's defaults differ on every one of these, and ``re.ASCII`` alone is not the
same (its ``\\s`` lacks U+00A0 and the other Unicode spaces), so the classes are spelled out here.
"""

from __future__ import annotations

import re
from typing import Any, Final

_WS_BODY: Final = "\t\n\x0b\x0c\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
WS: Final = f"[{_WS_BODY}]"
"""JavaScript's ``\\s`` (and the set ``trim`` removes), as a regex class."""
NOT_WS: Final = f"[^{_WS_BODY}]"
"""JavaScript's ``\\S``."""

_SPLIT: Final = re.compile(f"{WS}+")
_LEADING: Final = re.compile(f"\\A{WS}+")
_TRAILING: Final = re.compile(f"{WS}+\\Z")


def trim(text: str) -> str:
    """``String.prototype.trim``: JavaScript whitespace off both ends (a BOM too, U+0085 not)."""
    return trim_start(_TRAILING.sub("", text))


def trim_start(text: str) -> str:
    """JavaScript whitespace off the start only."""
    return _LEADING.sub("", text)


def split(text: str) -> list[str]:
    """``text.split(/\\s+/)`` of an already trimmed ``text``; the empty text has no tokens."""
    return _SPLIT.split(text) if text else []


def is_ascii_digit(ch: str) -> bool:
    """JavaScript's ``\\d``: ``0-9`` only (``５`` and ``٥`` are not digits there)."""
    return "0" <= ch <= "9"


def utf16_len(text: str) -> int:
    """``text.length`` in JavaScript: characters beyond U+FFFF count twice."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def utf16_head(text: str, n: int) -> str:
    """``text.slice(0, n)``, except that a character whose two halves ``n`` would split is left out whole.

    The reference keeps the lone first half, which shows as a replacement character or breaks the encoder.
    """
    if utf16_len(text) <= n:
        return text
    units = 0
    for i, ch in enumerate(text):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > n:
            return text[:i]
    return text


def js_text(x: float) -> str:
    """``String(x)`` as JavaScript writes a number: the shortest digits that read back as ``x``, in plain
    notation from 1e-6 up to 1e21 and in exponent notation (``1e+25``) outside."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "0"
    if x < 0:
        return "-" + js_text(-x)
    mantissa, _, exponent = repr(float(x)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    text = whole + fraction
    zeros = len(text) - len(text.lstrip("0"))
    digits = text.strip("0")
    n = len(whole) + int(exponent or 0) - zeros  # x = 0.digits * 10**n
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    rest = "." + digits[1:] if k > 1 else ""
    return f"{digits[0]}{rest}e{'+' if n > 0 else '-'}{abs(n - 1)}"


def js_numbers(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, scalars) with every float JavaScript writes without a fraction as an
    int, so that Python's JSON writes ``100`` where ``JSON.stringify`` does, not ``100.0``. From 1e21 up both
    write exponent notation (``1e+21``), so those stay floats."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 1e21 else value
    if isinstance(value, dict):
        return {k: js_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [js_numbers(v) for v in value]
    return value
