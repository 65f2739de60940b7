"""Checks made before a command is spawned or a watch/await is recorded, and the shell text of a command.

Messages are the reference system's own (docs/reference/loopd.md#s3-17, #s3-18). Pure: nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from ..errors import UsageError
from ..patterns import PatternError, UserPattern, compile_user_pattern
from .loop.jsclass import trim

if TYPE_CHECKING:
    from ..events.command import WatchSpec

_DANGEROUS: Final = tuple(  # on RE2 too: on Python's re these scans were quadratic in a long pattern's text
    compile_user_pattern(p)
    for p in (
        r"\(\?:.*\)\*.*\(\?:.*\)\*",
        r".*\(\.\*\?\)\{2,\}.*",
        r".*\(.*\|.*\)\{3,\}.*",
        r"\([^()]*[+*][^()]*\)[+*]",
        r"\([^()]*(\.\*.*\.\*|\.\+.*\.\+|\\w\+.*\\s\*|\\s\*.*\\w\+)[^()]*\)",
    )
)


def is_dangerous_regex(source: str) -> bool:
    """The reference's guard against catastrophic backtracking (``(a+)+``, ``(.*.*)``, ``(\\w+\\s*)+``)."""
    return any(p.search(source) for p in _DANGEROUS)


def compile_watch_regex(kind: str, source: str, ignore_case: bool = False) -> UserPattern:
    """Compile a watch/await regex (``kind`` is ``filter`` or ``until``).

    :raises UsageError: with the reference's message for an invalid or dangerous pattern.
    """
    try:
        pattern = compile_user_pattern(source, ignore_case)
    except PatternError as e:
        raise UsageError(f"Invalid watch {kind} regex '{source}': {e}") from None
    if is_dangerous_regex(source):
        raise UsageError(
            f"Potentially dangerous watch {kind} regex rejected: '{source}'. Please use a safer pattern."
        )
    return pattern


def compile_read_pattern(source: str, ignore_case: bool = False) -> UserPattern:
    """Compile a ``read --pattern`` regex.

    :raises UsageError: with the reference's message for an invalid or dangerous pattern.
    """
    try:
        pattern = compile_user_pattern(source, ignore_case)
    except PatternError as e:
        raise UsageError(f"Invalid regex pattern '{source}': {e}") from None
    if is_dangerous_regex(source):
        raise UsageError(
            f"Potentially dangerous regex pattern rejected: '{source}'. Please use a safer pattern."
        )
    return pattern


def validate_watch(spec: WatchSpec) -> None:
    """:raises UsageError: for a bad until action or regex (the previous watch stays untouched)."""
    if spec.until_action not in ("stop", "keep"):
        raise UsageError(f'Invalid watch untilAction \'{spec.until_action}\': must be "stop" or "keep".')
    if spec.filter:
        compile_watch_regex("filter", spec.filter, spec.ignore_case)
    if spec.until:
        compile_watch_regex("until", spec.until, spec.ignore_case)


MAX_TIMEOUT_SECONDS: Final = 315_360_000
"""Ten years: the longest ``timeoutSeconds`` taken (a deadline past it would not fit a date)."""


def validate_start(
    title: str,
    command: str,
    timeout_seconds: object,
    watch: WatchSpec | None,
    owner_session_id: str | None = None,
) -> None:
    """The reference's start checks, in its order (an owner is checked when one is given: the CLI has none).

    ``title`` and ``command`` are trimmed as JavaScript's ``trim`` does (docs/reference/loopd.md#s1-7).

    :raises UsageError: naming the first problem.
    """
    if not trim(title):
        raise UsageError("title is required")
    if not trim(command):
        raise UsageError("command is required")
    if owner_session_id is not None and trim(owner_session_id) in ("", "main"):
        raise UsageError("A valid owner session is required. Run from an active OpenCode session.")
    if timeout_seconds is not None and (
        isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int) or timeout_seconds <= 0
    ):
        raise UsageError("timeoutSeconds must be a positive integer in seconds")
    if timeout_seconds is not None and timeout_seconds > MAX_TIMEOUT_SECONDS:
        raise UsageError(f"timeoutSeconds must be at most {MAX_TIMEOUT_SECONDS} (ten years)")
    if watch is not None:
        validate_watch(watch)


MAX_TERMINAL_SIDE: Final = 65_535
"""A terminal's width and height are unsigned shorts (``struct winsize``)."""


def validate_size(cols: int, rows: int) -> None:
    """:raises UsageError: for a non-positive size, or one no terminal can have."""
    if cols <= 0 or rows <= 0:
        raise UsageError(f"Invalid size {cols}x{rows}: cols and rows must be positive integers.")
    if cols > MAX_TERMINAL_SIDE or rows > MAX_TERMINAL_SIDE:
        raise UsageError(f"Invalid size {cols}x{rows}: cols and rows must be at most {MAX_TERMINAL_SIDE}.")


def validate_process(command: str, args: Sequence[str], cwd: str | None, env: Mapping[str, str]) -> None:
    """What the operating system cannot take in an ``exec``, refused before anything is spawned or recorded:
    a NUL in the program, an argument or the directory, an environment name that is empty or holds ``=`` or a
    NUL, a value with a NUL.

    :raises UsageError: naming the first problem (names and values shown quoted, on one line).
    """
    for what, text in (("command", command), ("cwd", cwd or ""), *(("argument", a) for a in args)):
        if "\0" in text:
            raise UsageError(f"Invalid {what} {text!r}: it must not contain a NUL byte.")
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            raise UsageError(
                f"Invalid env name {name!r}: a name must be non-empty, without '=' or a NUL byte."
            )
        if "\0" in value:
            raise UsageError(f"Invalid env value for {name!r}: it must not contain a NUL byte.")
