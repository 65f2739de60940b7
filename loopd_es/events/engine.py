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


# -- shared mode: many engines on one log, goals partitioned by per-goal leases ----------------------------


@event("engine.member_joined")
class EngineMemberJoined(Event, frozen=True):
    """An engine ``member`` (one process's run, named ``holder`` by its user) joined the shared group on stream
    ``engine-members``; it is live until ``expires_at`` unless it renews."""

    member: str
    holder: str
    expires_at: str
    at: str = ""


@event("engine.member_renewed")
class EngineMemberRenewed(Event, frozen=True):
    """The member is alive: it stays live until ``expires_at``."""

    member: str
    expires_at: str


@event("engine.member_left")
class EngineMemberLeft(Event, frozen=True):
    """The member stopped cleanly (its goals may be claimed at once)."""

    member: str


@event("engine.goal_claimed")
class EngineGoalClaimed(Event, frozen=True):
    """``member`` now turns goal ``goal_id``, on stream ``engine-goal-<goal_id>``, with fencing ``token`` (that
    stream's version at the claim). A claim lasts while the member is live; it is taken over only once the
    holder's membership ran out, left, or the holder released it, by appending at the version the new holder
    read, so two contenders cannot both win."""

    goal_id: str
    member: str
    token: int
    previous_member: str | None = None
    reason: str = ""
    at: str = ""


@event("engine.goal_released")
class EngineGoalReleased(Event, frozen=True):
    """The holder gave the goal up: ``finished`` (terminal, every notice recorded) or ``rebalance`` (another
    live member is the goal's preferred holder now)."""

    goal_id: str
    member: str
    token: int
    reason: str = ""


@event("engine.goal_fenced")
class EngineGoalFenced(Event, frozen=True):
    """Written atomically with each batch a shared engine appends about goal ``goal_id`` (to ``stream``): it
    lands only while the goal's lease stream is where this holder left it, so a member that lost the goal (a
    paused process whose claim was taken over) writes nothing more about it."""

    goal_id: str
    member: str
    token: int
    stream: str = ""


ENGINE_STREAM = "engine"
"""Where the engine's facts worth keeping go (takeovers and goals moving between members)."""


@event("engine.took_over")
class EngineTookOver(Event, frozen=True):
    """``holder`` took the engine lease from ``previous_holder``, which had stopped renewing it (crashed,
    killed or stalled) and whose lease ran out at ``previous_expired_at`` (ISO, UTC)."""

    holder: str
    previous_holder: str
    previous_expired_at: str
    at: str


@event("engine.goal_moved")
class EngineGoalMoved(Event, frozen=True):
    """In a shared group, goal ``goal_id`` is now turned by ``member`` instead of ``previous_member``:
    ``takeover`` (the previous member stopped renewing), ``handover`` (it handed the goal on to the goal's
    preferred member) or ``stopping`` (it stopped cleanly)."""

    goal_id: str
    member: str
    previous_member: str
    reason: str
    at: str
