"""One active engine per log: a lease kept in the log's coordination records (key ``engine/lease``).

Acquiring is a compare-and-set at the token the contender read, so of two contenders only one wins; a live
lease (held, not run out) is never taken. The holder renews at a third of the lease's length, which moves the
expiry and keeps the token. The token moves up by one at every acquisition and fences the holder's writes:
every event the engine appends carries it (:mod:`loopd_es.engine.fence`) and lands only while the record still
has it, checked in the append's own transaction, so a holder paused between its check and its write cannot
land that write after losing the lease. :meth:`Lease.check` (before each prompt, abort or notice) sees a
takeover at once, and the holder also stops by itself once its own lease has run out by its clock.

None of this is history: renewals write nothing to the log. Only a takeover from an engine that stopped
renewing is recorded, as ``engine.took_over`` on stream ``engine``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from ..clock import from_us, iso, to_us, whole_ms
from ..errors import LoopdError, StorageError
from ..events import engine as en
from ..events.catalogue import new_event
from ..log.coord import Claim, Fence

if TYPE_CHECKING:
    from ..clock import Clock
    from ..log.base import LogStore

KEY: Final = "engine/lease"
DEFAULT_TTL_MS: Final = 15_000


class LeaseLostError(LoopdError):
    """Raised when this process no longer holds the engine lease (taken over, or run out); it must stop."""


class Lease:
    """This process's view of the lease."""

    def __init__(self, store: LogStore, holder: str, clock: Clock, *, ttl_ms: int = DEFAULT_TTL_MS) -> None:
        self.store = store
        self.holder = holder
        self.clock = clock
        self.ttl = timedelta(milliseconds=ttl_ms)
        self.token: int | None = None
        self.expires_at: datetime | None = None

    async def current(self) -> Claim | None:
        """The lease record as the store has it now (None: no engine ever ran on this log)."""
        found = [c for c in await self.store.coord_read(KEY) if c.key == KEY]
        return found[0] if found else None

    async def try_acquire(self) -> Claim | None:
        """Take the lease if nobody holds it live; ``None`` on success, else the live holder's record."""
        current = await self.current()
        now = self.clock.now()
        if current is not None and current.live(to_us(now)) and current.holder != self.holder:
            return current
        token = (current.token if current is not None else 0) + 1
        expires = now + self.ttl
        record = Claim(key=KEY, holder=self.holder, token=token, expires_us=to_us(expires))
        found = await self.store.coord_swap(KEY, current.token if current is not None else 0, record)
        if found is not None:
            return found if found.live(to_us(now)) else await self.current()
        self.token, self.expires_at = token, expires
        if current is not None and current.holder and current.holder != self.holder:
            await self._record_takeover(current, now)
        return None

    async def _record_takeover(self, previous: Claim, now: datetime) -> None:
        """The one fact worth keeping: this engine took over from one that stopped renewing."""
        fact = en.EngineTookOver(
            holder=self.holder,
            previous_holder=previous.holder,
            previous_expired_at=whole_ms(from_us(previous.expires_us)),
            at=whole_ms(now),
        )
        assert self.token is not None
        await self.store.append(en.ENGINE_STREAM, [new_event(fact)], fences=[Fence(KEY, self.token)])

    def renew_due(self) -> datetime:
        """When to renew: a third of the way through the lease."""
        assert self.expires_at is not None
        return self.expires_at - self.ttl * 2 / 3

    async def renew(self) -> None:
        """Extend the lease (the token stays).

        :raises LeaseLostError: when another process took it or it ran out.
        :raises StorageError: when the store cannot be reached (the lease then runs out unless a retry lands).
        """
        self.check_clock()
        assert self.token is not None
        expires = self.clock.now() + self.ttl
        record = Claim(key=KEY, holder=self.holder, token=self.token, expires_us=to_us(expires))
        if await self.store.coord_swap(KEY, self.token, record) is not None:
            self.token = self.expires_at = None
            raise LeaseLostError(f"engine lease of {self.holder} was taken by another process")
        self.expires_at = expires

    def check_clock(self) -> None:
        """:raises LeaseLostError: unless this process holds a lease that has not run out by its own clock."""
        if self.token is None or self.expires_at is None:
            raise LeaseLostError(f"{self.holder} does not hold the engine lease")
        if self.clock.now() >= self.expires_at:
            raise LeaseLostError(f"engine lease of {self.holder} ran out at {iso(self.expires_at)}")

    async def check(self, goal_id: str | None = None) -> None:
        """The engine's guard (the lease covers every goal, so ``goal_id`` changes nothing).

        :raises LeaseLostError: unless this process still holds a lease that has not run out.

        Nobody may take the lease before it runs out, so while more than a third of it is left by this
        process's clock (as it is between on-time renewals) the clock alone answers; closer to the end, where
        a clock running behind another machine's would matter, the store is asked. Writes need neither: the
        fence in each append's transaction refuses a lost lease whatever this check believed.
        """
        self.check_clock()
        assert self.expires_at is not None
        if self.clock.now() < self.expires_at - self.ttl / 3:
            return
        current = await self.current()
        if current is None or current.token != self.token:
            self.token = self.expires_at = None
            raise LeaseLostError(f"engine lease of {self.holder} was taken by another process")

    async def release(self) -> None:
        """Give the lease up (a clean stop): a standby takes over at once and records no takeover."""
        if self.token is None:
            return
        record = Claim(key=KEY, holder="", token=self.token, expires_us=0, info=f"released by {self.holder}")
        try:
            await self.store.coord_swap(KEY, self.token, record)
        except StorageError:
            pass  # the lease runs out by itself
        self.token = None
        self.expires_at = None
