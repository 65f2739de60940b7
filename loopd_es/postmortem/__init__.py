"""Post-mortem: a goal's whole timeline (``history``), why it is in its status (``explain``), an HTML timeline.

Read-only over the log: nothing here appends. A goal's streams are found through the ``goal_links`` read
model when it is registered (one indexed query), else by one scan of the log.
"""

from __future__ import annotations

from .history import Change as Change
from .history import Entry as Entry
from .history import History as History
from .history import build_history as build_history
from .links import GoalStreams as GoalStreams
from .links import UnknownGoalError as UnknownGoalError
from .links import find_goal as find_goal

__all__ = ("Change", "Entry", "GoalStreams", "History", "UnknownGoalError", "build_history", "find_goal")
