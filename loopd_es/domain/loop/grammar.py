"""The ``/loop`` argument grammar of opencode-plugin-loop 0.8.1 (docs/reference/loop-plugin.md#s2-2 to #s2-5),
as a pure parser.

:func:`parse` turns the argument string into one :data:`Parsed` value; it never touches state. The order of
the checks is the reference's, because it decides which error a malformed command gets, and so are its
character classes (:mod:`.jsclass`): ``５m`` is no interval, ``\u0085`` separates nothing, a BOM is trimmed.
"""

from __future__ import annotations

import math
import re
from typing import Final, Literal

import msgspec

from . import jsclass, texts
from .jitter import js_round
from .jsclass import NOT_WS, WS

Action = Literal["help", "list", "cancel", "stop", "pause", "resume", "stop-all"]


class _P(msgspec.Struct, frozen=True, kw_only=True):
    pass


class Sub(_P, frozen=True, kw_only=True):
    """A management subcommand; ``task_id`` is case-sensitive."""

    action: Action
    task_id: str | None = None


class Fail(_P, frozen=True, kw_only=True):
    """A parse error; ``message`` is the reference's ``❌`` text."""

    message: str


class Maintenance(_P, frozen=True, kw_only=True):
    """Bare ``/loop``: a maintenance task whose prompt comes from ``loop.md``."""


class Fixed(_P, frozen=True, kw_only=True):
    interval_ms: int
    prompt: str
    once: bool
    jitter: bool | None
    token: str


class Adaptive(_P, frozen=True, kw_only=True):
    prompt: str


Parsed = Sub | Fail | Maintenance | Fixed | Adaptive

_CC_FLAGS: Final[dict[str, Action]] = {
    "--cancel": "cancel", "--stop": "stop", "--list": "list", "--status": "list",
    "--pause": "pause", "--resume": "resume", "--stop-all": "stop-all",
}  # fmt: skip
_ALLOWED_FLAGS: Final = ("--once", "--jitter=true", "--jitter=false", "--")
_UNITS: Final = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_NUMBER: Final = "([0-9]+(?:\\.[0-9]+)?)"
_INTERVAL: Final = re.compile(f"{_NUMBER}{WS}*([smhd])")
# ``/i`` and ``\b`` of a JavaScript regex without the ``u`` flag are ASCII-only, hence ``re.ASCII``.
_EVERY: Final = re.compile(
    f"\\bevery{WS}+{_NUMBER}{WS}*([smhd]|seconds?|minutes?|hours?|days?){WS}*\\Z", re.IGNORECASE | re.ASCII
)
_CRON_FIELD: Final = re.compile(r"[0-9*,/\-]+")
_TOKEN: Final = re.compile(f"{NOT_WS}+")


def interval_ms(token: str) -> int | None:
    """The interval a token like ``5m`` or ``1.5h`` names in whole ms, or ``None`` when invalid, below 1 s, or
    too large for a float (the tools' rule, "a finite number >= 1000", which the reference shares with ``/loop``)."""
    m = _INTERVAL.fullmatch(jsclass.trim(token).lower())
    if m is None:
        return None
    value = float(m.group(1)) * _UNITS[m.group(2)]
    return js_round(value) if 1000 <= value < math.inf else None


def _strip_quotes(text: str) -> str:
    text = jsclass.trim(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = jsclass.trim(text[1:-1])
    return text


def _prefix(rest: str) -> tuple[bool, bool | None, str]:
    """Flags recognised only before the prompt: ``(once, jitter, prompt)``; the prompt is kept verbatim."""
    once, jitter = False, None
    for m in _TOKEN.finditer(rest):
        tok = m.group(0)
        if tok == "--once":
            once = True
        elif tok in ("--jitter=true", "--jitter=false"):
            jitter = tok == "--jitter=true"
        elif tok == "--":
            return once, jitter, jsclass.trim(rest[m.end() :])
        else:
            return once, jitter, jsclass.trim(rest[m.start() :])
    return once, jitter, ""


def parse(args: str, *, has_session: bool = True) -> Parsed:
    """Parse a ``/loop`` argument string (docs/reference/loop-plugin.md#s2-2, in its order)."""
    text = _strip_quotes(args)
    tokens = jsclass.split(text)
    head = tokens[0].lower() if tokens else ""
    if head in _CC_FLAGS:
        head = _CC_FLAGS[head]
    elif head in ("help", "--help", "-h"):
        return Sub(action="help")
    elif head.startswith("--") and head not in _ALLOWED_FLAGS:
        return Fail(message=texts.unknown_flag(tokens[0]))
    arg = tokens[1] if len(tokens) > 1 else None
    if head in ("cancel", "stop"):
        if arg is None:
            return Sub(action="stop-all") if head == "stop" else Fail(message=texts.usage("cancel"))
        return Sub(action="cancel", task_id=arg)
    if head in ("list", "status"):
        return Sub(action="list")
    if head in ("pause", "resume"):
        action: Action = "pause" if head == "pause" else "resume"
        return Sub(action=action, task_id=arg) if arg is not None else Fail(message=texts.usage(head))
    if head == "stop-all":
        return Sub(action="stop-all")
    if not has_session:
        return Fail(message=texts.NO_SESSION)
    if not tokens:
        return Maintenance()
    found: tuple[int, str] | None = None
    first = interval_ms(tokens[0])
    if first is not None:
        found = (first, jsclass.trim_start(text[len(tokens[0]) :]))
    else:
        m = _EVERY.search(text)
        if m is not None:
            every = interval_ms(m.group(1) + m.group(2).lower()[0])
            if every is not None:
                found = (every, jsclass.trim(text[: m.start()]))
    if found is not None:
        once, jitter, prompt = _prefix(found[1])
        if not prompt:
            return Fail(message=texts.missing_prompt(tokens[0]))
        return Fixed(interval_ms=found[0], prompt=prompt, once=once, jitter=jitter, token=tokens[0])
    if len(tokens) >= 5 and all(_CRON_FIELD.fullmatch(t) for t in tokens[:5]):
        return Fail(message=texts.cron(" ".join(tokens[5:]) or "check the build"))
    if jsclass.is_ascii_digit(tokens[0][0]):
        return Fail(message=texts.invalid_interval(tokens[0]))
    once, _, prompt = _prefix(text)
    if not prompt:
        return Fail(message=texts.EMPTY)
    if once:
        return Fail(message=texts.ONCE_FIXED_ONLY)
    return Adaptive(prompt=prompt)


_COMMAND: Final = re.compile(f"/(?:loop|proactive)(?:{WS}+(.*))?", re.DOTALL)


def intercept(parts: list[tuple[str, bool]]) -> str | None:
    """The ``/loop`` (or ``/proactive``) arguments in a chat message's text parts, ``None`` when it has none.

    ``parts`` are ``(text, consumed)``; a part already marked synthetic or ignored (the command hook handled
    it) is skipped, so one message never makes two tasks. Mentions inside a sentence are not commands.
    """
    for text, consumed in parts:
        if consumed:
            continue
        m = _COMMAND.fullmatch(_strip_quotes(text))
        if m is not None:
            return jsclass.trim(m.group(1) or "")
    return None
