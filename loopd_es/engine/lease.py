"""One active engine per log: a lease recorded as events on stream ``engine-lease``.

Acquiring appends ``engine.lease_acquired`` at the stream version the contender read, so of two contenders
only one append succeeds; a live lease (not released, ``expires_at`` not passed) is never taken. The holder
renews at a third of the lease's length. Its fencing token is the stream version of its acquisition; every
renewal or takeover moves the version. :meth:`Lease.check` (run before the engine acts, and before each prompt,
abort or notice) sees at once that another process took over, and the holder also stops by itself once its own
lease has run out; every event the engine appends lands atomically with an ``engine.fenced`` event at the
version this holder last wrote (:mod:`loopd_es.engine.fence`), so even a holder paused between its check and
its write cannot land that write after losing the lease.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

import anyio

from ..domain.provider_limit import iso
from ..errors import LoopdError, WrongExpectedVersionError
from ..events import engine as en
from ..events.catalogue import decode_payload, new_event
from .clock import parse_iso

if TYPE_CHECKING:
    from ..log.base import LogStore
    from .clock import Clock

STREAM: Final = "engine-lease"
DEFAULT_TTL_MS: Final = 15_000


class LeaseLostError(LoopdError):
    """Raised when this process no longer holds the engine lease (taken over, or run out); it must stop."""


class Holder:
    """Who holds the lease according to the log: ``None`` fields when nobody ever did."""

    def __init__(self, holder: str | None, token: int, expires_at: datetime | None, released: bool) -> None:
        self.holder = holder
        self.token = token
        self.expires_at = expires_at
        self.released = released

    def live(self, now: datetime) -> bool:
        return (
            self.holder is not None
            and not self.released
            and self.expires_at is not None
            and now < self.expires_at
        )


class Lease:
    """This process's view of the lease."""

    def __init__(self, store: LogStore, holder: str, clock: Clock, *, ttl_ms: int = DEFAULT_TTL_MS) -> None:
        self.store = store
        self.holder = holder
        self.clock = clock
        self.ttl = timedelta(milliseconds=ttl_ms)
        self.version = 0
        self.token: int | None = None
        self.expires_at: datetime | None = None
        self.lock = anyio.Lock()
        """Held around every write to the lease stream by this process (renewals, fences), which must not race."""

    async def current(self) -> tuple[int, Holder]:
        """The lease stream's version and who holds the lease by its last event."""
        version = await self.store.stream_version(STREAM)
        holder = Holder(None, 0, None, True)
        if version:
            async for env in self.store.read_stream(STREAM, from_version=version):
                e = decode_payload(env)
                if isinstance(e, en.EngineLeaseAcquired | en.EngineLeaseRenewed | en.EngineFenced):
                    holder = Holder(e.holder, e.token, parse_iso(e.expires_at), False)
                elif isinstance(e, en.EngineLeaseReleased):
                    holder = Holder(e.holder, e.token, None, True)
        return version, holder

    async def try_acquire(self) -> Holder | None:
        """Take the lease if nobody holds it live; ``None`` on success, else the live holder."""
        version, current = await self.current()
        now = self.clock.now()
        if current.live(now) and current.holder != self.holder:
            return current
        expires = now + self.ttl
        event = en.EngineLeaseAcquired(
            holder=self.holder,
            token=version + 1,
            expires_at=iso(expires),
            previous_holder=current.holder,
            at=iso(now),
        )
        try:
            await self.store.append(STREAM, [new_event(event)], version if version else "no_stream")
        except WrongExpectedVersionError:
            _, current = await self.current()
            return current
        self.version = self.token = version + 1
        self.expires_at = expires
        return None

    def renew_due(self) -> datetime:
        """When to renew: a third of the way through the lease."""
        assert self.expires_at is not None
        return self.expires_at - self.ttl * 2 / 3

    async def renew(self) -> None:
        """Extend the lease.

        :raises LeaseLostError: when another process took it or it ran out.
        """
        async with self.lock:
            await self.check()
            assert self.token is not None
            now = self.clock.now()
            expires = now + self.ttl
            event = en.EngineLeaseRenewed(holder=self.holder, token=self.token, expires_at=iso(expires))
            try:
                await self.store.append(STREAM, [new_event(event)], self.version)
            except WrongExpectedVersionError:
                raise LeaseLostError(f"engine lease of {self.holder} was taken by another process") from None
            self.version += 1
            self.expires_at = expires

    async def check(self) -> None:
        """:raises LeaseLostError: unless this process still holds a lease that has not run out."""
        if self.token is None or self.expires_at is None:
            raise LeaseLostError(f"{self.holder} does not hold the engine lease")
        if self.clock.now() >= self.expires_at:
            raise LeaseLostError(f"engine lease of {self.holder} ran out at {iso(self.expires_at)}")
        if await self.store.stream_version(STREAM) != self.version:
            raise LeaseLostError(f"engine lease of {self.holder} was taken by another process")

    async def release(self) -> None:
        """Give the lease up (a clean stop): a standby takes over at once."""
        if self.token is None:
            return
        try:
            await self.store.append(
                STREAM,
                [new_event(en.EngineLeaseReleased(holder=self.holder, token=self.token))],
                self.version,
            )
        except WrongExpectedVersionError:
            pass
        self.token = None
        self.expires_at = None
