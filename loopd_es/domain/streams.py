"""Stream names: which aggregate a stream belongs to, and back.

``goal-<goal_id>`` holds a goal's lifecycle, its runs and its identity switches (every decision about them
reads the goal). ``command-<command_id>`` holds a command session and its awaits (owned by
:mod:`loopd_es.domain.command`).
"""

from __future__ import annotations

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
            return kind, stream[len(prefix):]
    return "other", stream
