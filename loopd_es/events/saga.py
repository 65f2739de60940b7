"""Saga events: the progress of a process manager that calls the worker host, one stream per saga run.

An identity switch saga lives on ``switch-<switch_id>``. Every host call is recorded as an *intent* (with an
idempotency key) before the call and as an outcome after it, so a crash between the two leaves an open intent
that recovery resolves by reading the host's live session identity, never by guessing. Raw host errors are
never recorded: a failure carries the host error's safe ``reason`` code only.

The checkpoint stream ``saga-checkpoints`` records how far recovery has scanned the log and which sagas were
still open there, so a restart reads only the tail of the log.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .base import Event, event
from .times import UtcTime
from .upcasting import register_upcaster, times_to_utc

HostCall = Literal["switch_model", "switch_agent"]
Purpose = Literal["forward", "compensate"]
SagaOutcome = Literal[
    "applied", "next-prompt", "unsupported", "failed", "rolled-back", "rollback-failed", "abandoned"
]


@event("saga.switch_started", version=2)
class SwitchSagaStarted(Event, frozen=True):
    """A switch saga took charge of ``identity.switch_requested``; ``from_*`` is the identity to roll back to."""

    switch_id: str
    goal_id: str
    session_id: str
    model: str | None = None
    agent: str | None = None
    from_model: str | None = None
    from_agent: str | None = None
    pending: bool = False
    owner_pid: int = 0
    at: UtcTime | None = None


@event("saga.host_call_intended", version=2)
class HostCallIntended(Event, frozen=True):
    """The saga is about to call the host; ``key`` is the call's idempotency key (unique per saga step)."""

    switch_id: str
    key: str
    op: HostCall
    arg: str
    purpose: Purpose = "forward"
    at: UtcTime | None = None


@event("saga.host_call_succeeded")
class HostCallSucceeded(Event, frozen=True):
    """The host answered the call named by ``key``."""

    switch_id: str
    key: str
    result: Literal["applied", "next-prompt", "unsupported"]


@event("saga.host_call_failed")
class HostCallFailed(Event, frozen=True):
    """The host refused the call named by ``key``; ``reason`` is the host error's safe code (``busy``, ``rejected``)."""

    switch_id: str
    key: str
    reason: str


@event("saga.host_call_resolved")
class HostCallResolved(Event, frozen=True):
    """An intent whose outcome was unknown (crash, timeout) was settled by reading the live session identity."""

    switch_id: str
    key: str
    landed: bool
    live_model: str | None = None
    live_agent: str | None = None


@event("saga.switch_finished")
class SwitchSagaFinished(Event, frozen=True):
    """The saga is closed: the goal stream has the switch's outcome and no host call is pending."""

    switch_id: str
    goal_id: str
    outcome: SagaOutcome
    recovered: bool = False


class OpenSwitch(msgspec.Struct, frozen=True, kw_only=True):
    """A switch saga still open at a checkpoint."""

    goal_id: str
    switch_id: str


@event("saga.checkpoint")
class SagaCheckpoint(Event, frozen=True):
    """Recovery scanned the log up to ``position``; ``open`` lists the switches still open there."""

    position: int
    open: tuple[OpenSwitch, ...] = ()


register_upcaster("saga.switch_started", 1, times_to_utc("at"))
register_upcaster("saga.host_call_intended", 1, times_to_utc("at"))
