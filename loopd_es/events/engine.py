"""Engine events: who runs the engine (the lease, on stream ``engine-lease``) and compaction of a goal's worker.

The lease is a fact like any other: ``engine.lease_acquired`` names the holder, its fencing ``token`` (the
lease stream's version at acquisition, so it only grows) and when the lease expires unless renewed. Another
``loopd-es run`` takes over only after ``expires_at`` has passed, by appending at the version it read, so two
contenders cannot both win. ``compaction.*`` events are on the goal's stream.
"""

from __future__ import annotations

from .base import Event, event


@event("engine.lease_acquired")
class EngineLeaseAcquired(Event, frozen=True):
    """``holder`` now runs the engine for this log, with fencing ``token``, until ``expires_at`` (ISO, UTC)."""

    holder: str
    token: int
    expires_at: str
    previous_holder: str | None = None
    at: str = ""


@event("engine.lease_renewed")
class EngineLeaseRenewed(Event, frozen=True):
    """The holder is alive: its lease now runs until ``expires_at``."""

    holder: str
    token: int
    expires_at: str


@event("engine.fenced")
class EngineFenced(Event, frozen=True):
    """Written atomically with each batch the engine appends to ``stream``: the holder and its fencing token.

    It lands only while the lease stream is where this holder left it, so a holder that lost the lease can
    write nothing more. It does not extend the lease (``expires_at`` repeats the current expiry).
    """

    holder: str
    token: int
    expires_at: str
    stream: str = ""


@event("engine.lease_released")
class EngineLeaseReleased(Event, frozen=True):
    """The holder stopped cleanly; anyone may take the lease at once."""

    holder: str
    token: int


@event("compaction.started")
class CompactionStarted(Event, frozen=True):
    """The engine started compacting the worker's session after run ``run_count`` (reference §3.14)."""

    goal_id: str
    run_count: int
    at: str = ""


@event("compaction.completed")
class CompactionCompleted(Event, frozen=True):
    """Compaction ended (``error`` when the host failed it; the reference swallows that and goes on)."""

    goal_id: str
    error: str | None = None
