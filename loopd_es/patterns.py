"""User regexes (watch filters, until patterns, ``cmd read --pattern``) run on RE2: time linear in the text.

Python's ``re`` backtracks, so a pattern like ``((a+))+$`` or ``(a|a)*$`` takes exponential time on a line
of ``a``s, and a guard that refuses patterns by their shape always misses one. RE2 (``google-re2``) has no
backtracking at all: every match costs O(pattern x line), whatever the pattern. The price is a few features
that need backtracking (backreferences like ``\\1``, lookahead/lookbehind, possessive quantifiers); a
pattern using them is refused with a message that says so. The pattern is also compiled by ``re`` first, so
ordinary syntax errors read as before.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Final, Protocol

MAX_PATTERN_MEMORY: Final = 8 << 20
"""RE2's compile budget: a pattern whose automaton needs more is refused instead of eating memory."""
MAX_PATTERN_CHARS: Final = 4096
"""Longer sources are refused before anything parses them (a parse is not free, and nesting can overflow)."""


class UserPattern(Protocol):
    """What callers use of a compiled user pattern (an RE2 regexp)."""

    @property
    def pattern(self) -> str: ...

    def search(self, text: str) -> Any: ...


class PatternError(ValueError):
    """Raised when a user pattern is not valid syntax or needs a feature the linear-time engine lacks."""


def compile_user_pattern(source: str, ignore_case: bool = False) -> UserPattern:
    """Compile ``source`` for linear-time matching.

    :raises PatternError: with ``re``'s message for bad syntax, or RE2's plus what is unsupported.
    """
    if len(source) > MAX_PATTERN_CHARS:
        raise PatternError(f"the pattern is {len(source)} characters long; the limit is {MAX_PATTERN_CHARS}")
    try:
        with warnings.catch_warnings():  # "possible nested set" and the like would be a second stderr line
            warnings.simplefilter("ignore")
            re.compile(source, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise PatternError(str(e)) from None
    except (RecursionError, OverflowError):
        raise PatternError("the pattern is nested too deeply") from None
    import re2  # here, not with the module: every command that loads the command domain would pay for it

    options = re2.Options()
    options.log_errors = False  # RE2 would print its own copy of the error on stderr
    options.case_sensitive = not ignore_case
    options.max_mem = MAX_PATTERN_MEMORY
    try:
        compiled: UserPattern = re2.compile(source, options)
    except re2.error as e:
        detail = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise PatternError(
            f"{detail} (patterns run on RE2, which matches in linear time and so has no backreferences, "
            "lookaround or possessive quantifiers, and bounds repeats at 1000)"
        ) from None
    return compiled
