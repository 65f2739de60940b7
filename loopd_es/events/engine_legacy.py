"""Engine bookkeeping as logs written before 0.4 recorded it: read, replayed and imported, never written.

Before coordination moved beside the log (:mod:`loopd_es.log.coord`), the engine lease and its renewals
(stream ``engine-lease``), shared-group memberships (``engine-members``), per-goal claims and the fences written
with every batch (``engine-goal-<goal_id>``) were events. Old logs still hold them, so their types stay in the
catalogue (events are facts, never edited); nothing in loopd-es appends them or acts on them any more.
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
