"""Re-making one recorded decision: the facts it is re-decided under, and the decider's answer (a refusal kept
as :class:`~.verdict.Refused`), shared by the turn checks (:mod:`.redecide`) and the control checks
(:mod:`.controls`)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..clock import parse_rfc3339, utc
from ..domain import goal_commands as c
from ..domain.decide import decide
from ..errors import DomainError
from .verdict import Refused

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..events.base import Event
    from .policy import Policy
    from .verdict import Step


def now_of(step: Step, *candidates: datetime | str | None) -> datetime:
    """The decision's time: the first recorded time given (a payload's time, or text such as an import's
    ``occurred_at``), else when its event was appended."""
    for when in candidates:
        if isinstance(when, datetime):
            return utc(when)
        if when:
            return parse_rfc3339(when)
    return parse_rfc3339(step.env.recorded_at)


def facts_for(policy: Policy, now: datetime, **more: Any) -> c.Facts:
    """The outside facts of a re-made decision: its time, the policy's backoff and what the event implies."""
    backoff = policy.backoff or c.RetryBackoff()
    return c.Facts(now=now, backoff=backoff, **more)


def remake(command: c.GoalCommand, state: GoalState, facts: c.Facts) -> list[Event]:
    """The current deciders' answer; a rule they now refuse comes back as one :class:`Refused`."""
    try:
        return decide(command, state, facts)
    except DomainError as e:
        return [Refused(reason=str(e))]
