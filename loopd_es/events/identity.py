"""Identity events: switching a goal's worker model/agent, provider limits and model fallback.

They live on the goal's stream (``goal-<goal_id>``) because every decision about them reads the goal.
A switch is identified by ``switch_id`` so the saga that calls the host can pair its outcome with the
request. Raw host errors are never recorded: failures carry a ``stage`` and a fixed ``reason``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .base import Caller, Event, event
from .times import UtcTime
from .upcasting import register_upcaster, times_to_utc

SwitchReason = Literal["owner", "quota"]
SwitchOutcome = Literal["applied", "next-prompt"]
SwitchTarget = Literal["model", "agent", "identity"]
"""Which half was asked for: only the model, only the agent, or both as one transaction."""
WorkerStatus = Literal["idle", "busy", "retry", "unknown"]
"""The worker's status as the host reported it when a switch was decided (a switch in flight counts as busy)."""


@event("identity.switch_requested", version=2)
class IdentitySwitchRequested(Event, frozen=True):
    """The owner (or the fallback) asked for a new model and/or agent; the worker is idle, so apply now."""

    goal_id: str
    switch_id: str
    model: str | None = None
    agent: str | None = None
    resume: bool = False
    requested_by: str = ""
    reason: SwitchReason = "owner"
    pending: bool = False
    at: UtcTime | None = None
    called_by: Caller | None = None
    worker_status: WorkerStatus | None = None
    """The worker status the decision read (``replay --check`` re-makes it); absent in logs written before it was recorded."""


@event("identity.switch_deferred", version=2)
class IdentitySwitchDeferred(Event, frozen=True):
    """The worker was busy: the switch is pending until the next permitted idle turn (config unchanged).

    A deferred model *and* agent is one pending pair; it replaces both single pendings.
    """

    goal_id: str
    switch_id: str
    model: str | None = None
    agent: str | None = None
    reason: SwitchReason = "owner"
    at: UtcTime | None = None
    called_by: Caller | None = None
    worker_status: WorkerStatus | None = None
    """The worker status the decision read (``replay --check`` re-makes it); absent in logs written before it was recorded."""


@event("identity.switch_unsupported")
class IdentitySwitchUnsupported(Event, frozen=True):
    """The host or its catalog cannot switch this goal; nothing else changed."""

    goal_id: str
    switch_id: str
    model: str | None = None
    agent: str | None = None
    called_by: Caller | None = None


@event("identity.switch_applied", version=2)
class IdentitySwitchApplied(Event, frozen=True):
    """The host accepted the switch; the only fact that changes ``config.model``/``config.agent``.

    ``outcome`` is ``next-prompt`` when the host takes the new identity with the next prompt (v1).
    """

    goal_id: str
    switch_id: str
    target: SwitchTarget
    to_model: str | None = None
    to_agent: str | None = None
    from_model: str | None = None
    from_agent: str | None = None
    outcome: SwitchOutcome = "applied"
    reason: SwitchReason = "owner"
    at: UtcTime | None = None


@event("identity.switch_failed", version=3)
class IdentitySwitchFailed(Event, frozen=True):
    """The switch was not accepted; a failed *pending* switch also blocks an active goal (a separate event)."""

    goal_id: str
    switch_id: str
    target: SwitchTarget
    stage: Literal["validation", "catalog", "host", "persist"]
    reason: Literal["host-rejected", "catalog-unavailable", "interrupted"]
    """``interrupted``: the process making the switch died before the host answered; a later ``goal recover``
    (or engine) found it had not landed."""
    pending: bool = False
    at: UtcTime | None = None


@event("identity.switch_rolled_back")
class IdentitySwitchRolledBack(Event, frozen=True):
    """A half that the host had applied was switched back after the other half failed."""

    goal_id: str
    switch_id: str
    model: str | None = None
    agent: str | None = None


@event("identity.rollback_failed")
class IdentityRollbackFailed(Event, frozen=True):
    """Switching back failed: the live session may hold a partial identity; the owner must inspect it."""

    goal_id: str
    switch_id: str
    model: str | None = None
    agent: str | None = None


class ProviderLimitFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What one provider-limit observation says: the fields the event, the goal's state
    (:class:`~loopd_es.domain.state.ProviderLimit`) and the importer's reading of a loopd project share."""

    kind: Literal["quota", "rate-limit"]
    source: Literal["prompt-delivery", "session-error"]
    observed_at: UtcTime | None
    model: str | None = None
    status_code: int | None = None
    retry_at: UtcTime | None = None


@event("identity.provider_limit_observed", version=2)
class ProviderLimitObserved(Event, ProviderLimitFacts, frozen=True):
    """A provider error classified as a quota or rate limit; never a balance claim, never the raw error.

    The classification: docs/reference/loopd.md#s6.
    """

    goal_id: str
    marks_blocker: bool = False
    via: str | None = None
    """The host signal it was seen on when that was not the error itself: ``retry-status`` when OpenCode was
    still retrying the provider (early fallback, before its own retries ran out)."""


@event("identity.fallback_prepared", version=2)
class FallbackPrepared(Event, frozen=True):
    """A fallback model is pending (reason ``quota``) for the next idle turn; ``attempted`` only grows.

    ``limit`` is what was observed (``quota`` or ``rate-limit``; absent in logs written before it existed).
    """

    goal_id: str
    model: str
    attempted: tuple[str, ...]
    at: UtcTime | None = None
    reused: bool = False
    limit: Literal["quota", "rate-limit"] | None = None


@event("identity.fallback_exhausted")
class FallbackExhausted(Event, frozen=True):
    """Every fallback model was tried (or none is usable)."""

    goal_id: str
    attempted: tuple[str, ...]


@event("identity.fallback_unsupported")
class FallbackUnsupported(Event, frozen=True):
    """The host cannot switch models, so no fallback can be prepared."""

    goal_id: str
    attempted: tuple[str, ...]


@event("identity.fallback_unavailable")
class FallbackUnavailable(Event, frozen=True):
    """The model catalog could not be read, so no fallback could be chosen."""

    goal_id: str
    attempted: tuple[str, ...]


register_upcaster("identity.switch_requested", 1, times_to_utc("at"))
register_upcaster("identity.switch_deferred", 1, times_to_utc("at"))
register_upcaster("identity.switch_applied", 1, times_to_utc("at"))
register_upcaster("identity.switch_failed", 1, times_to_utc("at"))


def _reason_widened(data: dict[str, Any]) -> dict[str, Any]:
    """v3 adds the reason ``interrupted``; a v2 payload is a v3 one as it is."""
    return data


register_upcaster("identity.switch_failed", 2, _reason_widened)
register_upcaster("identity.provider_limit_observed", 1, times_to_utc("observed_at", "retry_at"))
register_upcaster("identity.fallback_prepared", 1, times_to_utc("at"))
