"""How :func:`~loopd_es.domain.evolve.evolve` folds compaction: the engine's ``compaction.started`` and
``compaction.completed`` move the goal's phase; the imported ``goal.compaction_*`` facts are kept for the
post-mortem only. Registered when :mod:`~loopd_es.domain.evolve` is imported."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..events import engine as en
from ..events import goal as g
from .evolve_base import _HANDLERS, _Memo, _on

if TYPE_CHECKING:
    from .state import GoalDraft


@_on(en.CompactionStarted)
def _compaction_started(d: GoalDraft, e: en.CompactionStarted, m: _Memo) -> None:
    d.phase = "compacting"


@_on(en.CompactionCompleted)
def _compaction_completed(d: GoalDraft, e: en.CompactionCompleted, m: _Memo) -> None:
    if d.phase == "compacting":
        d.phase = "idle"


def _noted(d: GoalDraft, e: Any, m: _Memo) -> None:
    """Nothing to fold: compaction is kept in the log for the post-mortem, not in the goal's state."""


_HANDLERS[g.GoalCompactionStarted] = _noted
_HANDLERS[g.GoalCompactionCompleted] = _noted
