"""Post-mortem: a goal's whole timeline (``history``), why it is in its status (``explain``), an HTML timeline.

Read-only over the log: nothing here appends. A goal's streams are found through the ``goal_links`` read
model when it is registered (one indexed query), else by one scan of the log.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .history import Change as Change
    from .history import Entry as Entry
    from .history import History as History
    from .history import build_history as build_history
    from .links import GoalStreams as GoalStreams
    from .links import UnknownGoalError as UnknownGoalError
    from .links import find_goal as find_goal

_LAZY: Final = {
    "Change": "history",
    "Entry": "history",
    "History": "history",
    "build_history": "history",
    "GoalStreams": "links",
    "UnknownGoalError": "links",
    "find_goal": "links",
}
"""Re-exports imported on first use: ``goals`` shows who asked (:mod:`.who`) without loading the timeline."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = ("Change", "Entry", "GoalStreams", "History", "UnknownGoalError", "build_history", "find_goal")
