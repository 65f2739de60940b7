"""Stream names: which aggregate a stream belongs to, and back.

``goal-<goal_id>`` holds a goal's lifecycle, its runs and its identity switches (every decision about them
reads the goal). ``command-<command_id>`` holds a command session and its awaits (owned by
:mod:`loopd_es.domain.command`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

GOAL_PREFIX: Final = "goal-"
COMMAND_PREFIX: Final = "command-"


def goal_stream(goal_id: str) -> str:
    """The stream of one goal."""
    return f"{GOAL_PREFIX}{goal_id}"


def command_stream(command_id: str) -> str:
    """The stream of one command session."""
    return f"{COMMAND_PREFIX}{command_id}"


def aggregate_of(stream: str) -> tuple[str, str]:
    """``(kind, id)`` for a stream name: ``("goal", "42")`` for ``goal-42``; ``("other", stream)`` otherwise."""
    for kind, prefix in (("goal", GOAL_PREFIX), ("command", COMMAND_PREFIX)):
        if stream.startswith(prefix) and len(stream) > len(prefix):
            return kind, stream[len(prefix) :]
    return "other", stream


def short_id(ident: str) -> str:
    """Eight characters that tell ids apart, for one line of text (history, explain, the HTML timeline).

    A time-ordered UUIDv7 (switch ids, event and correlation ids) starts with its timestamp, so every switch of
    one minute starts the same: it is shown by its random tail, ``…`` first. Any other id by its head.
    """
    if len(ident) == 36 and ident[14] == "7" and ident[8] == "-":
        return "…" + ident[-8:]
    return ident[:8]


def short_ids(ids: Sequence[str], least: int = 8) -> dict[str, str]:
    """Each id cut to the shortest prefix (at least ``least`` characters) no other id shares: for a listing
    whose ids a user types back (a prefix resolves)."""
    result = {}
    for i in ids:
        n = min(least, len(i))
        while n < len(i) and any(o != i and o.startswith(i[:n]) for o in ids):
            n += 1
        result[i] = i[:n]
    return result
