"""Many engines on one log (``loopd-es run --shared``): members, and goals partitioned by per-goal claims.

Each engine process is a *member* of the group: a coordination record ``engine/member/<member>`` beside the
log (:mod:`loopd_es.log.coord`, never an event) that it renews at a third of its length, like the exclusive
lease. Each goal is turned by the member holding its *claim*, record ``engine/claim/<goal_id>``. A claim needs
no renewal of its own: it lasts while its holder is a live member, so a group renews one record per member.

Who claims what: every member computes each goal's *preferred* member by rendezvous hashing over the live
members (the same answer everywhere once their views agree; only about 1/n of the goals move when a member
comes or goes). A goal is claimed by its preferred member when nobody holds it live (never claimed, released,
or its holder's membership ran out or ended), or by anyone once it has gone unclaimed for two lease lengths
(nobody is stranded behind a stuck preferred member). Whether the holder is live is judged on the records as
the store has them at the moment of the claim, never on a view that may lag. A claim is a compare-and-set at
the token the contender read, so of two contenders one wins. A live holder hands a goal over (``rebalance``) once its
preferred member has renewed its membership at least once, and gives up a terminal goal (``finished``) once its
notices are recorded; such a goal is claimed again only when it is active again.

Safety does not rest on clocks: each batch a member appends about a goal carries that goal's claim token as
a fence (:meth:`Shares.fence_for`, required by :mod:`loopd_es.engine.goal_fence`), so once someone else
claimed the goal, the old holder's writes fail as a whole. Clocks only decide when a member stops acting (its own membership ran out) and when others may take
over (the holder's expiry passed). A goal moving to another member is the one fact kept as history
(``engine.goal_moved`` on stream ``engine``).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

import anyio

from ..clock import from_us, to_us, whole_ms
from ..errors import LoopdError
from ..events import engine as en
from ..events.catalogue import new_event
from ..log.coord import Claim as Record
from ..log.coord import Fence

if TYPE_CHECKING:
    from ..clock import Clock
    from ..log.base import LogStore

MEMBER_PREFIX: Final = "engine/member/"
GONE_AFTER_TTLS: Final = 10
"""A member whose record ran out this many lease lengths ago is gone: its record is deleted (nobody fences on
membership records, and its claims are taken over by then)."""
CLAIM_PREFIX: Final = "engine/claim/"


def claim_key(goal_id: str) -> str:
    """The coordination key of one goal's claim."""
    return f"{CLAIM_PREFIX}{goal_id}"


def member_key(member: str) -> str:
    """The coordination key of one member's membership."""
    return f"{MEMBER_PREFIX}{member}"


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
    """This member's membership, its view of the group (read from the coordination records), and its goals."""

    def __init__(self, store: LogStore, holder: str, clock: Clock, *, ttl_ms: int) -> None:
        self.store = store
        self.holder = holder
        self.member = f"{holder}~{uuid.uuid4().hex[:8]}"
        """This run of the engine: a restarted process is a new member, so its old claims can be taken over."""
        self.clock = clock
        self.ttl = timedelta(milliseconds=ttl_ms)
        self.expires_at: datetime | None = None
        self.renewals = 0
        self.members: dict[str, Member] = {}
        self.claims: dict[str, Claim] = {}
        self._seen: dict[str, tuple[str, int]] = {}
        self.held: dict[str, int] = {}
        """goal id -> the claim token this member holds it under (its fence)."""
        self.lock = anyio.Lock()
        """Held around this process's claims and releases, which must not race each other."""

    # -- the view ------------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read the members and claims as the store has them now (before each balance pass)."""
        now = self.clock.now()
        members: dict[str, Member] = {}
        gone_before = to_us(now - GONE_AFTER_TTLS * self.ttl)
        for record in await self.store.coord_read(MEMBER_PREFIX):
            member = record.key[len(MEMBER_PREFIX) :]
            if record.expires_us < gone_before:  # a killed member's record, of no use to anyone any more
                await self.store.coord_swap(record.key, record.token, None)
                continue
            members[member] = Member(
                record.holder,
                from_us(record.expires_us) if record.expires_us else None,
                renewals=_renewals(record),
            )
        if self.expires_at is not None:  # this member as it knows itself (its record may lag a renewal)
            members[self.member] = Member(self.holder, self.expires_at, renewals=self.renewals)
        self.members = members
        for record in await self.store.coord_read(CLAIM_PREFIX):
            goal_id = record.key[len(CLAIM_PREFIX) :]
            seen = (record.holder, record.token)
            if self._seen.get(goal_id) != seen:
                self._seen[goal_id] = seen
                reason = record.info.split(" ", 1)[0]
                self.claims[goal_id] = Claim(record.holder or None, not record.holder, reason, now)
            if record.holder != self.member and goal_id in self.held:
                self.held.pop(goal_id, None)  # taken over while this member was not looking

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
        """Nobody holds the goal live by this member's view: never claimed, released, or its holder is gone."""
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

    def _record(self, expires: datetime) -> Record:
        return Record(
            key=member_key(self.member), holder=self.holder, token=1, expires_us=to_us(expires),
            info=str(self.renewals),
        )  # fmt: skip

    async def join(self) -> None:
        expires = self.clock.now() + self.ttl
        self.renewals = 0
        await self.store.coord_swap(member_key(self.member), 0, self._record(expires))
        self.expires_at = expires
        self.members[self.member] = Member(self.holder, expires)

    def renew_due(self) -> datetime:
        assert self.expires_at is not None
        return self.expires_at - self.ttl * 2 / 3

    async def renew(self) -> None:
        """Extend the membership; a member whose record was swept away (it stalled long past its expiry)
        joins again under the same name (its claims stay fenced: whoever took one over moved its token)."""
        expires = self.clock.now() + self.ttl
        self.renewals += 1
        if await self.store.coord_swap(member_key(self.member), 1, self._record(expires)) is not None:
            await self.store.coord_swap(member_key(self.member), 0, self._record(expires))
        self.expires_at = expires

    async def leave(self) -> None:
        """A clean stop: release every goal held, then leave (the others claim them at once)."""
        for goal_id in list(self.held):
            try:
                await self.release(goal_id, "stopping")
            except GoalLostError:
                pass
        await self.store.coord_swap(member_key(self.member), 1, None)
        self.expires_at = None

    async def sweep(self) -> int:
        """Delete the records of members gone for ten lease lengths (nobody fences on them); returns how many."""
        cutoff = to_us(self.clock.now() - 10 * self.ttl)
        gone = 0
        for record in await self.store.coord_read(MEMBER_PREFIX):
            if (
                record.expires_us < cutoff
                and await self.store.coord_swap(record.key, record.token, None) is None
            ):
                gone += 1
        return gone

    # -- claims --------------------------------------------------------------------------------------

    async def _claim_record(self, goal_id: str) -> Record | None:
        key = claim_key(goal_id)
        return next((r for r in await self.store.coord_read(key) if r.key == key), None)

    async def _holder_live(self, member: str, now: datetime) -> bool:
        """Whether ``member`` is live by its record as the store has it now (never a lagging view)."""
        key = member_key(member)
        record = next((r for r in await self.store.coord_read(key) if r.key == key), None)
        return record is not None and record.live(to_us(now))

    async def claim(self, goal_id: str, reason: str, *, history: bool = True) -> bool:
        """Claim the goal unless someone holds it live; ``True`` when this member now holds it.

        ``history``: record the move (``engine.goal_moved``) when the goal came from another member; ``False``
        for a goal that needs no more turns (a finished goal claimed only to deliver its notices)."""
        if not self.alive():
            return False  # a member whose own membership ran out claims nothing until it renewed
        async with self.lock:
            current = await self._claim_record(goal_id)
            now = self.clock.now()
            if current is not None and current.holder == self.member:
                self.held[goal_id] = current.token
                return True
            if current is not None and current.holder and await self._holder_live(current.holder, now):
                self.claims[goal_id] = Claim(current.holder, False, current.info, now)
                return False
            token = (current.token if current is not None else 0) + 1
            record = Record(
                key=claim_key(goal_id), holder=self.member, token=token, expires_us=0, info=reason
            )
            found = await self.store.coord_swap(
                claim_key(goal_id), current.token if current is not None else 0, record
            )
            if found is not None:
                return False
            self.held[goal_id] = token
            self._seen[goal_id] = (self.member, token)
            self.claims[goal_id] = Claim(self.member, False, reason, now)
            if current is not None and history:
                await self._record_move(goal_id, current, token, now)
            return True

    async def _record_move(self, goal_id: str, previous: Record, token: int, now: datetime) -> None:
        """Keep as history that the goal moved here from another member (a takeover or a hand-over)."""
        if previous.holder:
            before, why = previous.holder, "takeover"
        else:
            why, _, before = previous.info.partition(" ")
            if why == "rebalance":
                why = "handover"
            elif why != "stopping":
                return  # a finished goal claimed again, or a claim this member gave up itself
        if not before or before == self.member:
            return
        fact = en.EngineGoalMoved(
            goal_id=goal_id, member=self.member, previous_member=before, reason=why, at=whole_ms(now)
        )
        await self.store.append(
            en.ENGINE_STREAM, [new_event(fact)], fences=[Fence(claim_key(goal_id), token)]
        )

    async def release(self, goal_id: str, reason: str) -> None:
        """Give the goal up (a compare-and-set on this member's token: nothing taken over is released)."""
        async with self.lock:
            token = self.held.get(goal_id)
            if token is None:
                return
            record = Record(
                key=claim_key(goal_id), holder="", token=token, expires_us=0, info=f"{reason} {self.member}"
            )
            found = await self.store.coord_swap(claim_key(goal_id), token, record)
            self.held.pop(goal_id, None)
            if found is not None:
                raise GoalLostError(goal_id, "claimed by another engine meanwhile")
            self._seen[goal_id] = ("", token)
            self.claims[goal_id] = Claim(self.member, True, reason, self.clock.now())

    def fence_for(self, goal_id: str) -> list[Fence]:
        """The fence a write about ``goal_id`` carries: this member's claim of it, at the token it holds.

        :raises GoalLostError: unless this member holds the goal and its membership has not run out.
        """
        token = self.held.get(goal_id)
        if token is None:
            raise GoalLostError(goal_id, f"{self.member} does not hold it")
        if not self.alive():
            raise GoalLostError(goal_id, f"the membership of {self.member} ran out")
        return [Fence(claim_key(goal_id), token)]

    async def check(self, goal_id: str | None = None) -> None:
        """The guard before a side effect about ``goal_id`` (``None``: about no goal, e.g. a command's notice).

        :raises GoalLostError: unless this member still holds the goal and its membership has not run out.
        """
        if goal_id is None:
            if not self.alive():
                raise GoalLostError("-", f"the membership of {self.member} ran out")
            return
        (fence,) = self.fence_for(goal_id)
        token = fence.token
        current = await self._claim_record(goal_id)
        if current is None or current.token != token or current.holder != self.member:
            self.held.pop(goal_id, None)
            raise GoalLostError(goal_id, "claimed by another engine")


def _renewals(record: Record) -> int:
    try:
        return int(record.info)
    except ValueError:
        return 0
