"""Engine events: the facts about who ran the engine worth keeping in history, and compaction of a worker.

Coordination itself (the engine lease, shared members and per-goal claims, their renewals and the fences
on every write) lives beside the log in each backend's coordination records (:mod:`loopd_es.log.coord`),
not in it: an idle engine appends nothing. What stays history is what a person asks about afterwards, on
stream ``engine``: ``engine.took_over`` (an engine took the lease from one that stopped renewing it) and
``engine.goal_moved`` (a shared group's goal went to another member). ``compaction.*`` events are on the
goal's stream.

Logs written before 0.4 also hold the lease and membership as events (``engine.lease_*`` on stream
``engine-lease``, ``engine.member_*`` on ``engine-members``, ``engine.goal_claimed`` / ``_released`` /
``_fenced`` on ``engine-goal-<goal_id>``, ``engine.fenced``); they still read, replay and import, and nothing
acts on them any more.
"""

from __future__ import annotations

from .base import Event, event
from .times import UtcTime
from .upcasting import register_upcaster, times_to_utc


@event("compaction.started", version=2)
class CompactionStarted(Event, frozen=True):
    """The engine started compacting the worker's session after run ``run_count``.

    The reference's compaction: docs/reference/loopd.md#s3-14.
    """

    goal_id: str
    run_count: int
    at: UtcTime | None = None


@event("compaction.completed")
class CompactionCompleted(Event, frozen=True):
    """Compaction ended (``error`` when the host failed it; the reference swallows that and goes on)."""

    goal_id: str
    error: str | None = None


# -- shared mode: many engines on one log, goals partitioned by per-goal leases ----------------------------


ENGINE_STREAM = "engine"
"""Where the engine's facts worth keeping go (takeovers and goals moving between members)."""


@event("engine.took_over")
class EngineTookOver(Event, frozen=True):
    """``holder`` took the engine lease from ``previous_holder``, which had stopped renewing it (crashed,
    killed or stalled) and whose lease ran out at ``previous_expired_at``."""

    holder: str
    previous_holder: str
    previous_expired_at: UtcTime
    at: UtcTime


@event("engine.goal_moved")
class EngineGoalMoved(Event, frozen=True):
    """In a shared group, goal ``goal_id`` is now turned by ``member`` instead of ``previous_member``:
    ``takeover`` (the previous member stopped renewing), ``handover`` (it handed the goal on to the goal's
    preferred member) or ``stopping`` (it stopped cleanly)."""

    goal_id: str
    member: str
    previous_member: str
    reason: str
    at: UtcTime


register_upcaster("compaction.started", 1, times_to_utc("at"))
