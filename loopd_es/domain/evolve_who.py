"""Who acted on a goal: the tool call an event records (``called_by``) folded into ``ended_by`` and
``controlled_by``. Kept apart from :mod:`.evolve` so the fold's rules read on their own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ..events import goal as g

if TYPE_CHECKING:
    from .evolve_base import _Handler, _Memo
    from .state import GoalDraft

_ENDS: Final = (g.GoalCompleted, g.GoalBlocked)
_REOPENS: Final = (g.GoalRetried, g.GoalResumed)


def _who(d: GoalDraft, e: Any) -> None:
    """``ended_by`` follows the goal's end (``None`` when the engine or the CLI ended it, and once it runs
    again); ``controlled_by`` is the last tool call that changed the goal in any other way."""
    caller = e.called_by
    if isinstance(e, _ENDS):
        d.ended_by = caller
        return
    if isinstance(e, _REOPENS):
        d.ended_by = None
    if caller is not None:
        d.controlled_by = caller


def noting_caller(fn: _Handler) -> _Handler:
    """``fn`` followed by noting who acted (for the types that record a caller)."""

    def run(d: GoalDraft, e: Any, m: _Memo) -> None:
        fn(d, e, m)
        _who(d, e)

    return run
