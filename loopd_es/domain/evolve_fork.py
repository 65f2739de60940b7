"""How :func:`~loopd_es.domain.evolve.evolve` folds a fork: ``goal.forked_from`` starts a goal as a copy of
another's state at one event; ``goal.forked`` only records, on the source, that a fork was made. Registered
when :mod:`~loopd_es.domain.evolve` is imported."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import msgspec

from ..events import goal as g
from .evolve_base import _Memo, _on, _Refused
from .state import GoalState

if TYPE_CHECKING:
    from .state import GoalDraft

_NOT_CARRIED: Final = frozenset(
    {
        "goal_id",
        "exists",
        "cleared",
        "version",
        "position",
        "anomaly_count",
        "anomalies",
        "worker_session_id",
        "topology",
        "native_parent_id",
        "switch_in_flight",
        "active_run_id",
        "active_prompt_message_id",
        "run_deadline",
        "idle_candidate_generation",
        "turn_started_at",
        "active_tool_call_ids",
        "stuck_notified_run_id",
    }
)
"""What a fork does not take from its source: its own identity and stream, and the source's worker and run
(the fork gets a worker of its own; a run in flight at the fork point belongs to the source)."""


@_on(g.GoalForkedFrom)
def _forked_from(d: GoalDraft, e: g.GoalForkedFrom, m: _Memo) -> None:
    if d.exists or d.cleared:
        raise _Refused(e.event_type, "goal already exists")
    try:
        source = msgspec.convert(e.state, GoalState)
    except msgspec.ValidationError as err:
        raise _Refused(e.event_type, f"the source state does not read: {err}") from None
    for name in GoalState.__struct_fields__:
        if name not in _NOT_CARRIED:
            setattr(d, name, getattr(source, name))
    d.exists = True
    d.name = e.name
    d.objective = e.objective
    d.config = e.config
    d.interactive = e.config.interactive
    d.created_at = e.at
    if d.phase in ("running", "compacting", "stopping"):
        d.phase = "queued"


@_on(g.GoalForked)
def _forked(d: GoalDraft, e: g.GoalForked, m: _Memo) -> None:
    """Nothing to fold: the fork is a goal of its own; the source only keeps the link (for ``history``)."""


WITHOUT_GOAL: Final = frozenset({_forked_from, _forked})
"""Handlers that apply where the goal does not exist (yet, or any more): the fork's first event, and the
source's note of a fork made from an earlier point of a goal since cleared."""
