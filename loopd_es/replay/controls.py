"""Re-making the owner's controls (pause, resume, retry, clear) and identity-switch decisions.

An owner control is re-decided from the goal's state alone: the recorded event says a request was made and
the deciders must still answer it the same way (a pause of a goal that is not active, say, now does nothing).
Who asked comes from ``called_by`` when a tool recorded it; without it the request came from the dashboard
or the CLI, which the deciders do not check for ownership. A resume or retry takes a writer slot: the other
goals' state is not in this stream, and a recorded success means none held it, so none is assumed.

A switch decision reads the worker's status from the host. Switch events record it (``worker_status``) since
it was added; an event without it cannot be re-made and is not counted as a decision. The model and agent
catalogs are not recorded either: a recorded request or deferral means the catalogs allowed the switch, so
they are taken as allowing exactly what it names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..domain import goal_commands as c
from ..events import goal as g
from ..events import identity as i
from .remake import facts_for, now_of, remake
from .verdict import Divergence, Step, compare

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..domain.state import GoalState
    from ..events.base import Caller, Event
    from .policy import Policy


def _caller(called_by: Caller | None) -> str | None:
    """The owner session that asked through a tool; ``None`` for the dashboard and CLI."""
    return called_by.session_id if called_by is not None and called_by.role == "owner" else None


def control(step: Step, state: GoalState, policy: Policy) -> Divergence | None:
    """A pause, owner resume, retry or clear, re-decided on the state the log shows before it."""
    e = step.event
    command: c.GoalCommand
    if isinstance(e, g.GoalPaused):
        command = c.PauseGoal(goal_id=state.goal_id, caller=_caller(e.called_by))
    elif isinstance(e, g.GoalResumed):
        command = c.ResumeGoal(goal_id=state.goal_id, caller=_caller(e.called_by))
    elif isinstance(e, g.GoalRetried):
        command = c.RetryGoal(goal_id=state.goal_id, caller=_caller(e.called_by))
    else:
        assert isinstance(e, g.GoalCleared)
        command = c.ClearGoal(goal_id=state.goal_id, caller=_caller(e.called_by))
    return compare(step, remake(command, state, facts_for(policy, now_of(step))))


def switch(step: Step, state: GoalState, policy: Policy) -> Divergence | None:
    """An owner's switch (requested or deferred) or a pending switch applied, under the recorded worker status."""
    e = step.event
    assert isinstance(e, i.IdentitySwitchRequested | i.IdentitySwitchDeferred)
    assert e.worker_status is not None
    command: c.GoalCommand
    if isinstance(e, i.IdentitySwitchRequested) and e.pending:
        command = c.ApplyPendingSwitch(goal_id=state.goal_id, switch_id=e.switch_id)
    else:
        caller = e.requested_by if isinstance(e, i.IdentitySwitchRequested) else _caller(e.called_by)
        command = c.SwitchIdentity(
            goal_id=state.goal_id,
            switch_id=e.switch_id,
            model=e.model,
            agent=e.agent,
            resume=isinstance(e, i.IdentitySwitchRequested) and e.resume,
            # a recorded deferral passed the ownership check: without a tool's record, the owner asked
            caller=caller or state.owner_session_id,
        )
    models = {e.model: c.ModelInfo(usable=True)} if e.model else {}
    facts = facts_for(
        policy,
        now_of(step, e.at),
        worker_status=e.worker_status,
        model_catalog=c.ModelCatalog(models=models),
        agent_catalog=c.AgentCatalog(agents=(e.agent,) if e.agent else ()),
    )
    return compare(step, remake(command, state, facts))


CONTROL_TYPES: Final = frozenset({"goal.paused", "goal.resumed", "goal.retried", "goal.cleared"})
SWITCH_TYPES: Final = frozenset({"identity.switch_requested", "identity.switch_deferred"})


def remade(event: Event) -> bool:
    """Whether the log holds what re-making this decision needs: a switch's worker status, an owner's resume."""
    if isinstance(event, i.IdentitySwitchRequested | i.IdentitySwitchDeferred):
        return event.worker_status is not None
    if isinstance(event, g.GoalResumed):
        return event.by == "owner"  # a switch's or a schedule's resume is part of that decision
    return True


CHECKS: Final[dict[str, Callable[[Step, GoalState, Policy], Divergence | None]]] = {
    **dict.fromkeys(CONTROL_TYPES, control),
    **dict.fromkeys(SWITCH_TYPES, switch),
}
