"""Run events: one prompt to the worker and how it ended, recorded on the goal's stream.

A run is fenced by its ``generation`` (the reference's ``runGeneration``): a run-scoped event whose
generation is not the current one is stale and folds to nothing (docs/reference/loopd.md#s2-3, #s10).
"""

from __future__ import annotations

from typing import Literal

from .base import Event, event
from .times import UtcTime
from .upcasting import register_upcaster, renamed, times_to_utc

RunKind = Literal["steer", "bare", "force_finish"]


@event("run.started", version=3)
class RunStarted(Event, frozen=True):
    """A turn was acquired and its prompt is being sent; ``charged`` is false for a free retry turn."""

    goal_id: str
    run_id: str
    generation: int
    prompt_message_id: str
    turn_count: int
    charged: bool = True
    kind: RunKind = "steer"
    deadline: UtcTime | None = None
    """When the run times out if it has not ended: ``at`` plus the goal's turn timeout (the reference's
    ``leaseExpiresAt``: a run's deadline, decided once, never renewed; not a lease between processes)."""
    at: UtcTime | None = None


@event("run.idle_candidate", version=2)
class RunIdleCandidate(Event, frozen=True):
    """The first of the two idle signals that confirm a run's end was seen."""

    goal_id: str
    run_id: str
    generation: int
    at: UtcTime | None = None


@event("run.completed")
class RunCompleted(Event, frozen=True):
    """The run's idle was confirmed: the run is cleared and its deadline with it."""

    goal_id: str
    run_id: str
    generation: int | None = None


@event("run.failed", version=2)
class RunFailed(Event, frozen=True):
    """A session error or a failed prompt delivery; below the failure limit the goal waits until ``retry_after``.

    ``run_id`` is the run it failed (``"unknown"`` outside a run, as the reference records it) and ``generation``
    the run generation it was decided on (absent in logs written before it existed: then only the run id fences).
    """

    goal_id: str
    run_id: str
    error: str
    consecutive_failures: int
    retry_after: UtcTime | None = None
    source: Literal["session-error", "prompt-delivery"] = "session-error"
    generation: int | None = None
    at: UtcTime | None = None
    """When it was decided: the time ``retry_after`` counts from (absent in logs written before it existed)."""


@event("run.fell_back", version=2)
class RunFellBack(Event, frozen=True):
    """The turn ended on a provider limit while a fallback model was ready for the next one: not a failure.

    No failure is counted and there is no backoff: the goal's next turn is due at once (``at``), on
    ``to_model``. ``kind`` is the limit as observed (``quota`` or ``rate-limit``).
    """

    goal_id: str
    run_id: str
    kind: Literal["quota", "rate-limit"]
    to_model: str
    from_model: str | None = None
    generation: int | None = None
    at: UtcTime | None = None


@event("run.recovered")
class RunRecovered(Event, frozen=True):
    """Maintenance released a running phase whose worker had been idle and quiet too long."""

    goal_id: str
    run_id: str
    quiet_seconds: float
    cleared_tool_calls: int = 0
    generation: int | None = None


@event("run.stuck")
class RunStuck(Event, frozen=True):
    """A watchdog found the run stuck (idle but unconfirmable, or busy with no activity); notified once."""

    goal_id: str
    run_id: str
    stuck_seconds: float
    watchdog: Literal["idle-unconfirmed", "busy"] = "busy"
    generation: int | None = None
    worker_status: str | None = None
    """What the worker reported when the busy watchdog fired (``busy`` or ``retry``)."""


@event("run.confirm_failed", version=2)
class RunConfirmFailed(Event, frozen=True):
    """The idle could not be confirmed against the transcript (recorded once per generation)."""

    goal_id: str
    generation: int
    reason: Literal["prompt-outside-window", "assistant-incomplete", "worker-active"]
    run_id: str | None = None
    at: UtcTime | None = None


register_upcaster("run.started", 1, times_to_utc("lease_expires_at", "at"))
register_upcaster("run.started", 2, renamed("lease_expires_at", "deadline"))
register_upcaster("run.idle_candidate", 1, times_to_utc("at"))
register_upcaster("run.failed", 1, times_to_utc("retry_after", "at"))
register_upcaster("run.fell_back", 1, times_to_utc("at"))
register_upcaster("run.confirm_failed", 1, times_to_utc("at"))
