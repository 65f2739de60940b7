"""Who acted on a goal or a command through an OpenCode tool, as the read models keep it, in every view's words.

The ``goals`` and ``commands`` read models store the tool calls (``created_by``, ``started_by``, ``ended_by``,
``controlled_by``) as JSON objects; ``goal show``, ``commands`` and the dashboard's panes say them with
:meth:`Caller.describe <loopd_es.events.base.Caller.describe>`, as ``history`` and ``explain`` do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from ..events.base import Caller
from ..text_safe import term_line

CALLER_COLUMNS: Final = ("created_by", "started_by", "ended_by", "controlled_by")
"""The read-model columns that hold a tool call, in the order a view says them."""


def caller_of(value: object) -> Caller | None:
    """A stored tool call (a JSON text, or the object decoded from it) as a :class:`Caller`; ``None`` if none."""
    if value is None or value == "":
        return None
    try:
        if isinstance(value, str | bytes):
            return msgspec.json.decode(value, type=Caller)
        return msgspec.convert(value, type=Caller)
    except msgspec.ValidationError:
        return None  # a view never fails on a column it only decorates


def who_lines(row: Mapping[str, Any]) -> list[str]:
    """``created by owner session S (call C) with loopd_create_goal, message M``, one line per tool call the row
    records (sanitised for a terminal: the ids come from OpenCode)."""
    ended = "completed" if row.get("status") == "complete" else "blocked"
    verbs = {
        "created_by": "created",
        "started_by": "started",
        "ended_by": ended,
        "controlled_by": "last changed",
    }
    lines = []
    for key in CALLER_COLUMNS:
        caller = caller_of(row.get(key))
        if caller is not None:
            lines.append(term_line(caller.describe(verbs[key])))
    return lines
