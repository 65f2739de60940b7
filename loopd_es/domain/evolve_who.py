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


def noting_caller(cls: type, fn: _Handler) -> _Handler:
    """``fn`` followed by noting who acted, for ``cls``, a type that records a caller (``called_by``).

    ``ended_by`` follows the goal's end (``None`` when the engine or the CLI ended it, and once it runs
    again); ``controlled_by`` is the last tool call that changed the goal in any other way. The handler is
    chosen once per type, so a replay's progress events pay no type test.
    """
    if issubclass(cls, _ENDS):

        def ends(d: GoalDraft, e: Any, m: _Memo) -> None:
            fn(d, e, m)
            d.ended_by = e.called_by

        return ends
    reopens = issubclass(cls, _REOPENS)

    def run(d: GoalDraft, e: Any, m: _Memo) -> None:
        fn(d, e, m)
        if reopens:
            d.ended_by = None
        if (caller := e.called_by) is not None:
            d.controlled_by = caller

    return run
