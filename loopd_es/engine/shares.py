"""Many engines on one log (``loopd-es run --shared``): members, and goals partitioned by per-goal claims.

Each engine process is a *member* of the group on stream ``engine-members``: it joins with an expiry and
renews at a third of its length, like the exclusive lease. Each goal is turned by the member holding its
*claim*, recorded on the goal's own stream ``engine-goal-<goal_id>``. A claim needs no renewal of its own: it
lasts while its holder is a live member, so a group renews one event per member, not one per goal.

Who claims what: every member computes each goal's *preferred* member by rendezvous hashing over the live
members (the same answer everywhere once their views agree; only about 1/n of the goals move when a member
comes or goes). A goal is claimed by its preferred member when nobody holds it live (never claimed, released,
or its holder's membership ran out or ended), or by anyone once it has gone unclaimed for two lease lengths
(nobody is stranded behind a stuck preferred member). A claim is appended at the claim stream's version the
contender read, so of two contenders one wins. A live holder hands a goal over (``rebalance``) once its
preferred member has renewed its membership at least once, and gives up a terminal goal (``finished``) once its
notices are recorded; such a goal is claimed again only when it is active again.

Safety does not rest on clocks: :mod:`loopd_es.engine.goal_fence` writes each batch a member appends about a
goal together with an ``engine.goal_fenced`` event at the claim stream's version this member last wrote, so
once someone else claimed the goal, the old holder's writes fail as a whole. Clocks only decide when a member
stops acting (its own membership ran out) and when others may take over (the holder's expiry passed).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

import anyio

from ..domain.provider_limit import iso
from ..errors import LoopdError, StreamNotFoundError, WrongExpectedVersionError
from ..events import engine as en
from ..events.catalogue import decode_payload, new_event
from ..events.envelope import ANY
from .clock import parse_iso

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from ..log.base import LogStore
    from .clock import Clock

MEMBERS_STREAM: Final = "engine-members"
CLAIM_PREFIX: Final = "engine-goal-"
SHARE_TYPES: Final = (
    "engine.member_joined",
    "engine.member_renewed",
    "engine.member_left",
    "engine.goal_claimed",
    "engine.goal_released",
)
"""What a member reads to keep its view of the group (fence events are not needed for it)."""

ACTING_FOR: ContextVar[str | None] = ContextVar("loopd_es_acting_for", default=None)
"""The goal the engine is acting for right now: its writes and side effects are fenced by that goal's claim."""


def claim_stream(goal_id: str) -> str:
    """The stream of one goal's claims (and the fences written with each batch about it)."""
    return f"{CLAIM_PREFIX}{goal_id}"


@contextmanager
def acting_for(goal_id: str) -> Iterator[None]:
    """Within this block the engine acts for ``goal_id`` (its claim fences every write and side effect)."""
    token = ACTING_FOR.set(goal_id)
    try:
        yield
    finally:
        ACTING_FOR.reset(token)


@contextmanager
def acting_for_no_goal() -> Iterator[None]:
    """Within this block the engine acts for no goal (a command's notice): its writes carry no goal's fence."""
    token = ACTING_FOR.set(None)
    try:
        yield
    finally:
        ACTING_FOR.reset(token)


class GoalLostError(LoopdError):
    """This member no longer holds the goal's claim (taken over, or its own membership ran out)."""

    def __init__(self, goal_id: str, why: str) -> None:
        super().__init__(f"goal {goal_id}: {why}")
        self.goal_id = goal_id


@dataclass
class Member:
    holder: str
    expires_at: datetime | None
    left: bool = False
    renewals: int = 0

    def live(self, now: datetime) -> bool:
        return not self.left and self.expires_at is not None and now < self.expires_at


@dataclass
class Claim:
    member: str | None
    released: bool
    reason: str
    since: datetime
    """When this member's view last saw the claim change (for the stranded-goal rule)."""


def preferred(goal_id: str, members: list[str]) -> str | None:
    """The goal's preferred member among ``members`` (rendezvous hashing: highest hash of goal and member)."""
    if not members:
        return None
    return max(members, key=lambda m: hashlib.blake2b(f"{goal_id}\x00{m}".encode(), digest_size=8).digest())


class Shares:
    """This member's membership, its view of the group (fed from the log), and the goals it holds."""

    def __init__(self, store: LogStore, holder: str, clock: Clock, *, ttl_ms: int) -> None:
        self.store = store
        self.holder = holder
        self.member = f"{holder}~{uuid.uuid4().hex[:8]}"
        """This run of the engine: a restarted process is a new member, so its old claims can be taken over."""
        self.clock = clock
        self.ttl = timedelta(milliseconds=ttl_ms)
        self.expires_at: datetime | None = None
        self.members: dict[str, Member] = {}
        self.claims: dict[str, Claim] = {}
        self.held: dict[str, int] = {}
        """goal id -> the claim stream version this member last wrote (its fencing position)."""
        self.lock = anyio.Lock()
        """Held around every write to a claim stream by this process (claims, releases, fences)."""

    # -- the view ------------------------------------------------------------------------------------

    def observe(self, env: Envelope) -> None:
        """Keep the view in step with the log (the engine feeds it every :data:`SHARE_TYPES` event)."""
        if env.type not in SHARE_TYPES:
            return
        e = decode_payload(env)
        now = self.clock.now()
        if isinstance(e, en.EngineMemberJoined):
            self.members[e.member] = Member(e.holder, parse_iso(e.expires_at))
        elif isinstance(e, en.EngineMemberRenewed):
            found = self.members.get(e.member)
            if found is not None:
                found.expires_at = parse_iso(e.expires_at)
                found.renewals += 1
        elif isinstance(e, en.EngineMemberLeft):
            found = self.members.get(e.member)
            if found is not None:
                found.left = True
        elif isinstance(e, en.EngineGoalClaimed):
            self.claims[e.goal_id] = Claim(e.member, False, e.reason, now)
            if e.member != self.member:
                self.held.pop(e.goal_id, None)
        elif isinstance(e, en.EngineGoalReleased):
            self.claims[e.goal_id] = Claim(e.member, True, e.reason, now)
            if e.member == self.member:
                self.held.pop(e.goal_id, None)

    def alive(self) -> bool:
        """Whether this member may still act: its membership has a third of its length left (by its own clock).

        Others take its goals over only once the membership has run out, so a member that stalled between its
        last check and a host call has that third (a renewal period) before anyone else acts for its goals.
        """
        return self.expires_at is not None and self.clock.now() < self.expires_at - self.ttl / 3

    def live_members(self) -> list[str]:
        now = self.clock.now()
        return sorted(m for m, found in self.members.items() if found.live(now))

    def owns(self, goal_id: str) -> bool:
        """Whether this member may act for the goal now (it holds the claim and is itself still live)."""
        return goal_id in self.held and self.alive()

    def claimable(self, goal_id: str, now: datetime) -> bool:
        """Nobody holds the goal live: never claimed, released, or its holder is no live member."""
        claim = self.claims.get(goal_id)
        if claim is None or claim.released or claim.member is None:
            return True
        holder = self.members.get(claim.member)
        return holder is None or not holder.live(now)

    def stranded(self, goal_id: str, now: datetime) -> bool:
        """Claimable for two lease lengths (since its holder's membership ended, or since first seen
        unclaimed): its preferred member is not taking it, so anyone may."""
        claim = self.claims.get(goal_id)
        if claim is None:
            return False
        since = claim.since
        if claim.member is not None and not claim.released:
            holder = self.members.get(claim.member)
            if holder is not None and holder.expires_at is not None:
                since = max(since, holder.expires_at)
        return now - since >= 2 * self.ttl

    def note_unclaimed(self, goal_id: str) -> None:
        """First sight of a goal nobody ever claimed (the stranded rule counts from here)."""
        self.claims.setdefault(goal_id, Claim(None, True, "", self.clock.now()))

    def settled(self, member: str, now: datetime) -> bool:
        """A live member that renewed at least once (goals are handed over only to a member that shows it
        keeps itself alive, not to one that may die the moment it joined)."""
        found = self.members.get(member)
        return found is not None and found.live(now) and found.renewals > 0

    # -- membership ----------------------------------------------------------------------------------

    async def join(self) -> None:
        now = self.clock.now()
        expires = now + self.ttl
        event = en.EngineMemberJoined(
            member=self.member, holder=self.holder, expires_at=iso(expires), at=iso(now)
        )
        await self.store.append(MEMBERS_STREAM, [new_event(event)], ANY)
        self.expires_at = expires
        self.members[self.member] = Member(self.holder, expires)

    def renew_due(self) -> datetime:
        assert self.expires_at is not None
        return self.expires_at - self.ttl * 2 / 3

    async def renew(self) -> None:
        """Extend the membership; after it ran out the member rejoins under the same name (its claims stay
        fenced: whoever took one over moved its stream, and the rest were never touched)."""
        expires = self.clock.now() + self.ttl
        event = en.EngineMemberRenewed(member=self.member, expires_at=iso(expires))
        await self.store.append(MEMBERS_STREAM, [new_event(event)], ANY)
        self.expires_at = expires

    async def leave(self) -> None:
        """A clean stop: release every goal held, then leave (the others claim them at once)."""
        for goal_id in list(self.held):
            try:
                await self.release(goal_id, "stopping")
            except (GoalLostError, WrongExpectedVersionError):
                pass
        await self.store.append(MEMBERS_STREAM, [new_event(en.EngineMemberLeft(member=self.member))], ANY)
        self.expires_at = None

    # -- claims --------------------------------------------------------------------------------------

    async def claim(self, goal_id: str, reason: str) -> bool:
        """Claim the goal unless someone holds it live; ``True`` when this member now holds it."""
        if not self.alive():
            return False  # a member whose own membership ran out claims nothing until it renewed
        stream = claim_stream(goal_id)
        async with self.lock:
            version, holder = await self._tail(stream)
            now = self.clock.now()
            if holder is not None and holder.member == self.member and not holder.released:
                self.held[goal_id] = version
                return True
            if holder is not None and not holder.released and holder.member is not None:
                found = self.members.get(holder.member)
                if found is not None and found.live(now):
                    return False
            event = en.EngineGoalClaimed(
                goal_id=goal_id,
                member=self.member,
                token=version + 1,
                previous_member=holder.member if holder is not None else None,
                reason=reason,
                at=iso(now),
            )
            try:
                await self.store.append(stream, [new_event(event)], version if version else "no_stream")
            except WrongExpectedVersionError:
                return False
            self.held[goal_id] = version + 1
            self.claims[goal_id] = Claim(self.member, False, reason, now)
            return True

    async def release(self, goal_id: str, reason: str) -> None:
        """Give the goal up (fenced like any write: nothing is released that was already taken over)."""
        async with self.lock:
            version = self.held.get(goal_id)
            if version is None:
                return
            event = en.EngineGoalReleased(goal_id=goal_id, member=self.member, token=version, reason=reason)
            try:
                await self.store.append(claim_stream(goal_id), [new_event(event)], version)
            except WrongExpectedVersionError:
                self.held.pop(goal_id, None)
                raise GoalLostError(goal_id, "claimed by another engine meanwhile") from None
            self.held.pop(goal_id, None)
            self.claims[goal_id] = Claim(self.member, True, reason, self.clock.now())

    async def check(self, goal_id: str) -> None:
        """:raises GoalLostError: unless this member still holds the goal and its membership has not run out."""
        version = self.held.get(goal_id)
        if version is None:
            raise GoalLostError(goal_id, f"{self.member} does not hold it")
        if not self.alive():
            raise GoalLostError(goal_id, f"the membership of {self.member} ran out")
        if await self.store.stream_version(claim_stream(goal_id)) != version:
            self.held.pop(goal_id, None)
            raise GoalLostError(goal_id, "claimed by another engine")

    async def _tail(self, stream: str) -> tuple[int, Claim | None]:
        """The claim stream's version and its last claim or release (fences in between change neither)."""
        version = 0
        try:
            async for batch in self.store.read_backwards(stream=stream):
                for env in batch:
                    version = max(version, env.version)
                    if env.type in ("engine.goal_claimed", "engine.goal_released"):
                        e = decode_payload(env)
                        assert isinstance(e, en.EngineGoalClaimed | en.EngineGoalReleased)
                        released = isinstance(e, en.EngineGoalReleased)
                        return version, Claim(e.member, released, e.reason, self.clock.now())
        except StreamNotFoundError:
            return 0, None
        return version, None
